// Paged causal attention with grouped-query heads, for prefill chunks and decode alike: one block
// per (token, q head) attends over positions 0..pos of its sequence, reading K/V through the block
// table. Keys are processed in chunks with an online softmax (running max and sum), so any context
// length fits in a fixed amount of shared memory.
#include "common.cuh"

#define ATT_CHUNK 2048

//   qkv          : device, bf16 [n, (n_heads + 2 * n_kv) * d] (q already rotated)
//   k_cache      : device, bf16 [num_slots, n_kv, d] of this layer
//   v_cache      : device, bf16 [num_slots, n_kv, d] of this layer
//   pos          : device, u32  [n] position of each token (it attends to 0..=pos)
//   seq_of_token : device, u32  [n]
//   block_tables : device, u32  [num_seqs, max_blocks]
//   out          : device, bf16 [n, n_heads * d]
// Launch: grid (n, n_heads), block ATT_THREADS (a multiple of 32, >= d),
//         dynamic shared memory (d + ATT_CHUNK + blockDim) floats.
extern "C" __global__ void paged_attention_bf16(const bf16* __restrict__ qkv, const bf16* __restrict__ k_cache,
                                                const bf16* __restrict__ v_cache, const unsigned* __restrict__ pos,
                                                const unsigned* __restrict__ seq_of_token,
                                                const unsigned* __restrict__ block_tables, int max_blocks,
                                                bf16* __restrict__ out, int n_heads, int n_kv, int d,
                                                int block_size, float scale) {
    extern __shared__ float smem[];
    float* q = smem;
    float* s = smem + d;
    float* comb = s + ATT_CHUNK;
    const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    const int kvh = h / (n_heads / n_kv);
    const int cols = (n_heads + 2 * n_kv) * d;
    const unsigned* table = block_tables + (size_t)seq_of_token[t] * max_blocks;
    const int ctx = pos[t] + 1;
    for (int i = tid; i < d; i += blockDim.x) q[i] = bf2f(qkv[(size_t)t * cols + h * d + i]) * scale;
    const int groups = blockDim.x / d;
    const int dim = tid % d, grp = tid / d;
    float m = -CACHET_INF, l = 0.f, acc = 0.f;
    for (int c0 = 0; c0 < ctx; c0 += ATT_CHUNK) {
        const int cn = min(ATT_CHUNK, ctx - c0);
        __syncthreads();  // q is loaded; the previous chunk's s is consumed
        float lm = -CACHET_INF;
        for (int j = tid; j < cn; j += blockDim.x) {
            const int p = c0 + j;
            const size_t slot = (size_t)table[p / block_size] * block_size + p % block_size;
            const bf16* kr = k_cache + (slot * n_kv + kvh) * d;
            float dot = 0.f;
            for (int i = 0; i < d; ++i) dot += q[i] * bf2f(kr[i]);
            s[j] = dot;
            lm = fmaxf(lm, dot);
        }
        const float m_new = fmaxf(m, block_max(lm));
        float ls = 0.f;
        for (int j = tid; j < cn; j += blockDim.x) {
            const float e = __expf(s[j] - m_new);
            s[j] = e;
            ls += e;
        }
        const float alpha = __expf(m - m_new);
        l = l * alpha + block_sum(ls);  // block_sum's barrier publishes s
        acc *= alpha;
        m = m_new;
        if (grp < groups) {
            for (int j = grp; j < cn; j += groups) {
                const int p = c0 + j;
                const size_t slot = (size_t)table[p / block_size] * block_size + p % block_size;
                acc += s[j] * bf2f(v_cache[(slot * n_kv + kvh) * d + dim]);
            }
        }
    }
    comb[tid] = (grp < groups) ? acc : 0.f;
    __syncthreads();
    if (tid < d) {
        float o = 0.f;
        for (int g = 0; g < groups; ++g) o += comb[g * d + tid];
        out[(size_t)t * n_heads * d + h * d + tid] = f2bf(o / l);
    }
}
