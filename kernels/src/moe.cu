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

// Token t's routing by one warp: softmax over its E router logits (f32: a bf16 product would
// turn near ties into different experts than the model's), the k largest (ties to the lower
// expert), weights renormalised over the k when `norm`.
//   logits : device, f32 [n, E];  ids : device, i32 [n, k];  weights : device, f32 [n, k]
// E ≤ MOE_MAX_EXPERTS, k ≤ E (checked by the host).
__device__ __forceinline__ void route_token(const float* __restrict__ logits, int* __restrict__ ids,
                                            float* __restrict__ weights, int t, int E, int k, int norm) {
    const int lane = threadIdx.x & 31;
    constexpr int PER = MOE_MAX_EXPERTS / 32;
    const float* l = logits + (size_t)t * E;
    const float neg_inf = __int_as_float(0xff800000u);
    float p[PER];
    float m = neg_inf;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int e = lane + 32 * i;
        p[i] = e < E ? l[e] : neg_inf;
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

// One warp per token: route_token over an [n, E] logits matrix.
extern "C" __global__ void moe_route_f32(const float* __restrict__ logits, int* __restrict__ ids,
                                          float* __restrict__ weights, int n, int E, int k, int norm) {
    wait_for_prior_kernels();
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= n) return;
    route_token(logits, ids, weights, t, E, k, norm);
}

// ---- Few rows: expert GEMVs ----

// act[p, j] = silu(g) · u for every (token, slot) pair p = t·k + s, with expert e = ids[p]:
// g = x[t] · W[e·2·inter + j, :], u = x[t] · W[e·2·inter + inter + j, :], each rounded to bf16
// first (as gemv_norm_glu). Grid (n·k, ⌈inter / warps⌉): a warp per output row of a pair.
//   w : device, bf16 or e4m3 [E · 2 · inter, h];  w_scale : device, f32 [E · 2 · inter] (e4m3)
//   or null;  x : device, bf16 [n, h];  ids : device, i32 [n · k];  act : device, bf16
//   [n · k, inter]
template <bool F8>
__device__ __forceinline__ void moe_gate_up_expert(const void* __restrict__ w, const float* __restrict__ w_scale,
                                                   const bf16* __restrict__ x, int e, bf16* __restrict__ act,
                                                   int inter, int h, int k) {
    const int p = blockIdx.x;
    const int j = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (j >= inter) return;
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
// experts' down projections, weighted and summed (in slot order, f32), into bf16. The k slots of
// an output row go to k neighbouring warps (kp = k rounded up to a power of two, ≤ MOE_MAX_K),
// so every slot's row streams at once; a block of MOE_MAX_K warps takes MOE_MAX_K / kp rows and
// sums their slots through shared memory. Grid (n, ⌈h / (MOE_MAX_K / kp)⌉), MOE_MAX_K warps a
// block.
//   w : device, bf16 or e4m3 [E · h, inter];  w_scale : device, f32 [E · h] (e4m3) or null;
//   act : device, bf16 [n · k, inter];  ids, weights : device, [n · k];  y : device, bf16 [n, h]
template <bool F8>
__device__ __forceinline__ void moe_down(const void* __restrict__ w, const float* __restrict__ w_scale,
                                         const bf16* __restrict__ act, const int* __restrict__ ids,
                                         const float* __restrict__ weights, bf16* __restrict__ y, int h, int inter,
                                         int k, int kp) {
    __shared__ float part[MOE_MAX_K];
    const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int per_block = MOE_MAX_K / kp;
    const int j = blockIdx.y * per_block + warp / kp, s = warp % kp;
    float v = 0.f;
    if (j < h && s < k) {
        const int p = t * k + s;
        const size_t row = (size_t)ids[p] * h + j;
        float acc[1] = {0.f};
        row_dot<1, F8>(weight_row<F8>(w, (int)row, inter), reinterpret_cast<const uint4*>(act + (size_t)p * inter),
                       row_units<F8>(inter), 1, acc);
        v = weights[p] * bf2f(f2bf(warp_sum(acc[0]) * (F8 ? w_scale[row] : 1.f)));
    }
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (threadIdx.x < per_block) {
        const int jj = blockIdx.y * per_block + threadIdx.x;
        float out = 0.f;
        for (int q = 0; q < k; ++q) out += part[threadIdx.x * kp + q];
        if (jj < h) y[(size_t)t * h + jj] = f2bf(out);
    }
}

#define MOE_GATE_UP_KERNEL(name, F8)                                                                  \
    extern "C" __global__ void name(const void* __restrict__ w, const float* __restrict__ w_scale,    \
                                    const bf16* __restrict__ x, const int* __restrict__ ids,          \
                                    bf16* __restrict__ act, int inter, int h, int k) {                \
        wait_for_prior_kernels();                                                                     \
        moe_gate_up_expert<F8>(w, w_scale, x, ids[blockIdx.x], act, inter, h, k);                     \
    }
#define MOE_DOWN_KERNEL(name, F8)                                                                     \
    extern "C" __global__ void name(const void* __restrict__ w, const float* __restrict__ w_scale,    \
                                    const bf16* __restrict__ act, const int* __restrict__ ids,        \
                                    const float* __restrict__ weights, bf16* __restrict__ y, int h,   \
                                    int inter, int k, int kp) {                                       \
        wait_for_prior_kernels();                                                                     \
        moe_down<F8>(w, w_scale, act, ids, weights, y, h, inter, k, kp);                              \
    }
MOE_GATE_UP_KERNEL(moe_gate_up_bf16, false)
MOE_GATE_UP_KERNEL(moe_gate_up_e4m3, true)
MOE_DOWN_KERNEL(moe_down_bf16, false)
MOE_DOWN_KERNEL(moe_down_e4m3, true)
// ---- Grouped GEMMs for steps of many tokens (prefill, large decode batches) ----
// The (token, slot) pairs are sorted by expert on the device (moe_sort: a counting sort, each
// expert's run padded to whole tiles of 64 or 128 rows, -1 marking the padding), then one launch
// per projection multiplies every tile by its expert's weights with mma.sync m16n8k16 (bf16 in,
// f32 accumulate): a tile's rows are gathered from the input as they are copied to shared
// memory (cp.async, three k-steps in flight), and the products are written back to each pair's
// own row. So every touched expert's weights are read once per row tile, not once per token.
// FP8 experts (e4m3 codes, a scale a row) are read as codes and widened in shared memory
// (gemv.cu's e4m3x16_bf16).

#define MOE_BN 128
#define MOE_BK 32
#define MOE_BK8 64  // the FP8 × FP8 kernels' k step: 64 codes, the same 64 bytes a row as bf16's 32
#define MOE_SK 40  // shared-memory row stride in bf16 (80 bytes: ldmatrix rows hit distinct banks)
#define MOE_STAGES 3

// D += A · B for one m16n8k32 tile with e4m3 inputs and f32 accumulators (sm_89+): A 16 × 32
// row-major, B 32 × 8 column-major. A register holds four codes where the bf16 MMA's holds two
// values, so ldmatrix's 8 × 8 b16 matrices (8 rows of 16 bytes) load the fragments unchanged:
// lane l gets row l / 4, bytes 4·(l % 4) .. + 3 of each matrix, which is where m16n8k32 wants
// A's and B's codes. The host takes this path only on sm_89+.
__device__ __forceinline__ void mma_e4m3(float* c, const unsigned* a, const unsigned* b) {
#if __CUDA_ARCH__ >= 890
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap();
#endif
}

// One block: count the pairs of each expert, lay the experts' runs out in whole tiles of `bm`
// rows, scatter every pair into its expert's run.
//   ids : device, i32 [pairs] (each < E);  sorted : device, i32 [cap] (pair index or -1);
//   tile_expert : device, i32 [cap / bm];  num_tiles : device, i32 [1]
// cap ≥ pairs + E·(bm − 1), a multiple of bm (checked by the host); E ≤ MOE_MAX_EXPERTS.
extern "C" __global__ void moe_sort(const int* __restrict__ ids, int* __restrict__ sorted, int* __restrict__ tile_expert,
                                    int* __restrict__ num_tiles, int pairs, int E, int cap, int bm) {
    wait_for_prior_kernels();
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
            const int tiles = (count[e] + bm - 1) / bm;
            for (int t = 0; t < tiles; ++t) tile_expert[off / bm + t] = e;
            off += tiles * bm;
        }
        num_tiles[0] = off / bm;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) sorted[atomicAdd(&cursor[ids[p]], 1)] = p;
}

// out[pair, j] = a[pair / a_div, :] · W[e·N + j, :] for every pair of every BM-row tile (e its
// expert), j < N, into bf16. Warps of min(BM, 64) rows × 32 columns (up to 4 m16 × 4 n8 tiles):
// max(BM / 64, 1) × 4 of them (BM = 16: decode steps with a few pairs an expert, a quarter of
// the tensor-core work and shared memory of 64-row tiles). MOE_STAGES k-steps in flight (cp.async), dynamic shared memory moe_gemm_smem_bytes.
// Grid (max_tiles, ⌈N / MOE_BN⌉); tiles past num_tiles return.
//   a : device, bf16 [rows, K] (MODE 2: e4m3 codes, a_scale f32 [rows]);  w : device, bf16 or e4m3 codes [E·N, K];
//   w_scale : device, f32 [E·N] (e4m3: W's row j is e4m3(codes[j]) · w_scale[j]; else unused);
//   out : device, bf16 [pairs, N]
// K % MOE_BK == 0, N % 8 == 0 (checked by the host). MODE 0: bf16 weights. MODE 1 (e4m3
// weights): each k-step's codes are copied as they are (half the bytes of bf16), widened to bf16
// in shared memory by the block (exact), and the row scales applied to the accumulators on the
// way out. MODE 2 (e4m3 weights and inputs: `a` holds e4m3 codes with a scale a row, a_scale,
// as quantize_act_rows_e4m3 writes them; K % MOE_BK8 == 0, sm_89+): the codes of both go to
// shared memory as they are, k-steps of MOE_BK8 codes (the same 64 bytes a row as bf16's k-step,
// so the same layout, copies and ldmatrix addresses), multiplied by FP8 tensor-core MMAs
// (mma_e4m3: twice the k of bf16's a instruction, nothing widened), both scales applied on the
// way out.
template <int BM, int MODE>
__device__ __forceinline__ void moe_gemm(const void* __restrict__ av, const float* __restrict__ a_scale,
                                         const void* __restrict__ wv, const float* __restrict__ w_scale,
                                         const int* __restrict__ sorted, const int* __restrict__ tile_expert,
                                         const int* __restrict__ num_tiles, bf16* __restrict__ out, int N, int K,
                                         int a_div) {
    constexpr bool F8 = MODE == 1, Q8 = MODE == 2;
    constexpr int KSTEP = Q8 ? MOE_BK8 : MOE_BK;  // elements of a k-step (64 bytes a row of A)
    const bf16* a = static_cast<const bf16*>(av);
    constexpr int WM = BM < 64 ? BM : 64;  // rows a warp covers
    constexpr int MI = WM / 16;            // its m16 tiles
    constexpr int THREADS = BM / WM * 4 * 32;
    const int tile = blockIdx.x;
    if (tile >= num_tiles[0]) return;
    extern __shared__ __align__(16) bf16 moe_smem[];
    bf16* sa = moe_smem;                              // [STAGES][BM * SK]
    bf16* sb = moe_smem + MOE_STAGES * BM * MOE_SK;   // [STAGES][BN * SK]; F8: [BN * SK], widened
    unsigned char* sq = reinterpret_cast<unsigned char*>(sb + MOE_BN * MOE_SK);  // F8: [STAGES][BN * BK]
    __shared__ int rows[BM];
    const int e = tile_expert[tile];
    const int n0 = blockIdx.y * MOE_BN;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    for (int r = tid; r < BM; r += THREADS) rows[r] = sorted[tile * BM + r];
    __syncthreads();
    // One k-step's copies: BM + MOE_BN rows of four 16-byte chunks (F8: the weights' rows two);
    // padding rows and columns past N are zero-filled.
    auto load = [&](int stage, int k0) {
        bf16* A = sa + stage * BM * MOE_SK;
#pragma unroll
        for (int c = 0; c < (BM * 4 + THREADS - 1) / THREADS; ++c) {
            const int idx = tid + c * THREADS, r = idx >> 2, ch = idx & 3;
            if (BM * 4 % THREADS != 0 && idx >= BM * 4) break;
            const int p = rows[r];
            // Row p / a_div's 16-byte chunk ch of the k-step (eight bf16 or sixteen codes).
            const size_t row = (size_t)(p < 0 ? 0 : p / a_div) * K + k0;
            if constexpr (Q8)
                cp_async16(A + r * MOE_SK + ch * 8, static_cast<const fp8*>(av) + row + ch * 16, p < 0 ? 0 : 16);
            else
                cp_async16(A + r * MOE_SK + ch * 8, a + row + ch * 8, p < 0 ? 0 : 16);
        }
        if (F8) {
            const fp8* w = static_cast<const fp8*>(wv);
            unsigned char* Q = sq + stage * MOE_BN * MOE_BK;
#pragma unroll
            for (int c = 0; c < MOE_BN * 2 / THREADS; ++c) {
                const int idx = tid + c * THREADS, r = idx >> 1, ch = idx & 1;
                const int n = n0 + r;
                const fp8* src = w + ((size_t)e * N + (n < N ? n : 0)) * K + k0 + ch * 16;
                cp_async16(Q + r * MOE_BK + ch * 16, src, n < N ? 16 : 0);
            }
        } else {
            // bf16 weights, or (Q8) the weights' codes straight into the stage: 64 bytes a row
            // either way.
            bf16* B = sb + stage * MOE_BN * MOE_SK;
#pragma unroll
            for (int c = 0; c < MOE_BN * 4 / THREADS; ++c) {
                const int idx = tid + c * THREADS, r = idx >> 2, ch = idx & 3;
                const size_t row = ((size_t)e * N + (n0 + r < N ? n0 + r : 0)) * K + k0;
                if constexpr (Q8)
                    cp_async16(B + r * MOE_SK + ch * 8, static_cast<const fp8*>(wv) + row + ch * 16, n0 + r < N ? 16 : 0);
                else
                    cp_async16(B + r * MOE_SK + ch * 8, static_cast<const bf16*>(wv) + row + ch * 8, n0 + r < N ? 16 : 0);
            }
        }
    };
    const int wm = (warp >> 2) * WM, wn = (warp & 3) * 32;
    float acc[MI][4][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;
    const int steps = K / KSTEP;
#pragma unroll
    for (int s = 0; s < MOE_STAGES - 1; ++s) {
        if (s < steps) load(s, s * KSTEP);
        cp_async_commit();
    }
    for (int s = 0; s < steps; ++s) {
        // Step s's copies are done once at most MOE_STAGES − 2 newer groups are pending.
        asm volatile("cp.async.wait_group %0;\n" ::"n"(MOE_STAGES - 2));
        __syncthreads();
        // Refill the stage every warp finished with (step s − 1's).
        if (s + MOE_STAGES - 1 < steps) load((s + MOE_STAGES - 1) % MOE_STAGES, (s + MOE_STAGES - 1) * KSTEP);
        cp_async_commit();
        const bf16* A = sa + (s % MOE_STAGES) * BM * MOE_SK;
        const bf16* B = sb + (F8 ? 0 : (s % MOE_STAGES) * MOE_BN * MOE_SK);
        if (F8) {
            // Widen step s's codes (every warp is past step s − 1's reads of the bf16 tile).
            const unsigned char* Q = sq + (s % MOE_STAGES) * MOE_BN * MOE_BK;
#pragma unroll
            for (int c = 0; c < MOE_BN * 2 / THREADS; ++c) {
                const int idx = tid + c * THREADS, r = idx >> 1, ch = idx & 1;
                e4m3x16_bf16(*reinterpret_cast<const uint4*>(Q + r * MOE_BK + ch * 16), 1.f,
                             reinterpret_cast<uint4*>(sb + r * MOE_SK + ch * 16));
            }
            __syncthreads();
        }
        // Two MMA k-steps of 32 bytes a row: 16 bf16 (m16n8k16) or 32 codes (m16n8k32); kk
        // counts bf16-sized units of the shared rows either way.
#pragma unroll
        for (int kk = 0; kk < MOE_BK; kk += 16) {
            unsigned af[MI][4], bfr[4][2];
#pragma unroll
            for (int i = 0; i < MI; ++i)
                ldmatrix_x4(af[i], A + (wm + i * 16 + (lane & 15)) * MOE_SK + kk + (lane >> 4) * 8);
#pragma unroll
            for (int j = 0; j < 4; j += 2) {
                unsigned r[4];
                ldmatrix_x4(r, B + (wn + j * 8 + (lane & 7) + (lane >> 4) * 8) * MOE_SK + kk + ((lane >> 3) & 1) * 8);
                bfr[j][0] = r[0];
                bfr[j][1] = r[1];
                bfr[j + 1][0] = r[2];
                bfr[j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    if constexpr (Q8)
                        mma_e4m3(acc[i][j], af[i], bfr[j]);
                    else
                        mma_bf16(acc[i][j], af[i], bfr[j]);
                }
        }
    }
    // C fragment: c0, c1 at (row lane / 4, columns 2·(lane % 4) + 0, 1), c2, c3 eight rows down.
    float sc[4][2];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int n = n0 + wn + j * 8 + 2 * (lane & 3);
        const bool scaled = (F8 || Q8) && n < N;
        sc[j][0] = scaled ? w_scale[(size_t)e * N + n] : 1.f;
        sc[j][1] = scaled ? w_scale[(size_t)e * N + n + 1] : 1.f;
    }
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int p = rows[wm + i * 16 + (lane >> 2) + half * 8];
            if (p < 0) continue;
            const float as = Q8 ? a_scale[p / a_div] : 1.f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int n = n0 + wn + j * 8 + 2 * (lane & 3);
                if (n < N)
                    *reinterpret_cast<unsigned*>(out + (size_t)p * N + n) =
                        pack_bf16(acc[i][j][2 * half] * sc[j][0] * as, acc[i][j][2 * half + 1] * sc[j][1] * as);
            }
        }
}

#define MOE_GEMM_KERNEL(name, BM, MODE)                                                               \
    extern "C" __global__ void __launch_bounds__(BM < 64 ? 128 : BM / 64 * 128)                       \
        name(const bf16* __restrict__ a, const void* __restrict__ w, const float* __restrict__ w_scale, \
             const int* __restrict__ sorted, const int* __restrict__ tile_expert,                     \
             const int* __restrict__ num_tiles, bf16* __restrict__ out, int N, int K, int a_div) {     \
        wait_for_prior_kernels();                                                                     \
        moe_gemm<BM, MODE>(a, nullptr, w, w_scale, sorted, tile_expert, num_tiles, out, N, K, a_div); \
    }
MOE_GEMM_KERNEL(moe_gemm_bm16_bf16, 16, 0)
MOE_GEMM_KERNEL(moe_gemm_bm64_bf16, 64, 0)
MOE_GEMM_KERNEL(moe_gemm_bm128_bf16, 128, 0)
MOE_GEMM_KERNEL(moe_gemm_bm16_e4m3, 16, 1)
MOE_GEMM_KERNEL(moe_gemm_bm64_e4m3, 64, 1)
MOE_GEMM_KERNEL(moe_gemm_bm128_e4m3, 128, 1)

// The FP8 × FP8 instantiations (MODE 2): `a` e4m3 codes [rows, K] with `a_scale` f32 [rows].
#define MOE_GEMM_F8F8_KERNEL(name, BM)                                                                \
    extern "C" __global__ void __launch_bounds__(BM < 64 ? 128 : BM / 64 * 128)                       \
        name(const fp8* __restrict__ a, const float* __restrict__ a_scale, const void* __restrict__ w, \
             const float* __restrict__ w_scale, const int* __restrict__ sorted,                       \
             const int* __restrict__ tile_expert, const int* __restrict__ num_tiles,                  \
             bf16* __restrict__ out, int N, int K, int a_div) {                                       \
        wait_for_prior_kernels();                                                                     \
        moe_gemm<BM, 2>(a, a_scale, w, w_scale, sorted, tile_expert, num_tiles, out, N, K, a_div);    \
    }
MOE_GEMM_F8F8_KERNEL(moe_gemm_bm16_f8f8, 16)
MOE_GEMM_F8F8_KERNEL(moe_gemm_bm64_f8f8, 64)

// y[t, :] = Σ_s weights[t·k + s] · yp[t·k + s, :] in slot order (f32), into bf16: the weighted
// sum of a token's expert outputs. Grid-stride over n · h.
//   yp : device, bf16 [n·k, h];  weights : device, f32 [n·k];  y : device, bf16 [n, h]
extern "C" __global__ void moe_combine_bf16(const bf16* __restrict__ yp, const float* __restrict__ weights,
                                            bf16* __restrict__ y, int n, int k, int h) {
    wait_for_prior_kernels();
    const size_t total = (size_t)n * h;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / h, j = i % h;
        float s = 0.f;
        for (int q = 0; q < k; ++q) s += weights[t * k + q] * bf2f(yp[(t * k + q) * h + j]);
        y[i] = f2bf(s);
    }
}
