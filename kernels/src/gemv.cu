// Matrix-vector products for decode steps of a few rows: y[r, :] = x[r, :] · Wᵀ for r < rows ≤ R,
// W [n, k] row-major, bf16 or FP8 (`_e4m3` symbols: e4m3fn codes with one f32 scale per output
// row, applied to the finished sum; half the bytes to stream). Such a step is bound by reading W once from DRAM; cuBLAS serves it
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
// Requirements (checked by the host): k % 8 == 0 (bf16) or k % 16 == 0 (e4m3), every pointer
// 16-byte aligned, blockDim.x == GEMV_THREADS, dynamic shared memory R * k * 2 bytes for the
// norm variants.
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

// 16 e4m3 weights (w) dotted with 16 bf16 inputs (x0: the first 8, x1: the next 8), in f32.
__device__ __forceinline__ float dot16_e4m3(const uint4 w, const uint4 x0, const uint4 x1, float acc) {
    const unsigned wv[4] = {w.x, w.y, w.z, w.w}, xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float f[4];
        e4m3x4_f32(wv[i], f);
        acc = fmaf(f[0], __uint_as_float(xv[2 * i] << 16), acc);
        acc = fmaf(f[1], __uint_as_float(xv[2 * i] & 0xffff0000u), acc);
        acc = fmaf(f[2], __uint_as_float(xv[2 * i + 1] << 16), acc);
        acc = fmaf(f[3], __uint_as_float(xv[2 * i + 1] & 0xffff0000u), acc);
    }
    return acc;
}

// One 16-byte unit `i` of a weight row dotted with the matching inputs of row x (8 bf16 weights
// and x unit i, or 16 e4m3 weights and x units 2i, 2i + 1).
template <bool F8>
__device__ __forceinline__ float dot_unit(const uint4 w, const uint4* x, int i, float acc) {
    if (F8) return dot16_e4m3(w, x[2 * i], x[2 * i + 1], acc);
    return dot8(w, x[i], acc);
}

// Weight row j as 16-byte units: bf16 rows are 2k bytes, e4m3 rows k.
template <bool F8>
__device__ __forceinline__ const uint4* weight_row(const void* w, int j, int k) {
    return reinterpret_cast<const uint4*>(static_cast<const unsigned char*>(w) + (size_t)j * k * (F8 ? 1 : 2));
}

// Weights are read once: skip L1 so the inputs stay there.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// acc[r] += W[row, :] · x[r, :] over this lane's share (lane, lane + 32, ... in 16-byte units).
//   w  : one weight row, ku 16-byte units (8 bf16 or 16 e4m3 weights each)
//   x  : input rows of k/8 units of 8 bf16 (shared or global memory); rows past `rows` read the
//        last one (in bounds; their sums are dropped by the caller)
template <int R, bool F8>
__device__ __forceinline__ void row_dot(const uint4* __restrict__ w, const uint4* x, int ku, int rows,
                                        float (&acc)[R]) {
    const int lane = threadIdx.x & 31;
    const int k8 = F8 ? 2 * ku : ku;
    const uint4* xr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) xr[r] = x + (r < rows ? r : rows - 1) * k8;
    int i = lane;
    for (; i + 32 * (GEMV_UNROLL - 1) < ku; i += 32 * GEMV_UNROLL) {
        uint4 wv[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) wv[u] = load_stream(w + i + 32 * u);
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r] = dot_unit<F8>(wv[u], xr[r], i + 32 * u, acc[r]);
    }
    // The rest of the row (fewer than GEMV_UNROLL units a lane), its loads issued before any
    // product as in the passes above: taken one load at a time, rows of a few hundred units
    // spent most of their time here. With several rows' sums in registers, T units at a time.
    constexpr int T = R >= 4 ? 2 : R >= 2 ? GEMV_UNROLL / 2 : GEMV_UNROLL - 1;
    for (; i < ku; i += 32 * T) {
        const int left = (ku - i + 31) >> 5;
        uint4 wv[T];
#pragma unroll
        for (int u = 0; u < T; ++u)
            if (u < left) wv[u] = load_stream(w + i + 32 * u);
#pragma unroll
        for (int u = 0; u < T; ++u)
            if (u < left)
#pragma unroll
                for (int r = 0; r < R; ++r) acc[r] = dot_unit<F8>(wv[u], xr[r], i + 32 * u, acc[r]);
    }
}

// The same for two weight rows at once (gate and up); x holds R rows.
template <int R, bool F8>
__device__ __forceinline__ void row_dot2(const uint4* __restrict__ wa, const uint4* __restrict__ wb, const uint4* x,
                                         int ku, float (&a)[R], float (&b)[R]) {
    const int lane = threadIdx.x & 31;
    const int k8 = F8 ? 2 * ku : ku;
    constexpr int U = GEMV_UNROLL / 2;
    int i = lane;
    for (; i + 32 * (U - 1) < ku; i += 32 * U) {
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
                a[r] = dot_unit<F8>(va[u], x + r * k8, i + 32 * u, a[r]);
                b[r] = dot_unit<F8>(vb[u], x + r * k8, i + 32 * u, b[r]);
            }
    }
    // The rest of the rows (fewer than U units a lane), loads first, as in row_dot.
    if (i < ku) {
        const int left = (ku - i + 31) >> 5;
        uint4 va[U - 1], vb[U - 1];
#pragma unroll
        for (int u = 0; u < U - 1; ++u)
            if (u < left) {
                va[u] = load_stream(wa + i + 32 * u);
                vb[u] = load_stream(wb + i + 32 * u);
            }
#pragma unroll
        for (int u = 0; u < U - 1; ++u)
            if (u < left)
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    a[r] = dot_unit<F8>(va[u], x + r * k8, i + 32 * u, a[r]);
                    b[r] = dot_unit<F8>(vb[u], x + r * k8, i + 32 * u, b[r]);
                }
    }
}

// Warms L2 with this warp's first weight row (128-byte lines spread over the lanes), so DRAM
// is busy while the block computes its prologue.
__device__ __forceinline__ void prefetch_first(const void* w, int n, int row_bytes) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n) return;
    const unsigned char* wr = static_cast<const unsigned char*>(w) + (size_t)row * row_bytes;
    for (int e = (threadIdx.x & 31) * 128; e < row_bytes; e += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(wr + e));
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

// 16-byte units in a weight row of k elements.
template <bool F8>
__device__ __forceinline__ int row_units(int k) {
    return F8 ? k >> 4 : k >> 3;
}

__device__ __forceinline__ void store_out(bf16* y, size_t i, float v) { y[i] = f2bf(v); }
__device__ __forceinline__ void store_out(float* y, size_t i, float v) { y[i] = v; }

// y[r, j] = x[r, :] · W[j, :] (· w_scale[j] for e4m3), r < rows.
//   w : device, bf16 or e4m3 [n, k];  w_scale : device, f32 [n] (e4m3) or null;
//   x : device, bf16 [rows, k];  y : device, bf16 or f32 (Out) [rows, n]
template <int R, bool F8, typename Out>
__device__ __forceinline__ void gemv_plain(const void* __restrict__ w, const float* __restrict__ w_scale,
                                           const bf16* __restrict__ x, Out* __restrict__ y, int n, int k, int rows) {
    const int warps = gridDim.x * (blockDim.x >> 5);
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    for (int j = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); j < n; j += warps) {
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = 0.f;
        row_dot<R, F8>(weight_row<F8>(w, j, k), xv, row_units<F8>(k), rows, acc);
        const float sc = F8 ? w_scale[j] : 1.f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float s = warp_sum(acc[r]) * sc;
            if ((threadIdx.x & 31) == 0 && r < rows) store_out(y, (size_t)r * n + j, s);
        }
    }
}

// y[r, j] = rms_norm(residual[r] (+ delta'[r])) · W[j, :]; see norm_prologue. Where xs_out is
// given, block 0 also writes the normalised rows there, for a consumer after this launch (a MoE
// layer's experts read the rows its router's GEMV normalised).
//   residual : device, f32 [rows, k]; delta : device, bf16 [rows, k] or null;
//   delta_w : device, bf16 [k] or null; residual_out : device, f32 [rows, k] or null;
//   norm_w : device, bf16 [k]; w : device, bf16 or e4m3 [n, k]; w_scale : device, f32 [n]
//   (e4m3) or null; y : device, bf16 or f32 (Out) [rows, n]; xs_out : device, bf16 [rows, k]
//   or null
template <int R, bool F8, typename Out>
__device__ __forceinline__ void gemv_norm(const float* __restrict__ residual, const bf16* __restrict__ delta,
                                          const bf16* __restrict__ delta_w, float* __restrict__ residual_out,
                                          const bf16* __restrict__ norm_w, const void* __restrict__ w,
                                          const float* __restrict__ w_scale, Out* __restrict__ y, int n, int k,
                                          int rows, float eps, bf16* __restrict__ xs_out) {
    extern __shared__ uint4 gemv_xs[];
    prefetch_first(w, n, k * (F8 ? 1 : 2));
    norm_prologue<R>(residual, delta, delta_w, residual_out, norm_w, reinterpret_cast<bf16*>(gemv_xs), k, rows,
                     eps);
    if (xs_out != nullptr && blockIdx.x == 0)
        for (int i = threadIdx.x; i < rows * (k >> 3); i += blockDim.x) reinterpret_cast<uint4*>(xs_out)[i] = gemv_xs[i];
    const int warps = gridDim.x * (blockDim.x >> 5);
    for (int j = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); j < n; j += warps) {
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = 0.f;
        row_dot<R, F8>(weight_row<F8>(w, j, k), gemv_xs, row_units<F8>(k), R, acc);
        const float sc = F8 ? w_scale[j] : 1.f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float s = warp_sum(acc[r]) * sc;
            if ((threadIdx.x & 31) == 0 && r < rows) store_out(y, (size_t)r * n + j, s);
        }
    }
}

// act[r, j] = Act(g) · u with g = x[r] · W[j, :], u = x[r] · W[inter + j, :] (each rounded to
// bf16 first, as the GEMM's output would be), x[r] = rms_norm(residual[r] + delta'[r]); Act is
// silu (SwiGLU) or gelu_tanh (GeGLU).
//   w : device, bf16 or e4m3 [2 * inter, k] (gate rows, then up rows); w_scale : device, f32
//   [2 * inter] (e4m3) or null; act : device, bf16 [rows, inter]
template <int R, bool F8, float (*Act)(float)>
__device__ __forceinline__ void gemv_norm_glu(const float* __restrict__ residual, const bf16* __restrict__ delta,
                                              const bf16* __restrict__ delta_w, float* __restrict__ residual_out,
                                              const bf16* __restrict__ norm_w, const void* __restrict__ w,
                                              const float* __restrict__ w_scale, bf16* __restrict__ act, int inter,
                                              int k, int rows, float eps) {
    extern __shared__ uint4 gemv_xs[];
    prefetch_first(w, inter, k * (F8 ? 1 : 2));
    norm_prologue<R>(residual, delta, delta_w, residual_out, norm_w, reinterpret_cast<bf16*>(gemv_xs), k, rows,
                     eps);
    const int warps = gridDim.x * (blockDim.x >> 5);
    for (int j = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); j < inter; j += warps) {
        float g[R], u[R];
#pragma unroll
        for (int r = 0; r < R; ++r) g[r] = u[r] = 0.f;
        row_dot2<R, F8>(weight_row<F8>(w, j, k), weight_row<F8>(w, inter + j, k), gemv_xs, row_units<F8>(k), g, u);
        const float gsc = F8 ? w_scale[j] : 1.f, usc = F8 ? w_scale[inter + j] : 1.f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float gs = bf2f(f2bf(warp_sum(g[r]) * gsc)), us = bf2f(f2bf(warp_sum(u[r]) * usc));
            if ((threadIdx.x & 31) == 0 && r < rows) act[(size_t)r * inter + j] = f2bf(Act(gs) * us);
        }
    }
}

// Every symbol takes (…, w, w_scale, …): w_scale is null for the bf16 ones.
#define GEMV_PLAIN_KERNEL_OUT(name, R, F8, OUT)                                                       \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 1)                                     \
        name(const void* __restrict__ w, const float* __restrict__ w_scale, const bf16* __restrict__ x, \
             OUT* __restrict__ y, int n, int k, int rows) {                                           \
        wait_for_prior_kernels();                                                                     \
        gemv_plain<R, F8, OUT>(w, w_scale, x, y, n, k, rows);                                         \
    }
#define GEMV_PLAIN_KERNEL(name, R, F8) GEMV_PLAIN_KERNEL_OUT(name, R, F8, bf16)
#define GEMV_NORM_KERNEL(name, R, F8)                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 1)                                     \
        name(const float* __restrict__ residual, const bf16* __restrict__ delta,                      \
             const bf16* __restrict__ delta_w, float* __restrict__ residual_out,                      \
             const bf16* __restrict__ norm_w, const void* __restrict__ w, const float* __restrict__ w_scale, \
             bf16* __restrict__ y, int n, int k, int rows, float eps) {                               \
        wait_for_prior_kernels();                                                                     \
        gemv_norm<R, F8, bf16>(residual, delta, delta_w, residual_out, norm_w, w, w_scale, y, n, k, rows, eps, \
                               nullptr);                                                              \
    }
// The same with f32 products and the normalised rows written out (a MoE router's logits over the
// layer's normalised input, which its experts then read from xs_out).
#define GEMV_NORM_F32OUT_KERNEL(name, R)                                                              \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 1)                                     \
        name(const float* __restrict__ residual, const bf16* __restrict__ delta,                      \
             const bf16* __restrict__ delta_w, float* __restrict__ residual_out,                      \
             const bf16* __restrict__ norm_w, const void* __restrict__ w, const float* __restrict__ w_scale, \
             float* __restrict__ y, int n, int k, int rows, float eps, bf16* __restrict__ xs_out) {    \
        wait_for_prior_kernels();                                                                     \
        gemv_norm<R, false, float>(residual, delta, delta_w, residual_out, norm_w, w, w_scale, y, n, k, rows, \
                                   eps, xs_out);                                                      \
    }
#define GEMV_GLU_KERNEL(name, R, F8, ACT)                                                             \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 1)                                     \
        name(const float* __restrict__ residual, const bf16* __restrict__ delta,                      \
             const bf16* __restrict__ delta_w, float* __restrict__ residual_out,                      \
             const bf16* __restrict__ norm_w, const void* __restrict__ w, const float* __restrict__ w_scale, \
             bf16* __restrict__ act, int inter, int k, int rows, float eps) {                         \
        wait_for_prior_kernels();                                                                                  \
        gemv_norm_glu<R, F8, ACT>(residual, delta, delta_w, residual_out, norm_w, w, w_scale, act, inter, k, rows, \
                                  eps);                                                               \
    }
GEMV_PLAIN_KERNEL(gemv_bf16_r1, 1, false)
GEMV_PLAIN_KERNEL(gemv_bf16_r2, 2, false)
GEMV_PLAIN_KERNEL(gemv_bf16_r4, 4, false)
// f32 products (a MoE router's logits: bf16 ones turn near ties into other experts).
GEMV_PLAIN_KERNEL_OUT(gemv_f32out_bf16_r1, 1, false, float)
GEMV_PLAIN_KERNEL_OUT(gemv_f32out_bf16_r2, 2, false, float)
GEMV_PLAIN_KERNEL_OUT(gemv_f32out_bf16_r4, 4, false, float)
GEMV_NORM_KERNEL(gemv_norm_bf16_r1, 1, false)
GEMV_NORM_KERNEL(gemv_norm_bf16_r2, 2, false)
GEMV_NORM_KERNEL(gemv_norm_bf16_r4, 4, false)
GEMV_NORM_F32OUT_KERNEL(gemv_norm_f32out_bf16_r1, 1)
GEMV_NORM_F32OUT_KERNEL(gemv_norm_f32out_bf16_r2, 2)
GEMV_NORM_F32OUT_KERNEL(gemv_norm_f32out_bf16_r4, 4)
GEMV_GLU_KERNEL(gemv_norm_swiglu_bf16_r1, 1, false, silu)
GEMV_GLU_KERNEL(gemv_norm_swiglu_bf16_r2, 2, false, silu)
GEMV_GLU_KERNEL(gemv_norm_swiglu_bf16_r4, 4, false, silu)
GEMV_GLU_KERNEL(gemv_norm_geglu_bf16_r1, 1, false, gelu_tanh)
GEMV_GLU_KERNEL(gemv_norm_geglu_bf16_r2, 2, false, gelu_tanh)
GEMV_GLU_KERNEL(gemv_norm_geglu_bf16_r4, 4, false, gelu_tanh)
GEMV_PLAIN_KERNEL(gemv_e4m3_r1, 1, true)
GEMV_PLAIN_KERNEL(gemv_e4m3_r2, 2, true)
GEMV_PLAIN_KERNEL(gemv_e4m3_r4, 4, true)
GEMV_NORM_KERNEL(gemv_norm_e4m3_r1, 1, true)
GEMV_NORM_KERNEL(gemv_norm_e4m3_r2, 2, true)
GEMV_NORM_KERNEL(gemv_norm_e4m3_r4, 4, true)
GEMV_GLU_KERNEL(gemv_norm_swiglu_e4m3_r1, 1, true, silu)
GEMV_GLU_KERNEL(gemv_norm_swiglu_e4m3_r2, 2, true, silu)
GEMV_GLU_KERNEL(gemv_norm_swiglu_e4m3_r4, 4, true, silu)
GEMV_GLU_KERNEL(gemv_norm_geglu_e4m3_r1, 1, true, gelu_tanh)
GEMV_GLU_KERNEL(gemv_norm_geglu_e4m3_r2, 2, true, gelu_tanh)
GEMV_GLU_KERNEL(gemv_norm_geglu_e4m3_r4, 4, true, gelu_tanh)

// FP8 weights (e4m3fn, one scale per row): scale[j] = amax_j / 448, codes[j, :] = e4m3(w[j, :] /
// scale[j]) (0 for a row of zeros) — backend/src/device/fp8.rs's quantize_row. One block per row.
//   w : device, bf16 [n, k];  codes : device, e4m3 [n, k];  scale : device, f32 [n]
extern "C" __global__ void quantize_rows_e4m3(const bf16* __restrict__ w, fp8* __restrict__ codes,
                                              float* __restrict__ scale, int n, int k) {
    wait_for_prior_kernels();
    const int j = blockIdx.x;
    if (j >= n) return;
    const bf16* row = w + (size_t)j * k;
    float m = 0.f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) m = fmaxf(m, fabsf(bf2f(row[i])));
    const float s = __fdiv_rn(block_max(m), E4M3_MAX);
    for (int i = threadIdx.x; i < k; i += blockDim.x)
        codes[(size_t)j * k + i] = s > 0.f ? f2e4m3(__fdiv_rn(bf2f(row[i]), s)) : (fp8)0;
    if (threadIdx.x == 0) scale[j] = s;
}

// A GEMM's input rows (activations) to e4m3 with one scale per row, for cuBLASLt's FP8 product:
// scale[j] = amax_j / 448 as quantize_rows_e4m3, but each row read once (each thread holds its
// 16-byte chunks in registers, up to ACT_Q_CHUNKS a thread; longer rows are read twice), eight
// codes written at a time, and x · (448 / amax_j) instead of a division per element — an ulp or
// two from x / scale[j], which moves a code only where a value lies on a rounding boundary
// (quantize_rows_e4m3 stays exact: the weights must match the CPU's fp8.rs). One block of
// ACT_Q_THREADS per row; k % 8 == 0 and 16-byte-aligned rows (the host checks k % 16).
//   x : device, bf16 [n, k];  codes : device, e4m3 [n, k];  scale : device, f32 [n]
#define ACT_Q_THREADS 256
#define ACT_Q_CHUNKS 8
__device__ __forceinline__ float amax8(uint4 v) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i)
        m = fmaxf(m, fmaxf(fabsf(__uint_as_float(w[i] << 16)), fabsf(__uint_as_float(w[i] & 0xffff0000u))));
    return m;
}
// Two floats → two e4m3 codes (lo in the low byte): RNE, saturated at ±448, NaN → 0x7f — one
// instruction on sm_89+, f2e4m3 (the same results) before.
__device__ __forceinline__ unsigned f32x2_e4m3x2(float lo, float hi) {
#if __CUDA_ARCH__ >= 890
    unsigned short two;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(two) : "f"(hi), "f"(lo));
    return two;
#else
    return (unsigned)f2e4m3(lo) | ((unsigned)f2e4m3(hi) << 8);
#endif
}
__device__ __forceinline__ uint2 e4m3x8(uint4 v, float inv) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
    unsigned q[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        q[i] = f32x2_e4m3x2(__uint_as_float(w[i] << 16) * inv, __uint_as_float(w[i] & 0xffff0000u) * inv);
    return make_uint2(q[0] | (q[1] << 16), q[2] | (q[3] << 16));
}
extern "C" __global__ void __launch_bounds__(ACT_Q_THREADS) quantize_act_rows_e4m3(
    const bf16* __restrict__ x, fp8* __restrict__ codes, float* __restrict__ scale, int n, int k) {
    wait_for_prior_kernels();
    const int j = blockIdx.x;
    if (j >= n) return;
    const uint4* row = reinterpret_cast<const uint4*>(x + (size_t)j * k);
    uint2* out = reinterpret_cast<uint2*>(codes + (size_t)j * k);
    const int chunks = k >> 3, held = ACT_Q_CHUNKS * ACT_Q_THREADS;
    uint4 v[ACT_Q_CHUNKS];
    float m = 0.f;
#pragma unroll
    for (int c = 0; c < ACT_Q_CHUNKS; ++c) {
        const int i = threadIdx.x + c * ACT_Q_THREADS;
        if (i < chunks) {
            v[c] = row[i];
            m = fmaxf(m, amax8(v[c]));
        }
    }
    for (int i = held + threadIdx.x; i < chunks; i += ACT_Q_THREADS) m = fmaxf(m, amax8(row[i]));
    const float amax = block_max(m);
    const float inv = amax > 0.f ? __fdiv_rn(E4M3_MAX, amax) : 0.f;
#pragma unroll
    for (int c = 0; c < ACT_Q_CHUNKS; ++c) {
        const int i = threadIdx.x + c * ACT_Q_THREADS;
        if (i < chunks) out[i] = e4m3x8(v[c], inv);
    }
    for (int i = held + threadIdx.x; i < chunks; i += ACT_Q_THREADS) out[i] = e4m3x8(row[i], inv);
    if (threadIdx.x == 0) scale[j] = __fdiv_rn(amax, E4M3_MAX);
}

// A sub-layer's input straight into the FP8 GEMM's: residual[r, :] += delta'[r, :] when delta is
// given (add_rms_norm_bf16; else the residual is only read, as rms_norm_bf16), y = bf16 of
// rms_norm(residual[r, :]) · w — those kernels' output — then y quantized as
// quantize_act_rows_e4m3 quantizes it (codes[r, i] = e4m3(y_i · 448/amax), scale[r] =
// amax/448): the same codes and scales bit for bit, without the bf16 rows written and read back
// or the launch between. Rows of at most RMS_PER_THREAD · blockDim.x (held in registers); a
// block per row, norm_config's threads.
//   residual : device, f32 [rows, cols];  delta : bf16 [rows, cols] or null;  delta_w, w : bf16 [cols]
//   codes : device, e4m3 [rows, cols];  scale : device, f32 [rows]
//   delta_ws : f32 [cols] or null;  delta_xs : f32 [rows] — an FP8 product's scales, applied to
//              delta here (as add_rms_norm_bf16 does)
extern "C" __global__ void rms_norm_e4m3(float* __restrict__ residual, const bf16* __restrict__ delta,
                                         const bf16* __restrict__ delta_w, const bf16* __restrict__ w,
                                         fp8* __restrict__ codes, float* __restrict__ scale, int cols, float eps,
                                         const float* __restrict__ delta_ws, const float* __restrict__ delta_xs) {
    wait_for_prior_kernels();
    const size_t row = blockIdx.x;
    float* rr = residual + row * cols;
    const bf16* dr = delta ? delta + row * cols : nullptr;
    float v[RMS_PER_THREAD], wv[RMS_PER_THREAD], y[RMS_PER_THREAD];
    const float xs = dr && delta_ws ? delta_xs[row] : 1.f;
    const float inv = residual_row_regs<RMS_PER_THREAD>(rr, dr, delta_w, w, cols, eps, v, wv, dr ? delta_ws : nullptr, xs);
    float m = 0.f;
#pragma unroll
    for (int k = 0; k < RMS_PER_THREAD; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        y[k] = 0.f;
        if (i < cols) {
            if (dr) rr[i] = v[k];
            y[k] = bf2f(f2bf(wv[k] * (v[k] * inv)));
            m = fmaxf(m, fabsf(y[k]));
        }
    }
    const float amax = block_max(m);
    const float qi = amax > 0.f ? __fdiv_rn(E4M3_MAX, amax) : 0.f;
#pragma unroll
    for (int k = 0; k < RMS_PER_THREAD; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < cols) codes[row * cols + i] = (fp8)(f32x2_e4m3x2(y[k] * qi, 0.f) & 0xffu);
    }
    if (threadIdx.x == 0) scale[row] = __fdiv_rn(amax, E4M3_MAX);
}

// 16 e4m3 codes (one 16-byte unit, lowest byte first) → 16 bf16 of e4m3 · sc (each product
// rounded once; with sc = 1 the codes' values, exactly) in two 16-byte stores at dst.
__device__ __forceinline__ void e4m3x16_bf16(uint4 q, float sc, uint4* dst) {
    const unsigned words[4] = {q.x, q.y, q.z, q.w};
    unsigned o[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float f[4];
        e4m3x4_f32(words[i], f);
        o[2 * i] = pack_bf16(f[0] * sc, f[1] * sc);
        o[2 * i + 1] = pack_bf16(f[2] * sc, f[3] * sc);
    }
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

// w[j, :] = bf16(e4m3(codes[j, :]) · scale[j]): FP8 weights back to bf16 for cuBLAS. Grid-stride
// over n · k in groups of 16 (one 16-byte load, two 16-byte stores) where k % 16 == 0 (the
// buffers are 16-byte aligned: whole allocations, or views at multiples of 16 rows' worth),
// else an element a thread.
extern "C" __global__ void dequantize_rows_e4m3(const fp8* __restrict__ codes, const float* __restrict__ scale,
                                                bf16* __restrict__ w, int n, int k) {
    wait_for_prior_kernels();
    const size_t total = (size_t)n * k, stride = (size_t)gridDim.x * blockDim.x;
    const size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if ((k & 15) == 0) {
        for (size_t g = first; g < total / 16; g += stride)
            e4m3x16_bf16(reinterpret_cast<const uint4*>(codes)[g], scale[g * 16 / k], reinterpret_cast<uint4*>(w) + 2 * g);
        return;
    }
    for (size_t e = first; e < total; e += stride) w[e] = f2bf(e4m3f(codes[e]) * scale[e / k]);
}

// The FP8 GEMM's epilogue (cuBLASLt multiplies the codes with unit scales, into f32 or bf16):
// out[t, j] = d[t, j] · w_scale[j] · x_scale[t] — the weight row's and the token's scale — into
// bf16 or f32. Grid-stride over n · m in groups of four (m % 4 == 0, checked by the host).
//   d : device, f32 or bf16 [n, m];  w_scale : device, f32 [m];  x_scale : device, f32 [n]
__device__ __forceinline__ void load4(const float* d, size_t g, float v[4]) {
    const float4 x = reinterpret_cast<const float4*>(d)[g];
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
}
__device__ __forceinline__ void load4(const bf16* d, size_t g, float v[4]) {
    const uint2 x = reinterpret_cast<const uint2*>(d)[g];
    v[0] = __uint_as_float(x.x << 16), v[1] = __uint_as_float(x.x & 0xffff0000u);
    v[2] = __uint_as_float(x.y << 16), v[3] = __uint_as_float(x.y & 0xffff0000u);
}
template <typename In, typename Out>
__device__ __forceinline__ void fp8_scale_out(const In* __restrict__ d, const float* __restrict__ w_scale,
                                              const float* __restrict__ x_scale, Out* __restrict__ out, int n, int m) {
    const size_t groups = (size_t)n * m / 4;
    for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < groups; g += (size_t)gridDim.x * blockDim.x) {
        const size_t e = 4 * g;
        const int t = (int)(e / m), j = (int)(e % m);
        float v[4];
        load4(d, g, v);
        const float4 ws = *reinterpret_cast<const float4*>(w_scale + j);
        const float xs = x_scale[t];
        const float r[4] = {v[0] * ws.x * xs, v[1] * ws.y * xs, v[2] * ws.z * xs, v[3] * ws.w * xs};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if constexpr (sizeof(Out) == 2)
                out[e + i] = f2bf(r[i]);
            else
                out[e + i] = r[i];
        }
    }
}
extern "C" __global__ void fp8_scale_out_bf16(const float* __restrict__ d, const float* __restrict__ w_scale,
                                              const float* __restrict__ x_scale, bf16* __restrict__ out, int n,
                                              int m) {
    wait_for_prior_kernels();
    fp8_scale_out<float, bf16>(d, w_scale, x_scale, out, n, m);
}
extern "C" __global__ void fp8_scale_out_f32(const float* __restrict__ d, const float* __restrict__ w_scale,
                                             const float* __restrict__ x_scale, float* __restrict__ out, int n, int m) {
    wait_for_prior_kernels();
    fp8_scale_out<float, float>(d, w_scale, x_scale, out, n, m);
}
// The same from a bf16 product (half the bytes written and read back), the same arithmetic, eight
// elements a thread in 16-byte loads and stores: a block row of FP8_SCALE_THREADS threads per
// 8 · FP8_SCALE_THREADS columns, blockIdx.y the token (no index division; m % 8 == 0).
#define FP8_SCALE_THREADS 256
__device__ __forceinline__ void fp8_scale_bf16_row8(const bf16* __restrict__ d, const float* __restrict__ w_scale,
                                                    float xs, bf16* __restrict__ out, size_t e, int c) {
    const uint4 v = *reinterpret_cast<const uint4*>(d + e);
    const float4 w0 = *reinterpret_cast<const float4*>(w_scale + c);
    const float4 w1 = *reinterpret_cast<const float4*>(w_scale + c + 4);
    const unsigned in[4] = {v.x, v.y, v.z, v.w};
    const float ws[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
    unsigned o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float lo = __uint_as_float(in[i] << 16) * ws[2 * i] * xs;
        const float hi = __uint_as_float(in[i] & 0xffff0000u) * ws[2 * i + 1] * xs;
        o[i] = (unsigned)f2bf(lo) | ((unsigned)f2bf(hi) << 16);
    }
    *reinterpret_cast<uint4*>(out + e) = make_uint4(o[0], o[1], o[2], o[3]);
}
extern "C" __global__ void __launch_bounds__(FP8_SCALE_THREADS) fp8_scale_bf16_bf16(
    const bf16* __restrict__ d, const float* __restrict__ w_scale, const float* __restrict__ x_scale,
    bf16* __restrict__ out, int n, int m) {
    wait_for_prior_kernels();
    const int t = blockIdx.y, c = 8 * (blockIdx.x * FP8_SCALE_THREADS + threadIdx.x);
    if (t >= n || c >= m) return;
    fp8_scale_bf16_row8(d, w_scale, x_scale[t], out, (size_t)t * m + c, c);
}
// The same where each row has weight scales of its own (a mixture's sorted rows, each its
// expert's): row t's are w_scale[w_first[t] ..][:m]. Offsets are multiples of 4 (16-byte loads).
//   w_first : device, u32 [n]
extern "C" __global__ void __launch_bounds__(FP8_SCALE_THREADS) fp8_scale_bf16_bf16_rows(
    const bf16* __restrict__ d, const float* __restrict__ w_scale, const unsigned* __restrict__ w_first,
    const float* __restrict__ x_scale, bf16* __restrict__ out, int n, int m) {
    wait_for_prior_kernels();
    const int t = blockIdx.y, c = 8 * (blockIdx.x * FP8_SCALE_THREADS + threadIdx.x);
    if (t >= n || c >= m) return;
    fp8_scale_bf16_row8(d, w_scale + w_first[t], x_scale[t], out, (size_t)t * m + c, c);
}

// The FP8 gate|up product's epilogue and the gated activation in one pass: fp8_scale_bf16_bf16's
// arithmetic on the gate and up columns (each scaled value rounded to bf16), then act_mul_x8's
// (elementwise.cu), so the result is bit for bit the two launches' — without writing the scaled
// gate|up and reading it back.
//   d       : bf16 [n, 2·inter] (cuBLASLt's product of the codes: gate columns, then up)
//   w_scale : f32 [2·inter], x_scale : f32 [n]
//   out     : bf16 [n, inter]
// grid (ceil(inter / (8·FP8_SCALE_THREADS)), n), block FP8_SCALE_THREADS; inter % 8 == 0.
template <float (*Act)(float)>
__device__ __forceinline__ void fp8_scale_glu(const bf16* __restrict__ d, const float* __restrict__ w_scale,
                                              const float* __restrict__ x_scale, bf16* __restrict__ out, int n,
                                              int inter) {
    const int t = blockIdx.y, c = 8 * (blockIdx.x * FP8_SCALE_THREADS + threadIdx.x);
    if (t >= n || c >= inter) return;
    const size_t row = (size_t)t * 2 * inter;
    const uint4 gv = *reinterpret_cast<const uint4*>(d + row + c);
    const uint4 uv = *reinterpret_cast<const uint4*>(d + row + inter + c);
    const float4 g0 = *reinterpret_cast<const float4*>(w_scale + c);
    const float4 g1 = *reinterpret_cast<const float4*>(w_scale + c + 4);
    const float4 u0 = *reinterpret_cast<const float4*>(w_scale + inter + c);
    const float4 u1 = *reinterpret_cast<const float4*>(w_scale + inter + c + 4);
    const float xs = x_scale[t];
    const unsigned gw[4] = {gv.x, gv.y, gv.z, gv.w}, uw[4] = {uv.x, uv.y, uv.z, uv.w};
    const float gs[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
    const float us[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
    unsigned o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float ga = bf2f(f2bf(__uint_as_float(gw[i] << 16) * gs[2 * i] * xs));
        const float gb = bf2f(f2bf(__uint_as_float(gw[i] & 0xffff0000u) * gs[2 * i + 1] * xs));
        const float ua = bf2f(f2bf(__uint_as_float(uw[i] << 16) * us[2 * i] * xs));
        const float ub = bf2f(f2bf(__uint_as_float(uw[i] & 0xffff0000u) * us[2 * i + 1] * xs));
        o[i] = (unsigned)f2bf(Act(ga) * ua) | ((unsigned)f2bf(Act(gb) * ub) << 16);
    }
    *reinterpret_cast<uint4*>(out + (size_t)t * inter + c) = make_uint4(o[0], o[1], o[2], o[3]);
}
extern "C" __global__ void __launch_bounds__(FP8_SCALE_THREADS) fp8_scale_silu_bf16(
    const bf16* __restrict__ d, const float* __restrict__ w_scale, const float* __restrict__ x_scale,
    bf16* __restrict__ out, int n, int inter) {
    wait_for_prior_kernels();
    fp8_scale_glu<silu>(d, w_scale, x_scale, out, n, inter);
}
extern "C" __global__ void __launch_bounds__(FP8_SCALE_THREADS) fp8_scale_gelu_tanh_bf16(
    const bf16* __restrict__ d, const float* __restrict__ w_scale, const float* __restrict__ x_scale,
    bf16* __restrict__ out, int n, int inter) {
    wait_for_prior_kernels();
    fp8_scale_glu<gelu_tanh>(d, w_scale, x_scale, out, n, inter);
}

