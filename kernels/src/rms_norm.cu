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

// out[r, :] = rms_norm(x[r, :]) * w
//   x   : device, f32  [rows, cols]
//   w   : device, bf16 [cols]
//   out : device, bf16 [rows, cols]
extern "C" __global__ void rms_norm_bf16(const float* __restrict__ x, const bf16* __restrict__ w,
                                         bf16* __restrict__ out, int cols, float eps) {
    wait_for_prior_kernels();
    const size_t row = blockIdx.x;
    const float* xr = x + row * cols;
    if (cols <= RMS_PER_THREAD * (int)blockDim.x) {
        float v[RMS_PER_THREAD], wv[RMS_PER_THREAD];
        const float inv = residual_row_regs<RMS_PER_THREAD>(xr, nullptr, nullptr, w, cols, eps, v, wv);
#pragma unroll
        for (int k = 0; k < RMS_PER_THREAD; ++k) {
            const int i = threadIdx.x + k * blockDim.x;
            if (i < cols) out[row * cols + i] = f2bf(wv[k] * (v[k] * inv));
        }
        return;
    }
    float ss = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(ss) / cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) out[row * cols + i] = f2bf(bf2f(w[i]) * (xr[i] * inv));
}

// residual[r, :] += delta'[r, :]; out[r, :] = rms_norm(residual[r, :]) * w, where delta' is the
// sub-layer's output, rms-normalised by delta_w first when given (Gemma; see common.cuh).
//   residual : device, f32  [rows, cols], updated in place
//   delta    : device, bf16 [rows, cols]
//   delta_w  : device, bf16 [cols], or null
//   w        : device, bf16 [cols]
//   out      : device, bf16 [rows, cols]
//   delta_ws : device, f32 [cols], or null; delta_xs : device, f32 [rows] — given, delta is an FP8
//              product whose weight-row and token scales this kernel applies (residual_row_regs);
//              the host gives them only for rows the registers hold (cols ≤ RMS_PER_THREAD · 1024)
extern "C" __global__ void add_rms_norm_bf16(float* __restrict__ residual, const bf16* __restrict__ delta,
                                             const bf16* __restrict__ delta_w, const bf16* __restrict__ w,
                                             bf16* __restrict__ out, int cols, float eps,
                                             const float* __restrict__ delta_ws, const float* __restrict__ delta_xs) {
    wait_for_prior_kernels();
    const size_t row = blockIdx.x;
    float* rr = residual + row * cols;
    const bf16* dr = delta + row * cols;
    if (cols <= RMS_PER_THREAD * (int)blockDim.x) {
        float v[RMS_PER_THREAD], wv[RMS_PER_THREAD];
        const float xs = delta_ws ? delta_xs[row] : 1.f;
        const float inv = residual_row_regs<RMS_PER_THREAD>(rr, dr, delta_w, w, cols, eps, v, wv, delta_ws, xs);
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
    const float inv_d = delta_inv_rms(dr, delta_w, cols, eps);
    float ss = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = residual_at(rr, dr, delta_w, inv_d, i);
        rr[i] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss) / cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        out[row * cols + i] = f2bf(bf2f(w[i]) * (rr[i] * inv));
}
