// RoPE on the q and k heads of the fused qkv activations, then the K/V write into the paged cache
// at each token's slot. One block per token.
#include "common.cuh"

//   qkv      : device, bf16 [n, (n_heads + 2 * n_kv) * d], rotated in place (q and k heads)
//   rope     : device, f32  [max_pos, d]: cos of the d/2 frequencies, then their sin
//   pos      : device, u32  [n] absolute positions
//   slots    : device, u32  [n] cache slot of each token (block * block_size + offset); 0xFFFFFFFF
//              marks a padding row (CUDA-graph decode batches), whose K/V are not written
//   k_cache  : device, bf16 [num_slots, n_kv, d] of this layer
//   v_cache  : device, bf16 [num_slots, n_kv, d] of this layer
extern "C" __global__ void rope_kv_bf16(bf16* __restrict__ qkv, const float* __restrict__ rope,
                                        const unsigned* __restrict__ pos, const unsigned* __restrict__ slots,
                                        bf16* __restrict__ k_cache, bf16* __restrict__ v_cache, int n_heads,
                                        int n_kv, int d) {
    const size_t t = blockIdx.x;
    const int half = d / 2;
    const int cols = (n_heads + 2 * n_kv) * d;
    bf16* row = qkv + t * cols;
    const float* cs = rope + (size_t)pos[t] * d;
    for (int i = threadIdx.x; i < (n_heads + n_kv) * half; i += blockDim.x) {
        const int h = i / half, j = i % half;
        bf16* v = row + h * d;
        const float x1 = bf2f(v[j]), x2 = bf2f(v[j + half]);
        const float c = cs[j], s = cs[half + j];
        v[j] = f2bf(x1 * c - x2 * s);
        v[j + half] = f2bf(x2 * c + x1 * s);
    }
    __syncthreads();
    if (slots[t] == 0xFFFFFFFFu) return;
    const size_t base = (size_t)slots[t] * n_kv * d;
    const int kv_dim = n_kv * d;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        k_cache[base + i] = row[n_heads * d + i];
        v_cache[base + i] = row[n_heads * d + kv_dim + i];
    }
}
