// RMSNorm, and the fused residual-add + RMSNorm of each decoder sub-layer. One block per row.
// The residual stream is kept in f32; normalised activations are bf16.
#include "common.cuh"

// out[r, :] = rms_norm(x[r, :]) * w
//   x   : device, f32  [rows, cols]
//   w   : device, bf16 [cols]
//   out : device, bf16 [rows, cols]
extern "C" __global__ void rms_norm_bf16(const float* __restrict__ x, const bf16* __restrict__ w,
                                         bf16* __restrict__ out, int cols, float eps) {
    const size_t row = blockIdx.x;
    const float* xr = x + row * cols;
    float ss = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(ss) / cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        out[row * cols + i] = f2bf(bf2f(w[i]) * (xr[i] * inv));
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
