// RoPE on the q and k heads of the fused qkv activations, then the K/V write into the paged cache
// at each token's slot. One block per (token, q or k head), one thread per rotated pair: every
// thread's loads are independent, so a decode step (a few tokens) costs one memory round trip.
#include "common.cuh"

//   qkv      : device, bf16 [n, (n_heads + 2 * n_kv) * d], rotated in place (q and k heads)
//   rope     : device, f32  [max_pos, d]: cos of the d/2 frequencies, then their sin
//   pos      : device, u32  [n] absolute positions
//   slots    : device, u32  [n] cache slot of each token (block * block_size + offset); 0xFFFFFFFF
//              marks a padding row (CUDA-graph decode batches), whose K/V are not written
//   k_cache  : device, bf16 [num_slots, n_kv, d] of this layer
//   v_cache  : device, bf16 [num_slots, n_kv, d] of this layer
// Launch: grid (n, n_heads + n_kv), block d / 2.
extern "C" __global__ void rope_kv_bf16(bf16* __restrict__ qkv, const float* __restrict__ rope,
                                        const unsigned* __restrict__ pos, const unsigned* __restrict__ slots,
                                        bf16* __restrict__ k_cache, bf16* __restrict__ v_cache, int n_heads,
                                        int n_kv, int d) {
    const size_t t = blockIdx.x;
    const int h = blockIdx.y, half = d / 2, j = threadIdx.x;
    bf16* row = qkv + t * (size_t)((n_heads + 2 * n_kv) * d);
    bf16* v = row + h * d;
    const float* cs = rope + (size_t)pos[t] * d;
    const float x1 = bf2f(v[j]), x2 = bf2f(v[j + half]);
    const float c = cs[j], s = cs[half + j];
    const bf16 y1 = f2bf(x1 * c - x2 * s), y2 = f2bf(x2 * c + x1 * s);
    v[j] = y1;
    v[j + half] = y2;
    const unsigned slot = slots[t];
    if (h < n_heads || slot == 0xFFFFFFFFu) return;
    // A k head: its rotated values and its v head go to the cache.
    const int kh = h - n_heads;
    const size_t base = ((size_t)slot * n_kv + kh) * d;
    const bf16* vr = row + (n_heads + n_kv + kh) * d;
    k_cache[base + j] = y1;
    k_cache[base + j + half] = y2;
    v_cache[base + j] = vr[j];
    v_cache[base + j + half] = vr[j + half];
}
