// RMSNorm, and the fused residual-add + RMSNorm of each decoder sub-layer. One block per row.
#include "common.cuh"

// out[r, :] = rms_norm(x[r, :]) * w
//   x   : device, bf16 [rows, cols]
//   w   : device, bf16 [cols]
//   out : device, bf16 [rows, cols]
extern "C" __global__ void rms_norm_bf16(const __nv_bfloat16* __restrict__ x,
                                         const __nv_bfloat16* __restrict__ w,
                                         __nv_bfloat16* __restrict__ out, int cols, float eps) {
    const size_t row = blockIdx.x;
    const __nv_bfloat16* xr = x + row * cols;
    float ss = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = __bfloat162float(xr[i]);
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss) / cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        out[row * cols + i] = __float2bfloat16(__bfloat162float(xr[i]) * inv * __bfloat162float(w[i]));
}

// residual[r, :] += delta[r, :]; out[r, :] = rms_norm(residual[r, :]) * w
//   residual : device, f32 [rows, cols] (the residual stream is kept in f32)
//   delta    : device, bf16 [rows, cols]
//   w        : device, bf16 [cols]
//   out      : device, bf16 [rows, cols]
extern "C" __global__ void add_rms_norm_bf16(float* __restrict__ residual,
                                             const __nv_bfloat16* __restrict__ delta,
                                             const __nv_bfloat16* __restrict__ w,
                                             __nv_bfloat16* __restrict__ out, int cols, float eps) {
    const size_t row = blockIdx.x;
    float* rr = residual + row * cols;
    float ss = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = rr[i] + __bfloat162float(delta[row * cols + i]);
        rr[i] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss) / cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        out[row * cols + i] = __float2bfloat16(rr[i] * inv * __bfloat162float(w[i]));
}
