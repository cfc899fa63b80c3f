// Matrix-vector products for decode steps of a few rows: y[r, :] = x[r, :] · Wᵀ for r < rows ≤ R,
// W bf16 [n, k] row-major. Such a step is bound by reading W once from DRAM; cuBLAS serves it
// with GEMM tiles padded to 8 rows plus a split-K reduce launch, and the normalisation and
// activation around it are launches of their own, each a ramp-up and drain of the memory pipe.
// These kernels stream W with 16-byte non-allocating loads, GEMV_UNROLL per lane in flight, one
// warp per output row (rows dealt round-robin over a grid of one block per SM, so every SM gets
// the same share), and fold in what surrounds the projection:
//   - gemv_norm_*: the sub-layer's residual add + RMSNorm as a prologue (each block normalises
//     the few input rows itself into shared memory; block 0 writes the updated residual stream
//     to a new buffer, so no block reads a half-updated one), with the previous sub-layer's
//     output norm (Gemma) applied to what is added;
//   - gemv_norm_swiglu_* / gemv_norm_geglu_*: that, and SiLU(gate) · up or GELU-tanh(gate) · up
//     as the epilogue (a warp computes gate row j and up row j together).
// The arithmetic matches the unfused kernels (add_rms_norm_bf16, silu_mul_bf16x8,
// gelu_tanh_mul_bf16): the normalised input and the gate/up values are rounded to bf16 where
// those round them.
//
// Requirements (checked by the host): k % 8 == 0, every pointer 16-byte aligned, blockDim.x ==
// GEMV_THREADS, dynamic shared memory R * k * 2 bytes for the norm variants.
#include "common.cuh"

#define GEMV_THREADS 512
#define GEMV_UNROLL 8

// 8 bf16 weights (w) dotted with 8 bf16 inputs (x), accumulated in f32.
__device__ __forceinline__ float dot8(const uint4 w, const uint4 x, float acc) {
    const unsigned wv[4] = {w.x, w.y, w.z, w.w}, xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        acc = fmaf(__uint_as_float(wv[i] << 16), __uint_as_float(xv[i] << 16), acc);
        acc = fmaf(__uint_as_float(wv[i] & 0xffff0000u), __uint_as_float(xv[i] & 0xffff0000u), acc);
    }
    return acc;
}

// Weights are read once: skip L1 so the inputs stay there.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// acc[r] += W[row, :] · x[r, :] over this lane's share (lane, lane + 32, ... in 8-element units).
//   w  : one weight row, k8 units of 8 bf16
//   x  : input rows of k8 units (shared or global memory); rows past `rows` read the last one
//        (in bounds; their sums are dropped by the caller)
template <int R>
__device__ __forceinline__ void row_dot(const uint4* __restrict__ w, const uint4* x, int k8, int rows,
                                        float (&acc)[R]) {
    const int lane = threadIdx.x & 31;
    const uint4* xr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) xr[r] = x + (r < rows ? r : rows - 1) * k8;
    int i = lane;
    for (; i + 32 * (GEMV_UNROLL - 1) < k8; i += 32 * GEMV_UNROLL) {
        uint4 wv[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) wv[u] = load_stream(w + i + 32 * u);
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r] = dot8(wv[u], xr[r][i + 32 * u], acc[r]);
    }
    for (; i < k8; i += 32) {
        const uint4 wv = load_stream(w + i);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = dot8(wv, xr[r][i], acc[r]);
    }
}

// The same for two weight rows at once (gate and up), sharing the input loads.
template <int R>
__device__ __forceinline__ void row_dot2(const uint4* __restrict__ wa, const uint4* __restrict__ wb, const uint4* x,
                                         int k8, float (&a)[R], float (&b)[R]) {
    const int lane = threadIdx.x & 31;
    constexpr int U = GEMV_UNROLL / 2;
    int i = lane;
    for (; i + 32 * (U - 1) < k8; i += 32 * U) {
        uint4 va[U], vb[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            va[u] = load_stream(wa + i + 32 * u);
            vb[u] = load_stream(wb + i + 32 * u);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const uint4 xv = x[r * k8 + i + 32 * u];
                a[r] = dot8(va[u], xv, a[r]);
                b[r] = dot8(vb[u], xv, b[r]);
            }
    }
    for (; i < k8; i += 32) {
        const uint4 va = load_stream(wa + i), vb = load_stream(wb + i);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint4 xv = x[r * k8 + i];
            a[r] = dot8(va, xv, a[r]);
            b[r] = dot8(vb, xv, b[r]);
        }
    }
}

// Warms L2 with this warp's first weight row (128-byte lines spread over the lanes), so DRAM
// is busy while the block computes its prologue.
__device__ __forceinline__ void prefetch_first(const bf16* w, int n, int k) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n) return;
    for (int e = (threadIdx.x & 31) * 64; e < k; e += 32 * 64)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(w + (size_t)row * k + e));
}

// Elements of a row each thread keeps in registers during the prologue (rows up to
// GEMV_NORM_PT * blockDim.x long: every load issued at once, one round trip).
#define GEMV_NORM_PT 8

// xs[r, :] = bf16(rms_norm(residual[r, :] (+ delta'[r, :])) * norm_w), r < rows; rows up to R
// beyond `rows` are zeroed. delta' is delta, rms-normalised by delta_w first when given (see
// common.cuh). Block 0 writes the new residual row to residual_out when there is a delta. The
// arithmetic is add_rms_norm_bf16's.
template <int R>
__device__ __forceinline__ void norm_prologue(const float* __restrict__ residual, const bf16* __restrict__ delta,
                                              const bf16* __restrict__ delta_w, float* __restrict__ residual_out,
                                              const bf16* __restrict__ norm_w, bf16* xs, int k, int rows,
                                              float eps) {
    const bool write = residual_out && blockIdx.x == 0;
    for (int r = 0; r < R; ++r) {
        if (r >= rows) {
            for (int i = threadIdx.x; i < k; i += blockDim.x) xs[r * k + i] = 0;
            continue;
        }
        const float* rr = residual + (size_t)r * k;
        const bf16* dr = delta ? delta + (size_t)r * k : nullptr;
        if (k <= GEMV_NORM_PT * (int)blockDim.x) {
            float v[GEMV_NORM_PT], wv[GEMV_NORM_PT];
            const float inv = residual_row_regs<GEMV_NORM_PT>(rr, dr, delta_w, norm_w, k, eps, v, wv);
#pragma unroll
            for (int c = 0; c < GEMV_NORM_PT; ++c) {
                const int i = threadIdx.x + c * blockDim.x;
                if (i < k) {
                    if (write) residual_out[(size_t)r * k + i] = v[c];
                    xs[r * k + i] = f2bf(wv[c] * (v[c] * inv));
                }
            }
            continue;
        }
        const float inv_d = dr ? delta_inv_rms(dr, delta_w, k, eps) : 1.f;
        float ss = 0.f;
        for (int i = threadIdx.x; i < k; i += blockDim.x) {
            const float v = residual_at(rr, dr, delta_w, inv_d, i);
            ss += v * v;
        }
        const float inv = rsqrtf(block_sum(ss) / k + eps);
        for (int i = threadIdx.x; i < k; i += blockDim.x) {
            const float v = residual_at(rr, dr, delta_w, inv_d, i);
            if (write) residual_out[(size_t)r * k + i] = v;
            xs[r * k + i] = f2bf(bf2f(norm_w[i]) * (v * inv));
        }
    }
    __syncthreads();
}

// y[r, j] = x[r, :] · W[j, :], r < rows.
//   w : device, bf16 [n, k];  x : device, bf16 [rows, k];  y : device, bf16 [rows, n]
template <int R>
__device__ __forceinline__ void gemv_plain(const bf16* __restrict__ w, const bf16* __restrict__ x, bf16* __restrict__ y,
                                           int n, int k, int rows) {
    const int warps = gridDim.x * (blockDim.x >> 5);
    const int k8 = k >> 3;
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    for (int j = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); j < n; j += warps) {
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = 0.f;
        row_dot<R>(reinterpret_cast<const uint4*>(w + (size_t)j * k), xv, k8, rows, acc);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float s = warp_sum(acc[r]);
            if ((threadIdx.x & 31) == 0 && r < rows) y[(size_t)r * n + j] = f2bf(s);
        }
    }
}

// y[r, j] = rms_norm(residual[r] (+ delta'[r])) · W[j, :]; see norm_prologue.
//   residual : device, f32 [rows, k]; delta : device, bf16 [rows, k] or null;
//   delta_w : device, bf16 [k] or null; residual_out : device, f32 [rows, k] or null;
//   norm_w : device, bf16 [k]; w : device, bf16 [n, k]; y : device, bf16 [rows, n]
template <int R>
__device__ __forceinline__ void gemv_norm(const float* __restrict__ residual, const bf16* __restrict__ delta,
                                          const bf16* __restrict__ delta_w, float* __restrict__ residual_out,
                                          const bf16* __restrict__ norm_w, const bf16* __restrict__ w,
                                          bf16* __restrict__ y, int n, int k, int rows, float eps) {
    extern __shared__ uint4 gemv_xs[];
    prefetch_first(w, n, k);
    norm_prologue<R>(residual, delta, delta_w, residual_out, norm_w, reinterpret_cast<bf16*>(gemv_xs), k, rows,
                     eps);
    const int warps = gridDim.x * (blockDim.x >> 5);
    const int k8 = k >> 3;
    for (int j = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); j < n; j += warps) {
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = 0.f;
        row_dot<R>(reinterpret_cast<const uint4*>(w + (size_t)j * k), gemv_xs, k8, R, acc);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float s = warp_sum(acc[r]);
            if ((threadIdx.x & 31) == 0 && r < rows) y[(size_t)r * n + j] = f2bf(s);
        }
    }
}

// act[r, j] = Act(g) · u with g = x[r] · W[j, :], u = x[r] · W[inter + j, :] (each rounded to
// bf16 first, as the GEMM's output would be), x[r] = rms_norm(residual[r] + delta'[r]); Act is
// silu (SwiGLU) or gelu_tanh (GeGLU).
//   w : device, bf16 [2 * inter, k] (gate rows, then up rows); act : device, bf16 [rows, inter]
template <int R, float (*Act)(float)>
__device__ __forceinline__ void gemv_norm_glu(const float* __restrict__ residual, const bf16* __restrict__ delta,
                                              const bf16* __restrict__ delta_w, float* __restrict__ residual_out,
                                              const bf16* __restrict__ norm_w, const bf16* __restrict__ w,
                                              bf16* __restrict__ act, int inter, int k, int rows, float eps) {
    extern __shared__ uint4 gemv_xs[];
    prefetch_first(w, inter, k);
    norm_prologue<R>(residual, delta, delta_w, residual_out, norm_w, reinterpret_cast<bf16*>(gemv_xs), k, rows,
                     eps);
    const int warps = gridDim.x * (blockDim.x >> 5);
    const int k8 = k >> 3;
    for (int j = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); j < inter; j += warps) {
        float g[R], u[R];
#pragma unroll
        for (int r = 0; r < R; ++r) g[r] = u[r] = 0.f;
        row_dot2<R>(reinterpret_cast<const uint4*>(w + (size_t)j * k),
                    reinterpret_cast<const uint4*>(w + (size_t)(inter + j) * k), gemv_xs, k8, g, u);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float gs = bf2f(f2bf(warp_sum(g[r]))), us = bf2f(f2bf(warp_sum(u[r])));
            if ((threadIdx.x & 31) == 0 && r < rows) act[(size_t)r * inter + j] = f2bf(Act(gs) * us);
        }
    }
}

#define GEMV_PLAIN_KERNEL(name, R)                                                                    \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 1)                                     \
        name(const bf16* __restrict__ w, const bf16* __restrict__ x, bf16* __restrict__ y, int n, int k, \
             int rows) {                                                                              \
        gemv_plain<R>(w, x, y, n, k, rows);                                                           \
    }
#define GEMV_NORM_KERNEL(name, R)                                                                     \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 1)                                     \
        name(const float* __restrict__ residual, const bf16* __restrict__ delta,                      \
             const bf16* __restrict__ delta_w, float* __restrict__ residual_out,                      \
             const bf16* __restrict__ norm_w, const bf16* __restrict__ w, bf16* __restrict__ y, int n, int k, \
             int rows, float eps) {                                                                   \
        gemv_norm<R>(residual, delta, delta_w, residual_out, norm_w, w, y, n, k, rows, eps);          \
    }
#define GEMV_GLU_KERNEL(name, R, ACT)                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 1)                                     \
        name(const float* __restrict__ residual, const bf16* __restrict__ delta,                      \
             const bf16* __restrict__ delta_w, float* __restrict__ residual_out,                      \
             const bf16* __restrict__ norm_w, const bf16* __restrict__ w, bf16* __restrict__ act, int inter, \
             int k, int rows, float eps) {                                                            \
        gemv_norm_glu<R, ACT>(residual, delta, delta_w, residual_out, norm_w, w, act, inter, k, rows, eps); \
    }

GEMV_PLAIN_KERNEL(gemv_bf16_r1, 1)
GEMV_PLAIN_KERNEL(gemv_bf16_r2, 2)
GEMV_PLAIN_KERNEL(gemv_bf16_r4, 4)
GEMV_NORM_KERNEL(gemv_norm_bf16_r1, 1)
GEMV_NORM_KERNEL(gemv_norm_bf16_r2, 2)
GEMV_NORM_KERNEL(gemv_norm_bf16_r4, 4)
GEMV_GLU_KERNEL(gemv_norm_swiglu_bf16_r1, 1, silu)
GEMV_GLU_KERNEL(gemv_norm_swiglu_bf16_r2, 2, silu)
GEMV_GLU_KERNEL(gemv_norm_swiglu_bf16_r4, 4, silu)
GEMV_GLU_KERNEL(gemv_norm_geglu_bf16_r1, 1, gelu_tanh)
GEMV_GLU_KERNEL(gemv_norm_geglu_bf16_r2, 2, gelu_tanh)
GEMV_GLU_KERNEL(gemv_norm_geglu_bf16_r4, 4, gelu_tanh)
