// RoPE on the q and k heads of the fused qkv activations (after their RMSNorm, for models with
// one), then the K/V write into the paged cache at each token's slot. One block per (token, q or
// k head), one thread per rotated pair: every thread's loads are independent, so a decode step
// (a few tokens) costs one memory round trip.
#include "common.cuh"

// The block's largest |a| and |b| over its threads (non-negative floats order as their bits).
__device__ __forceinline__ void block_amax2(float a, float b, float* ma, float* mb) {
    __shared__ unsigned am[2];
    if (threadIdx.x == 0) am[0] = am[1] = 0u;
    __syncthreads();
    atomicMax(&am[0], __float_as_uint(a));
    atomicMax(&am[1], __float_as_uint(b));
    __syncthreads();
    *ma = __uint_as_float(am[0]);
    *mb = __uint_as_float(am[1]);
}

// The sum of v over the block (d / 2 threads, at most 128): the shuffle reduction where the warps
// are whole, else thread 0 adds the threads' values in order (tiny heads).
__device__ __forceinline__ float head_block_sum(float v) {
    if ((blockDim.x & 31) == 0) return block_sum(v);
    __shared__ float part[128];
    __shared__ float total;
    part[threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.f;
        for (int i = 0; i < (int)blockDim.x; ++i) s += part[i];
        total = s;
    }
    __syncthreads();
    return total;
}

// MODE: 0 bf16 cache, 1 FP8 (e4m3, a scale per token-head), 2 INT8 (kv_table's format).
template <int MODE>
__device__ __forceinline__ void rope_kv(bf16* __restrict__ qkv, const float* __restrict__ rope,
                                        const unsigned* __restrict__ pos, const unsigned* __restrict__ slots,
                                        void* __restrict__ k_cache, void* __restrict__ v_cache,
                                        float* __restrict__ k_scale, float* __restrict__ v_scale, int n_heads,
                                        int n_kv, int d, const bf16* __restrict__ q_norm,
                                        const bf16* __restrict__ k_norm, float norm_eps,
                                        const float* __restrict__ kv_table) {
    const size_t t = blockIdx.x;
    const int h = blockIdx.y, half = d / 2, j = threadIdx.x;
    bf16* row = qkv + t * (size_t)((n_heads + 2 * n_kv) * d);
    bf16* v = row + h * d;
    const float* cs = rope + (size_t)pos[t] * d;
    float x1 = bf2f(v[j]), x2 = bf2f(v[j + half]);
    const bf16* nw = h < n_heads ? q_norm : k_norm;
    if (nw) {  // block-uniform: both norms or neither
        // The head's RMSNorm first (Qwen3, Gemma 3), rounded to bf16 as a separate norm's output.
        const float inv = rsqrtf(head_block_sum(x1 * x1 + x2 * x2) / d + norm_eps);
        x1 = bf2f(f2bf(bf2f(nw[j]) * (x1 * inv)));
        x2 = bf2f(f2bf(bf2f(nw[j + half]) * (x2 * inv)));
    }
    const float c = cs[j], s = cs[half + j];
    float r1, r2;
    rope_rotate(x1, x2, c, s, &r1, &r2);
    const bf16 y1 = f2bf(r1), y2 = f2bf(r2);
    v[j] = y1;
    v[j + half] = y2;
    const unsigned slot = slots[t];
    if (h < n_heads || slot == 0xFFFFFFFFu) return;  // block-uniform
    // A k head: its rotated values and its v head go to the cache.
    const int kh = h - n_heads;
    const size_t head = (size_t)slot * n_kv + kh, base = head * d;
    const bf16* vr = row + (n_heads + n_kv + kh) * d;
    if constexpr (MODE == 2) {
        // Static per-channel scales; K from the rotation's f32 result, as FP8.
        const float* ks = kv_table + (size_t)kh * d;
        const float* vs = kv_table + (size_t)(n_kv + kh) * d;
        const float* ko = kv_table + (size_t)2 * n_kv * d + kh * KV_I8_OUTLIERS;
        const float* vo = ko + n_kv * KV_I8_OUTLIERS;
        unsigned char* kc = static_cast<unsigned char*>(k_cache) + base;
        unsigned char* vc = static_cast<unsigned char*>(v_cache) + base;
        unsigned char* ka = reinterpret_cast<unsigned char*>(k_scale + head);
        unsigned char* va = reinterpret_cast<unsigned char*>(v_scale + head);
        i8_store(kc, ka, j, r1, ks, ko);
        i8_store(kc, ka, j + half, r2, ks, ko);
        i8_store(vc, va, j, bf2f(vr[j]), vs, vo);
        i8_store(vc, va, j + half, bf2f(vr[j + half]), vs, vo);
    } else if constexpr (MODE == 1) {
        // One scale per token and head: the head's largest magnitude maps to E4M3_MAX. K is
        // quantized from the rotation's f32 result, not its bf16 rounding.
        const float v1 = bf2f(vr[j]), v2 = bf2f(vr[j + half]);
        float ka, va;
        block_amax2(fmaxf(fabsf(r1), fabsf(r2)), fmaxf(fabsf(v1), fabsf(v2)), &ka, &va);
        const float ki = ka > 0.f ? E4M3_MAX / ka : 0.f, vi = va > 0.f ? E4M3_MAX / va : 0.f;
        fp8* kc = static_cast<fp8*>(k_cache) + base;
        fp8* vc = static_cast<fp8*>(v_cache) + base;
        kc[j] = f2e4m3(r1 * ki);
        kc[j + half] = f2e4m3(r2 * ki);
        vc[j] = f2e4m3(v1 * vi);
        vc[j + half] = f2e4m3(v2 * vi);
        if (j == 0) {
            k_scale[head] = ka / E4M3_MAX;
            v_scale[head] = va / E4M3_MAX;
        }
    } else {
        bf16* kc = static_cast<bf16*>(k_cache) + base;
        bf16* vc = static_cast<bf16*>(v_cache) + base;
        kc[j] = y1;
        kc[j + half] = y2;
        vc[j] = vr[j];
        vc[j + half] = vr[j + half];
    }
}

//   qkv      : device, bf16 [n, (n_heads + 2 * n_kv) * d], rotated in place (q and k heads)
//   rope     : device, f32  [max_pos, d]: cos of the d/2 frequencies, then their sin
//   pos      : device, u32  [n] absolute positions
//   slots    : device, u32  [n] cache slot of each token (block * block_size + offset); 0xFFFFFFFF
//              marks a padding row (CUDA-graph decode batches), whose K/V are not written
//   k_cache  : device, bf16 [num_slots, n_kv, d] of this layer
//   v_cache  : device, bf16 [num_slots, n_kv, d] of this layer
//   k_scale, v_scale : unused (see rope_kv_fp8)
//   q_norm, k_norm   : device, bf16 [d]: the q and k heads' RMSNorm weights, applied before the
//              rotation (Qwen3, Gemma 3), or both null
//   kv_table : unused (see rope_kv_int8)
// Launch: grid (n, n_heads + n_kv), block d / 2 (d ≤ 256).
#define ROPE_KV_ARGS(KV)                                                                                   \
    bf16 *__restrict__ qkv, const float *__restrict__ rope, const unsigned *__restrict__ pos,              \
        const unsigned *__restrict__ slots, KV *__restrict__ k_cache, KV *__restrict__ v_cache,            \
        float *__restrict__ k_scale, float *__restrict__ v_scale, int n_heads, int n_kv, int d,           \
        const bf16 *__restrict__ q_norm, const bf16 *__restrict__ k_norm, float norm_eps,                  \
        const float *__restrict__ kv_table
#define ROPE_KV_CALL                                                                                       \
    qkv, rope, pos, slots, k_cache, v_cache, k_scale, v_scale, n_heads, n_kv, d, q_norm, k_norm, norm_eps, kv_table

extern "C" __global__ void rope_kv_bf16(ROPE_KV_ARGS(bf16)) { wait_for_prior_kernels(); rope_kv<0>(ROPE_KV_CALL); }

// As rope_kv_bf16 into an FP8 cache:
//   k_cache, v_cache : device, e4m3 [num_slots, n_kv, d] of this layer
//   k_scale, v_scale : device, f32  [num_slots, n_kv]: value = code * scale
extern "C" __global__ void rope_kv_fp8(ROPE_KV_ARGS(fp8)) { wait_for_prior_kernels(); rope_kv<1>(ROPE_KV_CALL); }

// As rope_kv_bf16 into an INT8 cache (common.cuh, backend/src/device/kv_int8.rs):
//   k_cache, v_cache : device, i8 [num_slots, n_kv, d] of this layer
//   k_scale, v_scale : device, u32 [num_slots, n_kv]: the outliers' low bytes
//   kv_table : device, f32, this layer's table (scales and outlier channels)
extern "C" __global__ void rope_kv_int8(ROPE_KV_ARGS(fp8)) { wait_for_prior_kernels(); rope_kv<2>(ROPE_KV_CALL); }
