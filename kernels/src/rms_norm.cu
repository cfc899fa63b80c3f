// RMSNorm, and the fused residual-add + RMSNorm of each decoder sub-layer. One block per row.
// The residual stream is kept in f32; normalised activations are bf16.
//
// A decode step normalises a handful of rows, so each launch is a few blocks and its time is
// memory latency, not bandwidth: when a row fits RMS_PER_THREAD elements per thread, every load
// of the row is issued up front into registers (one round trip to memory, not one per loop
// iteration), the sum reduced, and the outputs written from the registers. Launch with
// blockDim.x a multiple of 32, ideally ceil(cols / RMS_PER_THREAD) rounded up; longer rows take
// the looping path.
#include "common.cuh"

#define RMS_PER_THREAD 8

__device__ __forceinline__ float as_f32(float v) { return v; }
__device__ __forceinline__ float as_f32(bf16 v) { return bf2f(v); }

// out[row, :] = rms_norm(x[row, :]) * w for an f32 or bf16 row: when the row fits RMS_PER_THREAD
// elements per thread, every load is issued up front (one round trip), else a strided loop.
template <typename X>
__device__ __forceinline__ void norm_row(const X* __restrict__ x, const bf16* __restrict__ w,
                                         bf16* __restrict__ out, int cols, float eps) {
    const size_t row = blockIdx.x;
    const X* xr = x + row * cols;
    if (cols <= RMS_PER_THREAD * (int)blockDim.x) {
        float v[RMS_PER_THREAD], wv[RMS_PER_THREAD];
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < RMS_PER_THREAD; ++k) {
            const int i = threadIdx.x + k * blockDim.x;
            v[k] = i < cols ? as_f32(xr[i]) : 0.f;
            wv[k] = i < cols ? bf2f(w[i]) : 0.f;
            ss += v[k] * v[k];
        }
        const float inv = rsqrtf(block_sum(ss) / cols + eps);
#pragma unroll
        for (int k = 0; k < RMS_PER_THREAD; ++k) {
            const int i = threadIdx.x + k * blockDim.x;
            if (i < cols) out[row * cols + i] = f2bf(wv[k] * (v[k] * inv));
        }
        return;
    }
    float ss = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = as_f32(xr[i]);
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss) / cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        out[row * cols + i] = f2bf(bf2f(w[i]) * (as_f32(xr[i]) * inv));
}

// out[r, :] = rms_norm(x[r, :]) * w
//   x   : device, f32  [rows, cols]
//   w   : device, bf16 [cols]
//   out : device, bf16 [rows, cols]
extern "C" __global__ void rms_norm_bf16(const float* __restrict__ x, const bf16* __restrict__ w,
                                         bf16* __restrict__ out, int cols, float eps) {
    norm_row(x, w, out, cols, eps);
}

// residual[r, :] += delta[r, :]; out[r, :] = rms_norm(residual[r, :]) * w
//   residual : device, f32  [rows, cols], updated in place
//   delta    : device, bf16 [rows, cols]
//   w        : device, bf16 [cols]
//   out      : device, bf16 [rows, cols]
extern "C" __global__ void add_rms_norm_bf16(float* __restrict__ residual, const bf16* __restrict__ delta,
                                             const bf16* __restrict__ w, bf16* __restrict__ out, int cols,
                                             float eps) {
    const size_t row = blockIdx.x;
    float* rr = residual + row * cols;
    const bf16* dr = delta + row * cols;
    if (cols <= RMS_PER_THREAD * (int)blockDim.x) {
        float v[RMS_PER_THREAD], wv[RMS_PER_THREAD];
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < RMS_PER_THREAD; ++k) {
            const int i = threadIdx.x + k * blockDim.x;
            v[k] = i < cols ? rr[i] + bf2f(dr[i]) : 0.f;
            wv[k] = i < cols ? bf2f(w[i]) : 0.f;
            ss += v[k] * v[k];
        }
        const float inv = rsqrtf(block_sum(ss) / cols + eps);
#pragma unroll
        for (int k = 0; k < RMS_PER_THREAD; ++k) {
            const int i = threadIdx.x + k * blockDim.x;
            if (i < cols) {
                rr[i] = v[k];
                out[row * cols + i] = f2bf(wv[k] * (v[k] * inv));
            }
        }
        return;
    }
    float ss = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = rr[i] + bf2f(delta[row * cols + i]);
        rr[i] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss) / cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        out[row * cols + i] = f2bf(bf2f(w[i]) * (rr[i] * inv));
}

// out[r, :] = rms_norm(x[r, :]) * w of a sub-layer's bf16 output (Gemma's post-attention and
// post-feed-forward norms). One block per row; launch as rms_norm_bf16.
//   x   : device, bf16 [rows, cols]
//   w   : device, bf16 [cols]
//   out : device, bf16 [rows, cols]
extern "C" __global__ void output_norm_bf16(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                            bf16* __restrict__ out, int cols, float eps) {
    norm_row(x, w, out, cols, eps);
}

// RMSNorm of each q head and each k head of a fused q|k|v tensor, in place (Qwen3's q/k norm,
// before RoPE): head j < num_heads uses q_w, the next num_kv_heads heads k_w; v is untouched.
// One warp per (token, head): grid (n, num_heads + num_kv_heads), block 32; head_dim ≤ 256.
//   qkv : device, bf16 [n, (num_heads + 2 * num_kv_heads) * head_dim], updated in place
//   q_w : device, bf16 [head_dim]
//   k_w : device, bf16 [head_dim]
#define HEAD_NORM_MAX_PER_LANE 8
extern "C" __global__ void head_norm_bf16(bf16* __restrict__ qkv, const bf16* __restrict__ q_w,
                                          const bf16* __restrict__ k_w, int num_heads, int num_kv_heads,
                                          int head_dim, float eps) {
    const size_t t = blockIdx.x;
    const int h = blockIdx.y;
    const size_t cols = (size_t)(num_heads + 2 * num_kv_heads) * head_dim;
    bf16* x = qkv + t * cols + (size_t)h * head_dim;
    const bf16* w = h < num_heads ? q_w : k_w;
    float v[HEAD_NORM_MAX_PER_LANE];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < HEAD_NORM_MAX_PER_LANE; ++k) {
        const int i = threadIdx.x + 32 * k;
        v[k] = i < head_dim ? bf2f(x[i]) : 0.f;
        ss += v[k] * v[k];
    }
    const float inv = rsqrtf(warp_sum(ss) / head_dim + eps);
#pragma unroll
    for (int k = 0; k < HEAD_NORM_MAX_PER_LANE; ++k) {
        const int i = threadIdx.x + 32 * k;
        if (i < head_dim) x[i] = f2bf(bf2f(w[i]) * (v[k] * inv));
    }
}
