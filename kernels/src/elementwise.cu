// Embedding lookup, the gated activations (SwiGLU, GeGLU), row gathers, biases, dummy weights.
#include "common.cuh"

// out[t, :] = table[ids[t] - first, :] * scale  (into the f32 residual stream; scale is 1, or
// Gemma's √hidden) where the table holds that id — the vocabulary's rows [first, first + rows):
// all of them, or a tensor-parallel rank's part — else zeros (the ranks' rows are then summed).
//   ids   : device, u32  [n]
//   table : device, bf16 [rows, cols]
//   out   : device, f32  [n, cols]
extern "C" __global__ void embed_bf16(const unsigned* __restrict__ ids, const bf16* __restrict__ table,
                                      float* __restrict__ out, int cols, float scale, unsigned first,
                                      unsigned rows) {
    wait_for_prior_kernels();
    const size_t t = blockIdx.x;
    const unsigned r = ids[t] - first;  // wraps past `rows` below `first`
    if (r >= rows) {
        for (int i = threadIdx.x; i < cols; i += blockDim.x) out[t * cols + i] = 0.f;
        return;
    }
    const bf16* row = table + (size_t)r * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) out[t * cols + i] = bf2f(row[i]) * scale;
}

// out[t, j] = act(gu[t, j]) * gu[t, inter + j], over a flat grid of n * inter elements (a decode
// step has one row: one block per row would leave the GPU idle).
template <float (*Act)(float)>
__device__ __forceinline__ void act_mul(const bf16* __restrict__ gu, bf16* __restrict__ out, int inter,
                                        unsigned long long total) {
    for (unsigned long long e = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; e < total;
         e += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long t = e / inter, j = e % inter;
        const bf16* g = gu + t * 2 * inter;
        out[e] = f2bf(Act(bf2f(g[j])) * bf2f(g[inter + j]));
    }
}

// SwiGLU: silu(gate) * up.
//   gu  : device, bf16 [n, 2 * inter] (gate columns, then up columns)
//   out : device, bf16 [n, inter]
extern "C" __global__ void silu_mul_bf16(const bf16* __restrict__ gu, bf16* __restrict__ out, int inter,
                                         unsigned long long total) {
    wait_for_prior_kernels();
    act_mul<silu>(gu, out, inter, total);
}

// GeGLU (Gemma): gelu_tanh(gate) * up; the same layout.
extern "C" __global__ void gelu_tanh_mul_bf16(const bf16* __restrict__ gu, bf16* __restrict__ out, int inter,
                                              unsigned long long total) {
    wait_for_prior_kernels();
    act_mul<gelu_tanh>(gu, out, inter, total);
}

// The same, 8 elements per thread with 16-byte loads and stores, for inter % 8 == 0 and
// n * inter / 8 < 2^32 (32-bit index math: the flat 64-bit division above costs more than the
// memory traffic at prefill sizes).
//   total8 : n * inter / 8
template <float (*Act)(float)>
__device__ __forceinline__ void act_mul_x8(const bf16* __restrict__ gu, bf16* __restrict__ out, int inter,
                                           unsigned total8) {
    const unsigned inter8 = inter / 8;
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < total8; e += gridDim.x * blockDim.x) {
        const unsigned t = e / inter8, j = e % inter8;
        const uint4 gv = reinterpret_cast<const uint4*>(gu)[(size_t)t * 2 * inter8 + j];
        const uint4 uv = reinterpret_cast<const uint4*>(gu)[(size_t)t * 2 * inter8 + inter8 + j];
        const unsigned gw[4] = {gv.x, gv.y, gv.z, gv.w}, uw[4] = {uv.x, uv.y, uv.z, uv.w};
        unsigned ow[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float g0 = bf2f((bf16)(gw[k] & 0xffffu)), g1 = bf2f((bf16)(gw[k] >> 16));
            const float u0 = bf2f((bf16)(uw[k] & 0xffffu)), u1 = bf2f((bf16)(uw[k] >> 16));
            const float o0 = Act(g0) * u0, o1 = Act(g1) * u1;
            ow[k] = (unsigned)f2bf(o0) | ((unsigned)f2bf(o1) << 16);
        }
        reinterpret_cast<uint4*>(out)[e] = make_uint4(ow[0], ow[1], ow[2], ow[3]);
    }
}

extern "C" __global__ void silu_mul_bf16x8(const bf16* __restrict__ gu, bf16* __restrict__ out, int inter,
                                           unsigned total8) {
    wait_for_prior_kernels();
    act_mul_x8<silu>(gu, out, inter, total8);
}

extern "C" __global__ void gelu_tanh_mul_bf16x8(const bf16* __restrict__ gu, bf16* __restrict__ out, int inter,
                                                unsigned total8) {
    wait_for_prior_kernels();
    act_mul_x8<gelu_tanh>(gu, out, inter, total8);
}

// out[i, :] = x[rows[i], :]: 16-byte copies where a row is whole 16-byte chunks (cols % 8 == 0;
// the buffers are whole allocations, so 16-byte aligned), else an element a thread.
//   rows : device, u32  [m]
//   x    : device, bf16 [n, cols]
//   out  : device, bf16 [m, cols]
extern "C" __global__ void gather_rows_bf16(const unsigned* __restrict__ rows, const bf16* __restrict__ x,
                                            bf16* __restrict__ out, int cols) {
    wait_for_prior_kernels();
    const size_t i = blockIdx.x;
    const bf16* src = x + (size_t)rows[i] * cols;
    if ((cols & 7) == 0) {
        const uint4* s = reinterpret_cast<const uint4*>(src);
        uint4* d = reinterpret_cast<uint4*>(out + i * cols);
        for (int j = threadIdx.x; j < cols / 8; j += blockDim.x) d[j] = s[j];
    } else {
        for (int j = threadIdx.x; j < cols; j += blockDim.x) out[i * cols + j] = src[j];
    }
}

// out[i] = mean + std * N(0, 1), from a counter-based hash of (seed, e): the same seed gives the
// same tensor on any launch shape. For `--load-format dummy` weights. `e` is the element's index
// in the whole tensor: out holds rows of `cols` elements taken from a tensor `full_cols` wide,
// starting at element `offset` (a tensor-parallel rank's block of rows and columns; the whole
// tensor is cols = full_cols, offset 0), so a rank draws exactly its slice of the whole.
//   out : device, bf16 [n] = [n / cols, cols]
extern "C" __global__ void fill_normal_bf16(bf16* __restrict__ out, unsigned long long n, unsigned long long seed,
                                            float mean, float std, unsigned long long cols,
                                            unsigned long long full_cols, unsigned long long offset) {
    wait_for_prior_kernels();
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long e = offset + (i / cols) * full_cols + i % cols;
        unsigned long long z = seed + (e + 1) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const float u1 = ((z >> 40) + 1) * (1.0f / 16777217.0f);
        const float u2 = ((z & 0xffffffull)) * (1.0f / 16777216.0f);
        const float r = sqrtf(-2.f * __logf(u1)) * __cosf(6.2831853f * u2);
        out[i] = f2bf(mean + std * r);
    }
}


// x[t, j] += bias[j] over a flat grid of n * cols elements (the q|k|v biases of Qwen2).
//   x    : device, bf16 [n, cols], updated in place
//   bias : device, bf16 [cols]
extern "C" __global__ void add_bias_bf16(bf16* __restrict__ x, const bf16* __restrict__ bias, int cols,
                                         unsigned long long total) {
    wait_for_prior_kernels();
    for (unsigned long long e = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; e < total;
         e += (unsigned long long)gridDim.x * blockDim.x)
        x[e] = f2bf(bf2f(x[e]) + bf2f(bias[e % cols]));
}
