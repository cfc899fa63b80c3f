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

// y[r, j] = rms_norm(residual[r] (+ delta'[r])) · W[j, :]; see norm_prologue.
//   residual : device, f32 [rows, k]; delta : device, bf16 [rows, k] or null;
//   delta_w : device, bf16 [k] or null; residual_out : device, f32 [rows, k] or null;
//   norm_w : device, bf16 [k]; w : device, bf16 or e4m3 [n, k]; w_scale : device, f32 [n]
//   (e4m3) or null; y : device, bf16 [rows, n]
template <int R, bool F8>
__device__ __forceinline__ void gemv_norm(const float* __restrict__ residual, const bf16* __restrict__ delta,
                                          const bf16* __restrict__ delta_w, float* __restrict__ residual_out,
                                          const bf16* __restrict__ norm_w, const void* __restrict__ w,
                                          const float* __restrict__ w_scale, bf16* __restrict__ y, int n, int k,
                                          int rows, float eps) {
    extern __shared__ uint4 gemv_xs[];
    prefetch_first(w, n, k * (F8 ? 1 : 2));
    norm_prologue<R>(residual, delta, delta_w, residual_out, norm_w, reinterpret_cast<bf16*>(gemv_xs), k, rows,
                     eps);
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
            if ((threadIdx.x & 31) == 0 && r < rows) y[(size_t)r * n + j] = f2bf(s);
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
        wait_for_prior_kernels();                                                                         \
        gemv_norm<R, F8>(residual, delta, delta_w, residual_out, norm_w, w, w_scale, y, n, k, rows, eps); \
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
extern "C" __global__ void rms_norm_e4m3(float* __restrict__ residual, const bf16* __restrict__ delta,
                                         const bf16* __restrict__ delta_w, const bf16* __restrict__ w,
                                         fp8* __restrict__ codes, float* __restrict__ scale, int cols, float eps) {
    wait_for_prior_kernels();
    const size_t row = blockIdx.x;
    float* rr = residual + row * cols;
    const bf16* dr = delta ? delta + row * cols : nullptr;
    float v[RMS_PER_THREAD], wv[RMS_PER_THREAD], y[RMS_PER_THREAD];
    const float inv = residual_row_regs<RMS_PER_THREAD>(rr, dr, delta_w, w, cols, eps, v, wv);
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

// w[j, :] = bf16(e4m3(codes[j, :]) · scale[j]): FP8 weights back to bf16 for the GEMMs of
// prefill steps. Grid-stride over n · k.
extern "C" __global__ void dequantize_rows_e4m3(const fp8* __restrict__ codes, const float* __restrict__ scale,
                                                bf16* __restrict__ w, int n, int k) {
    wait_for_prior_kernels();
    const size_t total = (size_t)n * k;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x)
        w[e] = f2bf(e4m3f(codes[e]) * scale[e / k]);
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
extern "C" __global__ void __launch_bounds__(FP8_SCALE_THREADS) fp8_scale_bf16_bf16(
    const bf16* __restrict__ d, const float* __restrict__ w_scale, const float* __restrict__ x_scale,
    bf16* __restrict__ out, int n, int m) {
    wait_for_prior_kernels();
    const int t = blockIdx.y, c = 8 * (blockIdx.x * FP8_SCALE_THREADS + threadIdx.x);
    if (t >= n || c >= m) return;
    const size_t e = (size_t)t * m + c;
    const uint4 v = *reinterpret_cast<const uint4*>(d + e);
    const float4 w0 = *reinterpret_cast<const float4*>(w_scale + c);
    const float4 w1 = *reinterpret_cast<const float4*>(w_scale + c + 4);
    const float xs = x_scale[t];
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


// ---- Products of a few rows on the tensor cores (CACHET_FP8_SKINNY, CACHET_BF16_SKINNY) ----
// raw[s][i][j] = Σ_{k in split s} x[i][k] · w[j][k] for n ≤ 64 token rows and m weight rows:
// F8, over e4m3 codes with unit scales (the scales are fp8_scale_*'s epilogue, as after cuBLASLt);
// else over bf16 values (the product itself). cuBLASLt's FP8 product of 16–64 rows takes 2.7–3.5×
// the time its weights take to stream (BENCHMARKS §12c). Here each weight byte goes from DRAM
// straight into registers once (as the GEMV does) — FP8 codes converted to f16 there, exactly —
// the tokens' chunk is staged in shared memory as 16-bit values (FP8 codes converted once a
// chunk), and mma.m16n8k16 (f16 or bf16, f32 sums) multiplies a warp's 16 weight rows (the MMA's
// M) by 8 tokens at a time (its N). (sm_90's mma.sync has no e4m3 form of its own: the PTX one
// compiles to conversions of both operands for every MMA. The conversions and mma_f16 / mma_bf16
// are attention_mma.cu's, a unit before.) A chunk is 128 bytes of each weight row (128 codes or
// 64 bf16); lane (g, t) loads bytes [16t, 16t + 16) of each 64-byte half of rows g and g + 8. The
// fragments want k = 2t, 2t+1 | 2t+8, 2t+9 of each 16 from lane (g, t); a dot product sums over
// k in any order, so both operands take the same permutation instead: MMA q of a half takes the
// lane's values 4q, 4q+1 | 4q+2, 4q+3 of those bytes — of the weights from its registers, of
// token g from shared memory at the same offsets. blockIdx.y splits k (k_split values each) when
// there are too few weight-row blocks to fill the GPU: split s writes its sums to raw + s · n · m
// (f32), skinny_sum_* adds the splits in order (deterministic: no atomics). OUT bf16: one
// split only (the raw product the fused gate|up epilogue takes, or a bf16 result).
//   w : device, e4m3 or bf16 [m, k];  x : device, e4m3 or bf16 [n, k];  raw : device, OUT [splits, n, m]
#define SKINNY_WARPS 8
#define SKINNY_CHUNK 128  // bytes of a weight row a chunk
template <bool F8, typename OUT, int NT>
__device__ __forceinline__ void skinny_gemm(const void* __restrict__ w_, const void* __restrict__ x_,
                                            OUT* __restrict__ raw, int m, int n, int k, int k_split) {
    constexpr int KC = F8 ? SKINNY_CHUNK : SKINNY_CHUNK / 2;  // values a chunk
    // A token's chunk in shared memory, 16-bit values padded so that a quarter-warp's 16-byte
    // reads (two tokens, four lanes each) fall in distinct banks.
    constexpr int XS = F8 ? KC + 8 : KC + 32;
    constexpr int MMAS = F8 ? 4 : 2;  // MMAs a half-chunk (16 bytes of a row: 16 codes or 8 bf16)
    __shared__ __align__(16) unsigned short xh[2][8 * NT * XS];
    const unsigned char* w = static_cast<const unsigned char*>(w_);
    const unsigned char* x = static_cast<const unsigned char*>(x_);
    constexpr int VB = F8 ? 1 : 2;  // bytes a value
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row = (blockIdx.x * SKINNY_WARPS + warp) * 16 + g;  // this lane's weight rows: row, row + 8
    const int kb = blockIdx.y * k_split, ke = min(k, kb + k_split);
    const bool in_a = row < m, in_b = row + 8 < m;
    const uint4* wa = reinterpret_cast<const uint4*>(w + (size_t)(in_a ? row : 0) * k * VB) + t;
    const uint4* wb = reinterpret_cast<const uint4*>(w + (size_t)(in_b ? row + 8 : 0) * k * VB) + t;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    // This thread's 16-byte units of the tokens' chunk (a token's chunk is 8 units).
    constexpr int XU = (8 * NT * 8 + SKINNY_WARPS * 32 - 1) / (SKINNY_WARPS * 32);
    auto tokens = [&](int k0, uint4 (&v)[XU]) {
#pragma unroll
        for (int i = 0; i < XU; ++i) {
            const int u = threadIdx.x + i * SKINNY_WARPS * 32, tok = u / 8;
            v[i] = tok < n ? *reinterpret_cast<const uint4*>(x + ((size_t)tok * k + k0) * VB + (u % 8) * 16) : zero;
        }
    };
    auto put = [&](const uint4 (&v)[XU], unsigned short* dst) {
#pragma unroll
        for (int i = 0; i < XU; ++i) {
            const int u = threadIdx.x + i * SKINNY_WARPS * 32, tok = u / 8;
            if (tok >= n) continue;
            if constexpr (F8) {
                const unsigned c[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
                unsigned h[8];
#pragma unroll
                for (int q = 0; q < 4; ++q) h[2 * q] = e4m3x2_f16x2(c[q] & 0xffffu), h[2 * q + 1] = e4m3x2_f16x2_hi(c[q]);
                uint4* d = reinterpret_cast<uint4*>(dst + tok * XS + (u % 8) * 16);
                d[0] = make_uint4(h[0], h[1], h[2], h[3]);
                d[1] = make_uint4(h[4], h[5], h[6], h[7]);
            } else {
                *reinterpret_cast<uint4*>(dst + tok * XS + (u % 8) * 8) = v[i];
            }
        }
    };
    // This lane's 16 bytes of each half of the chunk at k0: [half][row g | g + 8].
    auto weights = [&](int k0, uint4 (&a)[2][2]) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            a[h][0] = in_a ? load_stream(wa + (k0 * VB >> 4) + 4 * h) : zero;
            a[h][1] = in_b ? load_stream(wb + (k0 * VB >> 4) + 4 * h) : zero;
        }
    };
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    uint4 a[2][2], xv[XU];
    if (kb < ke) {
        weights(kb, a);
        tokens(kb, xv);
    }
    int buf = 0;
    for (int k0 = kb; k0 < ke; k0 += KC, buf ^= 1) {
        unsigned short* xb = xh[buf];
        put(xv, xb);
        uint4 next[2][2];
        const bool more = k0 + KC < ke;
        if (more) {  // in flight while this chunk multiplies
            weights(k0 + KC, next);
            tokens(k0 + KC, xv);
        }
        // The chunk's tokens are in stage buf. (It was last read two chunks ago, before the
        // previous pass's barrier.)
        __syncthreads();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            // The weights' A fragments of the half's MMAs: [q][a0..a3].
            unsigned af[MMAS][4];
            const unsigned ra[4] = {a[h][0].x, a[h][0].y, a[h][0].z, a[h][0].w};
            const unsigned rb[4] = {a[h][1].x, a[h][1].y, a[h][1].z, a[h][1].w};
#pragma unroll
            for (int q = 0; q < MMAS; ++q) {
                if constexpr (F8) {
                    af[q][0] = e4m3x2_f16x2(ra[q] & 0xffffu);
                    af[q][1] = e4m3x2_f16x2(rb[q] & 0xffffu);
                    af[q][2] = e4m3x2_f16x2_hi(ra[q]);
                    af[q][3] = e4m3x2_f16x2_hi(rb[q]);
                } else {
                    af[q][0] = ra[2 * q], af[q][1] = rb[2 * q], af[q][2] = ra[2 * q + 1], af[q][3] = rb[2 * q + 1];
                }
            }
            // Token 8j + g's values at this lane's offsets (16 for F8, 8 for bf16), MMAs 2p and
            // 2p + 1 a 16-byte read. NT is a constant, so the loops unroll whole and the
            // scheduler interleaves the tiles' independent accumulators.
#pragma unroll
            for (int p = 0; p < MMAS / 2; ++p) {
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const uint4 b =
                        reinterpret_cast<const uint4*>(xb + (8 * j + g) * XS + (KC / 2) * h + (MMAS * 4) * t)[p];
                    const unsigned b0[2] = {b.x, b.y}, b1[2] = {b.z, b.w};
                    if constexpr (F8) {
                        mma_f16(acc[j], af[2 * p], b0);
                        mma_f16(acc[j], af[2 * p + 1], b1);
                    } else {
                        mma_bf16(acc[j], af[2 * p], b0);
                        mma_bf16(acc[j], af[2 * p + 1], b1);
                    }
                }
            }
        }
        if (more) {
#pragma unroll
            for (int h = 0; h < 2; ++h) a[h][0] = next[h][0], a[h][1] = next[h][1];
        }
    }
    // C fragments: acc[j][0, 1] weight row `row`, tokens 8j + 2t, 8j + 2t + 1; [2, 3] row + 8.
    OUT* out = raw + (size_t)blockIdx.y * n * m;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = e < 2 ? row : row + 8, tok = 8 * j + 2 * t + (e & 1);
            if (r >= m || tok >= n) continue;
            if constexpr (sizeof(OUT) == 2)
                out[(size_t)tok * m + r] = f2bf(acc[j][e]);
            else
                out[(size_t)tok * m + r] = acc[j][e];
        }
    }
}
// One kernel for each tile count NT = ⌈n / 8⌉ rounded up to 1, 2, 4 or 8 (a tile's tokens past
// n are multiplied but never written).
#define SKINNY_KERNEL(NAME, F8, OUT, NT)                                                                     \
    extern "C" __global__ void __launch_bounds__(SKINNY_WARPS * 32, NT >= 8 ? 1 : 2) NAME(                    \
        const void* __restrict__ w, const void* __restrict__ x, OUT* __restrict__ raw, int m, int n, int k, \
        int k_split) {                                                                                       \
        wait_for_prior_kernels();                                                                            \
        skinny_gemm<F8, OUT, NT>(w, x, raw, m, n, k, k_split);                                               \
    }
#define SKINNY_KERNELS(NT)                                          \
    SKINNY_KERNEL(fp8_skinny_gemm_f32_t##NT, true, float, NT)      \
    SKINNY_KERNEL(fp8_skinny_gemm_bf16_t##NT, true, bf16, NT)      \
    SKINNY_KERNEL(bf16_skinny_gemm_f32_t##NT, false, float, NT)    \
    SKINNY_KERNEL(bf16_skinny_gemm_bf16_t##NT, false, bf16, NT)
SKINNY_KERNELS(1)
SKINNY_KERNELS(2)
SKINNY_KERNELS(4)
SKINNY_KERNELS(8)
// The splits' sums added in split order: out[e] = Σ_s parts[s · len + e] (f32 or bf16 out),
// four elements a thread (len % 4 == 0), grid-stride.
template <typename OUT>
__device__ __forceinline__ void skinny_sum(const float* __restrict__ parts, OUT* __restrict__ out, int splits,
                                               size_t len) {
    for (size_t q = blockIdx.x * (size_t)blockDim.x + threadIdx.x; q < len / 4; q += (size_t)gridDim.x * blockDim.x) {
        float4 s = reinterpret_cast<const float4*>(parts)[q];
        for (int p = 1; p < splits; ++p) {
            const float4 v = reinterpret_cast<const float4*>(parts + (size_t)p * len)[q];
            s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
        }
        if constexpr (sizeof(OUT) == 2) {
            const unsigned lo = (unsigned)f2bf(s.x) | ((unsigned)f2bf(s.y) << 16);
            const unsigned hi = (unsigned)f2bf(s.z) | ((unsigned)f2bf(s.w) << 16);
            reinterpret_cast<uint2*>(out)[q] = make_uint2(lo, hi);
        } else {
            reinterpret_cast<float4*>(out)[q] = s;
        }
    }
}
extern "C" __global__ void skinny_sum_f32(const float* __restrict__ parts, float* __restrict__ out, int splits,
                                              int len) {
    wait_for_prior_kernels();
    skinny_sum<float>(parts, out, splits, (size_t)len);
}
extern "C" __global__ void skinny_sum_bf16(const float* __restrict__ parts, bf16* __restrict__ out, int splits,
                                               int len) {
    wait_for_prior_kernels();
    skinny_sum<bf16>(parts, out, splits, (size_t)len);
}
