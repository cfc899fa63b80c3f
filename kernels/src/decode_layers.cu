// Every layer of a one-token decode step in one launch: a persistent kernel of one block per SM
// that runs a dense layer's five phases back to back, separated by grid-wide barriers instead of
// kernel boundaries.
//
// Why: at batch 1 a layer is five or six dependent launches (the QKV GEMV with its norm, the
// attention and its split merge, o_proj, the gate|up GEMV with its norm and SwiGLU, down), and
// each costs ~4-5 µs end to end even inside a CUDA graph with programmatic launches — the
// launch, the first loads' round trip, the drain of the last blocks (BENCHMARKS.md §13b: 27 µs a
// layer of pure structure for the 8B, against the 29 µs its FP8 weights take to stream). A grid
// barrier is one atomic and one poll per block. Measured on the H200 (BENCHMARKS.md §13b, with
// the earlier two-word barrier): correct, but slower than the launches it replaces — the thin 8B
// twin 34 µs a layer against 29 — so it is off by default. (Each warp asking L2 for its next
// phase's first weight row before the barrier was slower still, and is gone.)
//
// Phases of layer l (blocks × 16 warps; a warp per output row, rows dealt round-robin as in
// gemv.cu, whose row_dot / row_dot2 stream the weights):
//   A  residual (+ the previous layer's down output) → RMSNorm → QKV rows
//   B  RoPE of q (and of the new k, written to the cache with v by the block whose keys hold it);
//      the keys of kv head h split over the blocks b ≡ h (mod n_kv), each block's range over its
//      16 warps; a warp's online softmax, the block's merge in shared memory, and the last block
//      of the head (a ticket) merges the blocks' partials into the attention output
//   C  o_proj rows
//   D  residual + o_proj → RMSNorm → gate|up row pairs → SwiGLU
//   E  down rows
// The arithmetic is the separate kernels': values rounded to bf16 where they round them (the
// GEMV outputs, the normalised inputs, the rotated q and k), the same RoPE (rope_rotate); the
// attention sums in another order (a warp per key range, f32 throughout).
//
// Memory written by one block and read by another inside the launch is read with ld.global.cg
// (L2, coherent after the barrier's fences), never through the read-only path; the weights, norms,
// RoPE table, positions and block table are constant for the launch.
//
// Requirements (checked by the host, backend/src/device/cuda/decode_layers.rs): blockDim.x ==
// DL_THREADS, gridDim.x ≤ the SMs and one block an SM (the dynamic shared memory keeps a second
// out), gridDim.x ≥ n_kv; hidden ≤ DL_NORM_PT · DL_THREADS; hidden, n_heads · D multiples of 16;
// n_heads / n_kv ≤ DL_MAX_GROUP; a bf16 KV cache; one sequence of one new token.
#include "common.cuh"

#define DL_THREADS 512
#define DL_WARPS (DL_THREADS / 32)
#define DL_MAX_GROUP 8
#define DL_NORM_PT 16

// One layer's tensors (backend/src/device/cuda/decode_layers.rs writes them, 12 pointers each).
struct DlLayer {
    const bf16* attn_norm;
    const void* qkv;
    const float* qkv_s;  // FP8 weights: a scale per row; bf16: null
    const void* o;
    const float* o_s;
    const bf16* mlp_norm;
    const void* gate_up;  // gate rows, then up rows
    const float* gate_up_s;
    const void* down;
    const float* down_s;
    bf16* k_cache;  // [slots, n_kv, D]
    bf16* v_cache;
};

__device__ __forceinline__ float dl_ld_f32(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ bf16 dl_ld_bf16(const bf16* p) {
    unsigned short v;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ uint4 dl_ld_u4(const void* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}
__device__ __forceinline__ uint2 dl_ld_u2(const void* p) {
    uint2 v;
    asm volatile("ld.global.cg.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned dl_ld_u1(const void* p) {
    unsigned v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned dl_ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long dl_ld_acquire64(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// Every block of the grid waits here for the others: one atomic and one poll of the same word.
// The arrivals count up for good (64 bits); every launch makes the same number of barriers
// (DlArgs::barriers), so a launch starts at a multiple of barriers · gridDim.x and barrier k of
// it is passed once the count reaches that base + k · gridDim.x. (A block reading the count at
// its start may see the arrivals of blocks at the first barrier already, fewer than gridDim.x:
// rounding down to the multiple finds the base.) A block that waits far longer than any phase
// takes stops the kernel with a trap instead of hanging the device.
__device__ __forceinline__ void dl_grid_sync(unsigned long long* count, unsigned long long& target) {
    target += gridDim.x;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(count, 1ull);
        unsigned spins = 0;
        while ((long long)(dl_ld_acquire64(count) - target) < 0)
            if (++spins > (1u << 24)) __trap();
        __threadfence();
    }
    __syncthreads();
}

// xs = bf16(rms_norm(res (+ delta)) · w) into shared memory; block 0 writes the new residual to
// res_out when there is a delta (no block reads res_out in this phase). add_rms_norm_bf16's
// arithmetic.
__device__ __forceinline__ void dl_norm(const float* res, const bf16* delta, float* res_out, const bf16* __restrict__ w,
                                        bf16* xs, int k, float eps) {
    float v[DL_NORM_PT];
    float ss = 0.f;
#pragma unroll
    for (int c = 0; c < DL_NORM_PT; ++c) {
        const int i = threadIdx.x + c * DL_THREADS;
        v[c] = 0.f;
        if (i < k) {
            v[c] = dl_ld_f32(res + i);
            if (delta) v[c] += bf2f(dl_ld_bf16(delta + i));
        }
        ss += v[c] * v[c];
    }
    const float inv = rsqrtf(block_sum(ss) / k + eps);
    const bool write = delta && blockIdx.x == 0;
#pragma unroll
    for (int c = 0; c < DL_NORM_PT; ++c) {
        const int i = threadIdx.x + c * DL_THREADS;
        if (i < k) {
            if (write) res_out[i] = v[c];
            xs[i] = f2bf(bf2f(w[i]) * (v[c] * inv));
        }
    }
    __syncthreads();
}

// xs = src[0 .. k) (bf16, k % 8 == 0), written by other blocks before the barrier.
__device__ __forceinline__ void dl_stage(const bf16* src, bf16* xs, int k) {
    uint4* d = reinterpret_cast<uint4*>(xs);
    for (int i = threadIdx.x; i < k / 8; i += DL_THREADS) d[i] = dl_ld_u4(src + 8 * i);
    __syncthreads();
}

// y[j] = bf16(xs · W[j, :] (· scale[j])) for j < n, a warp per row.
template <bool F8>
__device__ __forceinline__ void dl_rows(const void* __restrict__ w, const float* __restrict__ ws, const bf16* xs,
                                        bf16* y, int n, int k) {
    const int warps = gridDim.x * DL_WARPS;
    const uint4* x = reinterpret_cast<const uint4*>(xs);
    for (int j = blockIdx.x * DL_WARPS + (threadIdx.x >> 5); j < n; j += warps) {
        float acc[1] = {0.f};
        row_dot<1, F8>(weight_row<F8>(w, j, k), x, row_units<F8>(k), 1, acc);
        const float s = warp_sum(acc[0]) * (F8 ? ws[j] : 1.f);
        if ((threadIdx.x & 31) == 0) y[j] = f2bf(s);
    }
}

// act[j] = bf16(silu(g) · u), g and u the gate and up rows' outputs rounded to bf16
// (gemv_norm_glu's arithmetic).
template <bool F8>
__device__ __forceinline__ void dl_glu_rows(const void* __restrict__ w, const float* __restrict__ ws, const bf16* xs,
                                            bf16* act, int inter, int k) {
    const int warps = gridDim.x * DL_WARPS;
    const uint4* x = reinterpret_cast<const uint4*>(xs);
    for (int j = blockIdx.x * DL_WARPS + (threadIdx.x >> 5); j < inter; j += warps) {
        float g[1] = {0.f}, u[1] = {0.f};
        row_dot2<1, F8>(weight_row<F8>(w, j, k), weight_row<F8>(w, inter + j, k), x, row_units<F8>(k), g, u);
        const float gsc = F8 ? ws[j] : 1.f, usc = F8 ? ws[inter + j] : 1.f;
        const float gs = bf2f(f2bf(warp_sum(g[0]) * gsc)), us = bf2f(f2bf(warp_sum(u[0]) * usc));
        if ((threadIdx.x & 31) == 0) act[j] = f2bf(silu(gs) * us);
    }
}

// The K or V bits of one key that lane `lane` holds (D / 32 bf16: 8 or 4 bytes), kept raw until
// used (half the registers of floats).
template <int D>
struct DlKv {
    unsigned w[D / 64];
    __device__ __forceinline__ float at(int e) const {
        const unsigned x = w[e >> 1];
        return (e & 1) ? __uint_as_float(x & 0xffff0000u) : __uint_as_float(x << 16);
    }
};
template <int D>
__device__ __forceinline__ DlKv<D> dl_kv_load(const bf16* cache, size_t off) {
    DlKv<D> r;
    if constexpr (D == 128) {
        const uint2 u = dl_ld_u2(cache + off);
        r.w[0] = u.x, r.w[1] = u.y;
    } else {
        r.w[0] = dl_ld_u1(cache + off);
    }
    return r;
}

// Phase B for the block's kv head: see the top of the file. smem holds q (G · D f32, scaled by
// scale · log2 e), then the warps' (m, l) and outputs.
template <int D>
__device__ __forceinline__ void dl_attention(const bf16* qkv, const float* __restrict__ rope, unsigned pos,
                                             unsigned slot, const unsigned* __restrict__ table, int bs,
                                             bf16* k_cache, bf16* v_cache, int n_heads, int n_kv, float scale,
                                             float* part, unsigned* tickets, bf16* out, float* smem) {
    constexpr int DPL = D / 32, HALF = D / 2;
    const int G = n_heads / n_kv, nbh = gridDim.x / n_kv;
    if ((int)blockIdx.x >= nbh * n_kv) return;  // idle in this phase (block-uniform)
    const int h = blockIdx.x % n_kv, bi = blockIdx.x / n_kv;
    const int ctx = (int)pos + 1, per_block = (ctx + nbh - 1) / nbh;
    const int b0 = min(ctx, bi * per_block), b1 = min(ctx, b0 + per_block);
    float* qs = smem;
    float* wm = qs + DL_MAX_GROUP * D;
    float* wl = wm + DL_WARPS * DL_MAX_GROUP;
    float* wo = wl + DL_WARPS * DL_MAX_GROUP;
    const float qscale = scale * 1.4426950408889634f;
    const float* cs = rope + (size_t)pos * D;
    for (int t = threadIdx.x; t < G * HALF; t += DL_THREADS) {
        const int g = t / HALF, j = t % HALF;
        const bf16* qr = qkv + (size_t)(h * G + g) * D;
        float r1, r2;
        rope_rotate(bf2f(dl_ld_bf16(qr + j)), bf2f(dl_ld_bf16(qr + j + HALF)), cs[j], cs[HALF + j], &r1, &r2);
        qs[g * D + j] = bf2f(f2bf(r1)) * qscale;
        qs[g * D + j + HALF] = bf2f(f2bf(r2)) * qscale;
    }
    // The new token's K (rotated) and V go to the cache before this block reads its keys; no
    // other block reads that slot in this launch.
    if ((int)pos >= b0 && (int)pos < b1 && slot != 0xFFFFFFFFu) {
        const bf16* kr = qkv + (size_t)(n_heads + h) * D;
        const bf16* vr = qkv + (size_t)(n_heads + n_kv + h) * D;
        const size_t base = ((size_t)slot * n_kv + h) * D;
        for (int j = threadIdx.x; j < HALF; j += DL_THREADS) {
            float r1, r2;
            rope_rotate(bf2f(dl_ld_bf16(kr + j)), bf2f(dl_ld_bf16(kr + j + HALF)), cs[j], cs[HALF + j], &r1, &r2);
            k_cache[base + j] = f2bf(r1);
            k_cache[base + j + HALF] = f2bf(r2);
            v_cache[base + j] = dl_ld_bf16(vr + j);
            v_cache[base + j + HALF] = dl_ld_bf16(vr + j + HALF);
        }
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int per_warp = (b1 - b0 + DL_WARPS - 1) / DL_WARPS;
    const int w0 = min(b1, b0 + warp * per_warp), w1 = min(b1, w0 + per_warp);
    // Four q heads of the group at a time (a group of 8 reads its keys twice): registers are the
    // GEMV phases' to spend. Four keys' K and V in flight a lane; q from shared memory.
    constexpr int GC = 4, U = 4;
#pragma unroll 1
    for (int g0 = 0; g0 < G; g0 += GC) {
        float m[GC], l[GC], o[GC][DPL];
#pragma unroll
        for (int g = 0; g < GC; ++g) {
            m[g] = -CACHET_INF, l[g] = 0.f;
#pragma unroll
            for (int e = 0; e < DPL; ++e) o[g][e] = 0.f;
        }
#pragma unroll 1
        for (int t0 = w0; t0 < w1; t0 += U) {
            // Keys past the range load the last one again and are masked out: no branch, so
            // the four keys stay in registers.
            DlKv<D> kk[U], vv[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int t = min(t0 + u, w1 - 1);
                const size_t s = (size_t)table[t / bs] * bs + t % bs;
                const size_t off = (s * n_kv + h) * D + lane * DPL;
                kk[u] = dl_kv_load<D>(k_cache, off);
                vv[u] = dl_kv_load<D>(v_cache, off);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const bool in = t0 + u < w1;
#pragma unroll
                for (int g = 0; g < GC; ++g) {
                    const float* qg = qs + min(g0 + g, G - 1) * D + lane * DPL;
                    float s = 0.f;
#pragma unroll
                    for (int e = 0; e < DPL; ++e) s = fmaf(qg[e], kk[u].at(e), s);
                    s = in ? warp_sum(s) : -CACHET_INF;
                    const float mn = fmaxf(m[g], s), c = exp2f(m[g] - mn), p = exp2f(s - mn);
                    l[g] = l[g] * c + p;
#pragma unroll
                    for (int e = 0; e < DPL; ++e) o[g][e] = fmaf(p, vv[u].at(e), o[g][e] * c);
                    m[g] = mn;
                }
            }
        }
        // This warp's partial (m, l, o) of each q head, for the block's merge.
#pragma unroll
        for (int g = 0; g < GC; ++g) {
            if (g0 + g >= G) break;
            const int at = warp * DL_MAX_GROUP + g0 + g;
            if (lane == 0) wm[at] = m[g], wl[at] = l[g];
#pragma unroll
            for (int e = 0; e < DPL; ++e) wo[at * D + lane * DPL + e] = o[g][e];
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < G * D; t += DL_THREADS) {
        const int g = t / D, d = t % D;
        float mx = -CACHET_INF;
        for (int w = 0; w < DL_WARPS; ++w) mx = fmaxf(mx, wm[w * DL_MAX_GROUP + g]);
        float ls = 0.f, os = 0.f;
        if (mx != -CACHET_INF)
            for (int w = 0; w < DL_WARPS; ++w) {
                const float c = exp2f(wm[w * DL_MAX_GROUP + g] - mx);
                ls = fmaf(wl[w * DL_MAX_GROUP + g], c, ls);
                os = fmaf(wo[(w * DL_MAX_GROUP + g) * D + d], c, os);
            }
        float* pp = part + ((size_t)(h * nbh + bi) * G + g) * (D + 2);
        pp[2 + d] = os;
        if (d == 0) pp[0] = mx, pp[1] = ls;
    }
    // The last block of the head to finish merges the blocks' partials.
    __shared__ int dl_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        dl_last = atomicAdd(tickets + h, 1u) == (unsigned)(nbh - 1);
        if (dl_last) tickets[h] = 0u;
    }
    __syncthreads();
    if (!dl_last) return;
    __threadfence();
    for (int t = threadIdx.x; t < G * D; t += DL_THREADS) {
        const int g = t / D, d = t % D;
        float mx = -CACHET_INF;
        for (int b = 0; b < nbh; ++b) mx = fmaxf(mx, dl_ld_f32(part + ((size_t)(h * nbh + b) * G + g) * (D + 2)));
        float ls = 0.f, os = 0.f;
        for (int b = 0; b < nbh; ++b) {
            const float* pp = part + ((size_t)(h * nbh + b) * G + g) * (D + 2);
            const float c = exp2f(dl_ld_f32(pp) - mx);
            ls = fmaf(dl_ld_f32(pp + 1), c, ls);
            os = fmaf(dl_ld_f32(pp + 2 + d), c, os);
        }
        out[(size_t)(h * G + g) * D + d] = f2bf(os / ls);
    }
}

// The whole step's layers. res_a holds the embedding's residual rows on entry; the residual
// stream ends in res_b (2 · n_layers − 1 updates, each into the other buffer) and the last
// layer's down output in down_out, for the final norm to add.
//   layers : device, n_layers DlLayer;  res_a, res_b : f32 [hidden];  scratch, all bf16: qkv
//   [(n_heads + 2 n_kv) · D], attn [n_heads · D], o_out [hidden], act [inter], down_out [hidden];
//   part : f32 [n_heads · (gridDim.x / n_kv) · (D + 2)];  sync : u32 [2 + n_kv]: the barrier's
//   arrival count (u64, zero before the first launch), then the tickets (zero between launches)
//   rope : f32 [max_pos, D];  pos, slot : u32 [1];  table : u32 [max_blocks] (the sequence's)
// The launch's arguments, kept in shared memory and read where each phase uses them: held in
// registers through the layer loop they would take the registers the GEMV phases stream with.
struct DlArgs {
    const DlLayer* layers;
    float *res_a, *res_b;
    bf16 *qkv, *attn, *o_out, *act, *down_out;
    float* part;
    unsigned* sync;
    const float* rope;
    const unsigned* table;
    int n_layers, hidden, inter, n_heads, n_kv, block_size, barriers;
    unsigned pos, slot;
    float scale, eps;
};

template <bool F8, int D>
__device__ __forceinline__ void decode_layers(const DlArgs& a) {
    extern __shared__ uint4 dl_smem[];
    bf16* xs = reinterpret_cast<bf16*>(dl_smem);
    float *res = a.res_a, *res_next = a.res_b;
    bool delta = false;
    // sync[0..2): the barrier's arrivals (64 bits), then the kv heads' tickets.
    unsigned long long* count = reinterpret_cast<unsigned long long*>(a.sync);
    const unsigned long long per_launch = (unsigned long long)a.barriers * gridDim.x;
    unsigned long long target = 0;
    if (threadIdx.x == 0) {
        const unsigned long long c = dl_ld_acquire64(count);
        target = c - c % per_launch;
    }
    for (int li = 0; li < a.n_layers; ++li) {
        // Each pointer read where it is used (the table stays in L1), not held in registers
        // through the layer.
        const DlLayer* L = a.layers + li;
        const int hidden = a.hidden, qkv_n = (a.n_heads + 2 * a.n_kv) * D;
        // A: norm + QKV.
        dl_norm(res, delta ? a.down_out : nullptr, res_next, L->attn_norm, xs, hidden, a.eps);
        if (delta) {
            float* t = res;
            res = res_next, res_next = t;
        }
        dl_rows<F8>(L->qkv, L->qkv_s, xs, a.qkv, qkv_n, hidden);
        dl_grid_sync(count, target);
        // B: attention.
        dl_attention<D>(a.qkv, a.rope, a.pos, a.slot, a.table, a.block_size, L->k_cache, L->v_cache, a.n_heads,
                        a.n_kv, a.scale, a.part, a.sync + 2, a.attn, reinterpret_cast<float*>(dl_smem));
        dl_grid_sync(count, target);
        // C: o_proj.
        dl_stage(a.attn, xs, a.n_heads * D);
        dl_rows<F8>(L->o, L->o_s, xs, a.o_out, a.hidden, a.n_heads * D);
        dl_grid_sync(count, target);
        // D: norm + gate|up + SwiGLU.
        dl_norm(res, a.o_out, res_next, L->mlp_norm, xs, a.hidden, a.eps);
        {
            float* t = res;
            res = res_next, res_next = t;
        }
        dl_glu_rows<F8>(L->gate_up, L->gate_up_s, xs, a.act, a.inter, a.hidden);
        dl_grid_sync(count, target);
        // E: down.
        dl_stage(a.act, xs, a.inter);
        dl_rows<F8>(L->down, L->down_s, xs, a.down_out, a.hidden, a.inter);
        if (li + 1 == a.n_layers) break;
        dl_grid_sync(count, target);
        delta = true;
    }
}

#define DECODE_LAYERS_KERNEL(name, F8, D)                                                                        \
    extern "C" __global__ void __launch_bounds__(DL_THREADS, 1)                                                  \
        name(const DlLayer* __restrict__ layers, int n_layers, int hidden, int inter, int n_heads, int n_kv,    \
             float* res_a, float* res_b, bf16* qkv, bf16* attn, bf16* o_out, bf16* act, bf16* down_out,         \
             float* part, unsigned* sync, const float* __restrict__ rope, const unsigned* __restrict__ pos,      \
             const unsigned* __restrict__ slot, const unsigned* __restrict__ table, int block_size, float scale, \
             float eps) {                                                                                        \
        wait_for_prior_kernels();                                                                                \
        __shared__ DlArgs a;                                                                                     \
        if (threadIdx.x == 0)                                                                                    \
            a = DlArgs{layers, res_a, res_b, qkv, attn, o_out, act, down_out, part, sync, rope, table,          \
                       n_layers, hidden, inter, n_heads, n_kv, block_size, 5 * n_layers - 1, pos[0],               \
                       slot[0], scale, eps};                                                                     \
        __syncthreads();                                                                                         \
        decode_layers<F8, D>(a);                                                                                 \
    }
DECODE_LAYERS_KERNEL(decode_layers_bf16_d64, false, 64)
DECODE_LAYERS_KERNEL(decode_layers_bf16_d128, false, 128)
DECODE_LAYERS_KERNEL(decode_layers_e4m3_d64, true, 64)
DECODE_LAYERS_KERNEL(decode_layers_e4m3_d128, true, 128)
