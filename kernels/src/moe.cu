// Mixture-of-experts MLPs (backend/src/device/moe.rs), all on the device — routing, grouping and
// the experts' products — so nothing goes back to the host and decode graphs hold whole layers.
// Two paths, chosen by the host on the step's rows:
//   - few rows (decode): the chosen experts' weight rows streamed per (token, slot) pair with
//     gemv.cu's warp-per-row dot products: only the selected experts are read;
//   - many rows (prefill, large batches): the pairs sorted by expert (a counting sort padded to
//     whole tiles), then grouped GEMMs with mma.sync (attention_mma.cu's helpers): each touched
//     expert is read once per tile column, whatever its number of tokens.
// This unit follows gemv.cu and attention_mma.cu in the one translation unit (kernels/src/lib.rs).
#include "common.cuh"

#define MOE_MAX_EXPERTS 512
#define MOE_MAX_K 8

// One warp per token: softmax over the E router logits (bf16, as the router's product is in the
// model's type; f32 from there), the k largest (ties to the lower expert), weights renormalised
// over the k when `norm`.
//   logits : device, bf16 [n, E];  ids : device, i32 [n, k];  weights : device, f32 [n, k]
// E ≤ MOE_MAX_EXPERTS, k ≤ E (checked by the host).
extern "C" __global__ void moe_route_bf16(const bf16* __restrict__ logits, int* __restrict__ ids,
                                          float* __restrict__ weights, int n, int E, int k, int norm) {
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (t >= n) return;
    constexpr int PER = MOE_MAX_EXPERTS / 32;
    const bf16* l = logits + (size_t)t * E;
    const float neg_inf = __int_as_float(0xff800000u);
    float p[PER];
    float m = neg_inf;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int e = lane + 32 * i;
        p[i] = e < E ? bf2f(l[e]) : neg_inf;
        m = fmaxf(m, p[i]);
    }
    m = warp_max(m);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int e = lane + 32 * i;
        p[i] = e < E ? __expf(p[i] - m) : -1.f;
        if (e < E) s += p[i];
    }
    s = warp_sum(s);
    float chosen_sum = 0.f;
    for (int j = 0; j < k; ++j) {
        // This lane's best, then the warp's: the largest probability, the lower index on ties.
        float bv = -1.f;
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < PER; ++i)
            if (p[i] > bv) {
                bv = p[i];
                bi = lane + 32 * i;
            }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
#pragma unroll
        for (int i = 0; i < PER; ++i)
            if (lane + 32 * i == bi) p[i] = -1.f;
        if (lane == 0) {
            ids[(size_t)t * k + j] = bi;
            weights[(size_t)t * k + j] = bv / s;
        }
        chosen_sum += bv / s;
    }
    if (norm && lane == 0)
        for (int j = 0; j < k; ++j) weights[(size_t)t * k + j] /= chosen_sum;
}

// ---- Few rows: expert GEMVs ----

// act[p, j] = silu(g) · u for every (token, slot) pair p = t·k + s, with expert e = ids[p]:
// g = x[t] · W[e·2·inter + j, :], u = x[t] · W[e·2·inter + inter + j, :], each rounded to bf16
// first (as gemv_norm_glu). Grid (n·k, ⌈inter / warps⌉): a warp per output row of a pair.
//   w : device, bf16 or e4m3 [E · 2 · inter, h];  w_scale : device, f32 [E · 2 · inter] (e4m3)
//   or null;  x : device, bf16 [n, h];  ids : device, i32 [n · k];  act : device, bf16
//   [n · k, inter]
template <bool F8>
__device__ __forceinline__ void moe_gate_up(const void* __restrict__ w, const float* __restrict__ w_scale,
                                            const bf16* __restrict__ x, const int* __restrict__ ids,
                                            bf16* __restrict__ act, int inter, int h, int k) {
    const int p = blockIdx.x;
    const int j = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (j >= inter) return;
    const int e = ids[p];
    const size_t gate_row = (size_t)e * 2 * inter + j, up_row = gate_row + inter;
    const uint4* xr = reinterpret_cast<const uint4*>(x + (size_t)(p / k) * h);
    float g[1] = {0.f}, u[1] = {0.f};
    row_dot2<1, F8>(weight_row<F8>(w, (int)gate_row, h), weight_row<F8>(w, (int)up_row, h), xr,
                    row_units<F8>(h), g, u);
    const float gsc = F8 ? w_scale[gate_row] : 1.f, usc = F8 ? w_scale[up_row] : 1.f;
    const float gs = bf2f(f2bf(warp_sum(g[0]) * gsc)), us = bf2f(f2bf(warp_sum(u[0]) * usc));
    if ((threadIdx.x & 31) == 0) act[(size_t)p * inter + j] = f2bf(silu(gs) * us);
}

// y[t, j] = Σ_s weights[t·k + s] · bf16(act[t·k + s] · W[ids[t·k + s]·h + j, :]): the chosen
// experts' down projections, weighted and summed (in slot order, f32), into bf16. A warp takes
// output row j of a token over all its k slots at once — the k rows as one run of 16-byte
// units, GEMV_UNROLL loads in flight per lane whatever the slot — with a sum per slot. Grid
// (n, ⌈h / warps⌉). k ≤ MOE_MAX_K.
//   w : device, bf16 or e4m3 [E · h, inter];  w_scale : device, f32 [E · h] (e4m3) or null;
//   act : device, bf16 [n · k, inter];  ids, weights : device, [n · k];  y : device, bf16 [n, h]
template <bool F8>
__device__ __forceinline__ void moe_down(const void* __restrict__ w, const float* __restrict__ w_scale,
                                         const bf16* __restrict__ act, const int* __restrict__ ids,
                                         const float* __restrict__ weights, bf16* __restrict__ y, int h, int inter,
                                         int k) {
    const int t = blockIdx.x;
    const int j = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (j >= h) return;
    const int ku = row_units<F8>(inter), total = k * ku;
    const uint4* rows[MOE_MAX_K];
    const uint4* xs[MOE_MAX_K];
#pragma unroll
    for (int s = 0; s < MOE_MAX_K; ++s) {
        const int p = t * k + (s < k ? s : 0);
        rows[s] = weight_row<F8>(w, (int)((size_t)ids[p] * h + j), inter);
        xs[s] = reinterpret_cast<const uint4*>(act + (size_t)p * inter);
    }
    float acc[MOE_MAX_K];
#pragma unroll
    for (int s = 0; s < MOE_MAX_K; ++s) acc[s] = 0.f;
    for (int i0 = lane; i0 < total; i0 += 32 * GEMV_UNROLL) {
        uint4 wv[GEMV_UNROLL];
        int slot[GEMV_UNROLL], unit[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int i = i0 + 32 * u;
            slot[u] = i < total ? i / ku : -1;
            unit[u] = i - (slot[u] < 0 ? 0 : slot[u]) * ku;
            const uint4* r = rows[0];
#pragma unroll
            for (int s = 1; s < MOE_MAX_K; ++s)
                if (slot[u] == s) r = rows[s];
            if (slot[u] >= 0) wv[u] = load_stream(r + unit[u]);
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u)
#pragma unroll
            for (int s = 0; s < MOE_MAX_K; ++s)
                if (slot[u] == s) acc[s] = dot_unit<F8>(wv[u], xs[s], unit[u], acc[s]);
    }
    float out = 0.f;
#pragma unroll
    for (int s = 0; s < MOE_MAX_K; ++s) {
        if (s >= k) break;
        const int p = t * k + s;
        const float sc = F8 ? w_scale[(size_t)ids[p] * h + j] : 1.f;
        out += weights[p] * bf2f(f2bf(warp_sum(acc[s]) * sc));
    }
    if (lane == 0) y[(size_t)t * h + j] = f2bf(out);
}

#define MOE_GEMV_KERNELS(fmt, F8)                                                                     \
    extern "C" __global__ void moe_gate_up_##fmt(const void* __restrict__ w, const float* __restrict__ w_scale, \
                                                 const bf16* __restrict__ x, const int* __restrict__ ids,   \
                                                 bf16* __restrict__ act, int inter, int h, int k) {          \
        moe_gate_up<F8>(w, w_scale, x, ids, act, inter, h, k);                                        \
    }                                                                                                 \
    extern "C" __global__ void moe_down_##fmt(const void* __restrict__ w, const float* __restrict__ w_scale, \
                                              const bf16* __restrict__ act, const int* __restrict__ ids,     \
                                              const float* __restrict__ weights, bf16* __restrict__ y, int h, \
                                              int inter, int k) {                                     \
        moe_down<F8>(w, w_scale, act, ids, weights, y, h, inter, k);                                  \
    }
MOE_GEMV_KERNELS(bf16, false)
MOE_GEMV_KERNELS(e4m3, true)
// ---- Grouped GEMMs for steps of many tokens (prefill, large decode batches) ----
// The (token, slot) pairs are sorted by expert on the device (moe_sort: a counting sort, each
// expert's run padded to whole MOE_BM-row tiles, -1 marking the padding), then one launch per
// projection multiplies every tile by its expert's weights with mma.sync m16n8k16 (bf16 in, f32
// accumulate): a tile's rows are gathered from the input as they are copied to shared memory
// (cp.async, double-buffered), and the products are written back to each pair's own row. So the
// weights of every touched expert are read once per tile row block, not once per token.

#define MOE_BM 64
#define MOE_BN 128
#define MOE_BK 32
#define MOE_SK 40  // shared-memory row stride in bf16 (80 bytes: ldmatrix rows hit distinct banks)
#define MOE_GEMM_THREADS 128

// One block: count the pairs of each expert, lay the experts' runs out in whole tiles, scatter
// every pair into its expert's run.
//   ids : device, i32 [pairs] (each < E);  sorted : device, i32 [cap] (pair index or -1);
//   tile_expert : device, i32 [max_tiles];  num_tiles : device, i32 [1]
// cap ≥ pairs + E·(MOE_BM − 1) and max_tiles ≥ cap / MOE_BM (checked by the host); E ≤
// MOE_MAX_EXPERTS.
extern "C" __global__ void moe_sort(const int* __restrict__ ids, int* __restrict__ sorted, int* __restrict__ tile_expert,
                                    int* __restrict__ num_tiles, int pairs, int E, int cap) {
    __shared__ int count[MOE_MAX_EXPERTS], cursor[MOE_MAX_EXPERTS];
    for (int e = threadIdx.x; e < E; e += blockDim.x) count[e] = 0;
    for (int i = threadIdx.x; i < cap; i += blockDim.x) sorted[i] = -1;
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&count[ids[p]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int off = 0;
        for (int e = 0; e < E; ++e) {
            cursor[e] = off;
            const int tiles = (count[e] + MOE_BM - 1) / MOE_BM;
            for (int t = 0; t < tiles; ++t) tile_expert[off / MOE_BM + t] = e;
            off += tiles * MOE_BM;
        }
        num_tiles[0] = off / MOE_BM;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) sorted[atomicAdd(&cursor[ids[p]], 1)] = p;
}

// out[pair, j] = a[pair / a_div, :] · W[e·N + j, :] for every pair of every tile (e its expert),
// j < N, into bf16. Grid (max_tiles, ⌈N / MOE_BN⌉); tiles past num_tiles return at once.
//   a : device, bf16 [rows, K];  w : device, bf16 [E·N, K];  out : device, bf16 [pairs, N]
// K % MOE_BK == 0, N % 8 == 0 (checked by the host).
extern "C" __global__ void __launch_bounds__(MOE_GEMM_THREADS)
    moe_gemm_bf16(const bf16* __restrict__ a, const bf16* __restrict__ w, const int* __restrict__ sorted,
                  const int* __restrict__ tile_expert, const int* __restrict__ num_tiles, bf16* __restrict__ out,
                  int N, int K, int a_div) {
    const int tile = blockIdx.x;
    if (tile >= num_tiles[0]) return;
    __shared__ __align__(16) bf16 sa[2][MOE_BM * MOE_SK];
    __shared__ __align__(16) bf16 sb[2][MOE_BN * MOE_SK];
    __shared__ int rows[MOE_BM];
    const int e = tile_expert[tile];
    const int n0 = blockIdx.y * MOE_BN;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid < MOE_BM) rows[tid] = sorted[tile * MOE_BM + tid];
    __syncthreads();
    // Loads of one k-tile: A 64 rows × 4 chunks of 16 bytes (2 per thread), B 128 rows × 4
    // chunks (4 per thread); padding rows and columns past N are zero-filled.
    auto load = [&](int stage, int k0) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int idx = tid + c * MOE_GEMM_THREADS, r = idx >> 2, ch = idx & 3;
            const int p = rows[r];
            const bf16* src = a + (size_t)(p < 0 ? 0 : p / a_div) * K + k0 + ch * 8;
            cp_async16(&sa[stage][r * MOE_SK + ch * 8], src, p < 0 ? 0 : 16);
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int idx = tid + c * MOE_GEMM_THREADS, r = idx >> 2, ch = idx & 3;
            const int n = n0 + r;
            const bf16* src = w + ((size_t)e * N + (n < N ? n : 0)) * K + k0 + ch * 8;
            cp_async16(&sb[stage][r * MOE_SK + ch * 8], src, n < N ? 16 : 0);
        }
        cp_async_commit();
    };
    // Warps 2 × 2: each 32 rows × 64 columns (2 m16 tiles × 8 n8 tiles).
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 64;
    float acc[2][8][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;
    const int steps = K / MOE_BK;
    load(0, 0);
    for (int s = 0; s < steps; ++s) {
        const int stage = s & 1;
        if (s + 1 < steps) {
            load(stage ^ 1, (s + 1) * MOE_BK);
            cp_async_wait1();
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();
        const bf16* A = sa[stage];
        const bf16* B = sb[stage];
#pragma unroll
        for (int kk = 0; kk < MOE_BK; kk += 16) {
            unsigned af[2][4], bfr[8][2];
#pragma unroll
            for (int i = 0; i < 2; ++i)
                ldmatrix_x4(af[i], A + (wm + i * 16 + (lane & 15)) * MOE_SK + kk + (lane >> 4) * 8);
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                unsigned r[4];
                ldmatrix_x4(r, B + (wn + j * 8 + (lane & 7) + (lane >> 4) * 8) * MOE_SK + kk + ((lane >> 3) & 1) * 8);
                bfr[j][0] = r[0];
                bfr[j][1] = r[1];
                bfr[j + 1][0] = r[2];
                bfr[j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) mma_bf16(acc[i][j], af[i], bfr[j]);
        }
        __syncthreads();
    }
    // C fragment: c0, c1 at (row lane / 4, columns 2·(lane % 4) + 0, 1), c2, c3 eight rows down.
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int p = rows[wm + i * 16 + (lane >> 2) + half * 8];
            if (p < 0) continue;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int n = n0 + wn + j * 8 + 2 * (lane & 3);
                if (n < N)
                    *reinterpret_cast<unsigned*>(out + (size_t)p * N + n) =
                        pack_bf16(acc[i][j][2 * half], acc[i][j][2 * half + 1]);
            }
        }
}

// y[t, :] = Σ_s weights[t·k + s] · yp[t·k + s, :] in slot order (f32), into bf16: the weighted
// sum of a token's expert outputs. Grid-stride over n · h.
//   yp : device, bf16 [n·k, h];  weights : device, f32 [n·k];  y : device, bf16 [n, h]
extern "C" __global__ void moe_combine_bf16(const bf16* __restrict__ yp, const float* __restrict__ weights,
                                            bf16* __restrict__ y, int n, int k, int h) {
    const size_t total = (size_t)n * h;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / h, j = i % h;
        float s = 0.f;
        for (int q = 0; q < k; ++q) s += weights[t * k + q] * bf2f(yp[(t * k + q) * h + j]);
        y[i] = f2bf(s);
    }
}
