// Shared helpers for Cachet's kernels. Compiled by NVRTC with no host or CUDA headers: bf16 is
// carried as its raw 16 bits (`bf16`), converted with the two functions below.
#pragma once

typedef unsigned short bf16;

#define CACHET_INF __int_as_float(0x7f800000)

// Programmatic dependent launch (Hopper and later). In decode graphs a kernel may be started
// while the one before it still runs (backend/src/device/cuda/graphs.rs turns kernel-to-kernel
// edges into programmatic ones): its blocks are resident and wait here, so the launch and
// ramp-up of each kernel overlap the tail of the previous one. It returns once every kernel
// this one depends on has finished and its writes are visible, so it is the first statement
// of every kernel, before any read or write another kernel could race with (a unit test in
// kernels/src/lib.rs checks). Where nothing was launched programmatically (eager launches,
// older GPUs) it returns at once.
__device__ __forceinline__ void wait_for_prior_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ float bf2f(bf16 x) { return __uint_as_float(((unsigned)x) << 16); }

// Round to nearest even; NaN stays NaN.
__device__ __forceinline__ bf16 f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum / max over a block whose size is a multiple of 32; every thread gets the result.
// Starts with a barrier, so it may be called back to back and after writes to shared memory.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = (lane < (int)(blockDim.x >> 5)) ? partial[lane] : 0.f;
    return warp_sum(v);
}

// A sub-layer's output on its way into the residual stream. Where the model normalises its
// sub-layers' outputs (Gemma's post-attention and post-feed-forward norms) the delta row is first
// rms-normalised and scaled by delta_w, rounded to bf16 as a separate norm's bf16 output would
// be; with no delta_w it is added as it is.

// 1 / rms (eps inside) of a bf16 delta row of `cols`, block-wide; 1 with no delta_w.
__device__ __forceinline__ float delta_inv_rms(const bf16* __restrict__ dr, const bf16* __restrict__ dw, int cols,
                                               float eps) {
    if (!dw) return 1.f;
    float ss = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float d = bf2f(dr[i]);
        ss += d * d;
    }
    return rsqrtf(block_sum(ss) / cols + eps);
}

// residual[i] + delta'[i] (or residual[i] with no delta row); inv_d from delta_inv_rms.
__device__ __forceinline__ float residual_at(const float* __restrict__ rr, const bf16* __restrict__ dr,
                                             const bf16* __restrict__ dw, float inv_d, int i) {
    if (!dr) return rr[i];
    const float d = bf2f(dr[i]);
    return rr[i] + (dw ? bf2f(f2bf(bf2f(dw[i]) * (d * inv_d))) : d);
}

// The same for a row that fits PT elements per thread, every load issued up front (one round
// trip to memory, which is what a decode step's few-row launch waits on): v[c] = the new residual
// value at i = threadIdx.x + c * blockDim.x (0 past the row), wv[c] = norm_w[i]. Returns
// 1 / rms (eps inside) of the new row.
// With dws, the delta row is an FP8 product of the codes whose scales are still to apply (the
// next norm applies them, not a launch of their own): its element i is bf16(dr[i] · dws[i] · dxs)
// — fp8_scale_bf16_bf16's arithmetic (gemv.cu), so the residual gets the same bits.
template <int PT>
__device__ __forceinline__ float residual_row_regs(const float* __restrict__ rr, const bf16* __restrict__ dr,
                                                   const bf16* __restrict__ dw, const bf16* __restrict__ norm_w,
                                                   int cols, float eps, float (&v)[PT], float (&wv)[PT],
                                                   const float* __restrict__ dws = nullptr, float dxs = 1.f) {
    float d[PT], dwv[PT];
    float sd = 0.f;
#pragma unroll
    for (int c = 0; c < PT; ++c) {
        const int i = threadIdx.x + c * blockDim.x;
        const bool in = i < cols;
        v[c] = in ? rr[i] : 0.f;
        d[c] = in && dr ? bf2f(dr[i]) : 0.f;
        if (dws && in && dr) d[c] = bf2f(f2bf(d[c] * dws[i] * dxs));
        dwv[c] = in && dw ? bf2f(dw[i]) : 0.f;
        wv[c] = in ? bf2f(norm_w[i]) : 0.f;
        sd += d[c] * d[c];
    }
    if (dw) {
        const float inv_d = rsqrtf(block_sum(sd) / cols + eps);
#pragma unroll
        for (int c = 0; c < PT; ++c) d[c] = bf2f(f2bf(dwv[c] * (d[c] * inv_d)));
    }
    float ss = 0.f;
#pragma unroll
    for (int c = 0; c < PT; ++c) {
        if (dr) v[c] += d[c];
        ss += v[c] * v[c];
    }
    return rsqrtf(block_sum(ss) / cols + eps);
}

// The gated activations of the MLPs (elementwise.cu, gemv.cu).
__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }
// torch's gelu(approximate="tanh").
__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}

__device__ __forceinline__ float block_max(float v) {
    __shared__ float partial_max[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) partial_max[warp] = v;
    __syncthreads();
    v = (lane < (int)(blockDim.x >> 5)) ? partial_max[lane] : -CACHET_INF;
    return warp_max(v);
}

// FP8 e4m3fn (largest finite 448, no infinities) for the KV cache, in integer arithmetic so it
// compiles for any architecture and matches backend/src/device/fp8.rs.
typedef unsigned char fp8;

// The INT8 KV cache (backend/src/device/kv_int8.rs). A layer's table: [2 (K, V)][n_kv][d] scales
// (0 at an outlier channel), then [2][n_kv][KV_I8_OUTLIERS] outlier channels (as floats). A
// token-head: d codes (i8; an outlier's slot holds its bf16's high byte) and an aux word whose
// byte i is outlier i's low byte.
#define KV_I8_OUTLIERS 4

// Value x of channel c of a token-head into its INT8 slot (`scales`, `outl`: the head's part
// of the table): round(x / scale) saturated to ±127, or the bf16 split between the code and
// aux byte i for outlier i.
__device__ __forceinline__ void i8_store(unsigned char* codes, unsigned char* aux, int c, float x,
                                         const float* __restrict__ scales, const float* __restrict__ outl) {
#pragma unroll
    for (int i = 0; i < KV_I8_OUTLIERS; ++i)
        if ((int)outl[i] == c) {
            const bf16 b = f2bf(x);
            codes[c] = (unsigned char)(b >> 8);
            aux[i] = (unsigned char)(b & 0xffu);
            return;
        }
    const float s = scales[c];
    const float q = s > 0.f ? fminf(fmaxf(rintf(__fdiv_rn(x, s)), -127.f), 127.f) : 0.f;
    codes[c] = (unsigned char)(signed char)(int)q;
}

// The bf16 value of outlier i from its high byte (the code at its channel) and the aux word.
__device__ __forceinline__ float i8_outlier(unsigned hi, unsigned aux, int i) {
    return __uint_as_float((hi << 24) | (((aux >> (8 * i)) & 0xffu) << 16));
}
#define E4M3_MAX 448.f

// f32 → e4m3fn: round to nearest even, saturate at ±448, NaN → 0x7f.
__device__ __forceinline__ fp8 f2e4m3(float x) {
    const unsigned sign = (__float_as_uint(x) >> 24) & 0x80u;
    const float a = fabsf(x);
    unsigned q;
    if (a != a) {
        q = 0x7fu;
    } else if (a >= E4M3_MAX) {
        q = 0x7eu;
    } else if (a < 0.015625f) {
        q = (unsigned)__float2int_rn(a * 512.f);  // subnormals: multiples of 2^-9
    } else {
        const unsigned b = __float_as_uint(a), rem = b & 0xfffffu;
        q = (((b >> 23) - 120u) << 3) | ((b >> 20) & 7u);
        q += (rem > 0x80000u || (rem == 0x80000u && (q & 1u))) ? 1u : 0u;
        q = min(q, 0x7eu);
    }
    return (fp8)(sign | q);
}

// e4m3fn → f32 (no denormal f32 arithmetic: safe under --use_fast_math's flush-to-zero).
__device__ __forceinline__ float e4m3f(unsigned c) {
    const unsigned em = c & 0x7fu;
    const float f = (em >= 8u) ? __uint_as_float((em << 20) + (120u << 23)) : (float)em * 0.001953125f;
    return __uint_as_float(__float_as_uint(f) | ((c & 0x80u) << 24));
}

// Four e4m3fn codes (the bytes of v, lowest first) → f32: sm_89+ converts two at a time in
// hardware (exact: every e4m3 value is an f16 value), older architectures decode each with
// e4m3f. The NaN codes (never written) decode as NaN here and as ±480 through e4m3f.
__device__ __forceinline__ void e4m3x4_f32(unsigned v, float (&f)[4]) {
#if __CUDA_ARCH__ >= 890
    asm("{\n"
        ".reg .b16 lo, hi, h0, h1, h2, h3;\n"
        ".reg .b32 p0, p1;\n"
        "mov.b32 {lo, hi}, %4;\n"
        "cvt.rn.f16x2.e4m3x2 p0, lo;\n"
        "cvt.rn.f16x2.e4m3x2 p1, hi;\n"
        "mov.b32 {h0, h1}, p0;\n"
        "mov.b32 {h2, h3}, p1;\n"
        "cvt.f32.f16 %0, h0;\n"
        "cvt.f32.f16 %1, h1;\n"
        "cvt.f32.f16 %2, h2;\n"
        "cvt.f32.f16 %3, h3;\n"
        "}"
        : "=f"(f[0]), "=f"(f[1]), "=f"(f[2]), "=f"(f[3])
        : "r"(v));
#else
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = e4m3f((v >> (8 * i)) & 0xffu);
#endif
}

// RoPE of one pair (x1, x2) = (v[i], v[i + d/2]) by cos c and sin s, every product and sum rounded
// on its own (no FMA contraction): the same bits wherever a rotation happens (rope_kv.cu, the
// fused decode path of attention_mma.cu) and the CPU reference's f32 arithmetic.
__device__ __forceinline__ void rope_rotate(float x1, float x2, float c, float s, float* r1, float* r2) {
    *r1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    *r2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// The argument list of every paged attention kernel (attention.cu, attention_mma.cu); KV is the
// cache's element type. `rope`, `slots`, `fused` and the q/k head norms (`q_norm`, `k_norm`, null
// for models without them, and `norm_eps`) serve the tensor-core kernel's fused decode path (see
// attention_mma.cu); the others ignore them.
#define PAGED_ATTENTION_ARGS(KV)                                                                              \
    const bf16 *__restrict__ qkv, KV *__restrict__ k_cache, KV *__restrict__ v_cache,                         \
        float *__restrict__ k_scale, float *__restrict__ v_scale, const unsigned *__restrict__ pos,             \
        const unsigned *__restrict__ tile_seq, const unsigned *__restrict__ tile_start,                       \
        const unsigned *__restrict__ tile_len, const unsigned *__restrict__ block_tables, int max_blocks,     \
        bf16 *__restrict__ out, float *__restrict__ part_o, float *__restrict__ part_ml, int n_heads, int n_kv, \
        int d, int block_size, float scale, int split_len, int group, int sub_tokens, int units_per_tile,     \
        const float *__restrict__ rope, const unsigned *__restrict__ slots, int fused, int window,             \
        const bf16 *__restrict__ q_norm, const bf16 *__restrict__ k_norm, float norm_eps,                      \
        const float *__restrict__ kv_table
