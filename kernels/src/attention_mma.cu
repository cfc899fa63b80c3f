// Tensor-core variant of paged_attention_bf16 for head_dim 64 or 128: S = Q·Kᵀ and O += P·V with
// mma.sync m16n8k16 (bf16 in, f32 accumulate). A block of four warps serves one kv head and takes
// 64 query rows (16 per warp): `sub_tokens` consecutive tokens × the `group` q heads that share the
// kv head, so each K/V tile staged in shared memory (bf16) serves the whole GQA group. A batch tile
// of up to 32 tokens is split into `units_per_tile` such units. K/V tiles are double-buffered:
// the next tile's rows are copied with cp.async while the tensor cores work on the current one.
// B fragments come from shared memory through ldmatrix (K as stored, V transposed).
// Fragment layouts follow the PTX ISA for mma.m16n8k16 (.row.col):
//   A (16×16): a0 = (r, 2q..2q+1), a1 = (r+8, 2q..), a2 = (r, 2q+8..), a3 = (r+8, 2q+8..)
//   B (16×8) : b0 = (k = 2q..2q+1, n = r), b1 = (k = 2q+8.., n = r)
//   C (16×8) : c0,c1 = (r, 2q..2q+1), c2,c3 = (r+8, 2q..2q+1)
// with r = lane / 4, q = lane % 4.
#include "common.cuh"

#define MMA_TQ 64
#define MMA_TK 64
#define MMA_HK 16
#define MMA_THREADS 128
// Key groups: head_dim 256 holds one block per SM (its accumulators take the registers), so its
// block runs twice the warps: warps w and w + 4 take the same 16 query rows and each a half of
// every key tile, with their own running max, sum and output, merged through shared memory at
// the end. Smaller heads keep four warps (three blocks per SM hide the latency instead).
#define MMA_KGROUPS(D) ((D) > 128 ? 2 : 1)
// Decode steps split each key tile over the warps (below) with the FP8 cache; the bf16 cache
// keeps one warp per 16 query rows (its d128 variant spills with the split's registers).
// Decode blocks of the FP8 cache run an instantiation of their own (attention_mma's DECODE; the
// INT8 cache's would spill), so every choice between the decode and the prompt path below is made
// at compile time — the copies' loops and addresses, the lookups and the fragment paths — instead
// of at run time in one body holding both: 650 instructions a tile loop instead of 833, a
// batch-256 FP8 decode step 5% faster (BENCHMARKS-HISTORY.md).
// Whether the kernel of head_dim D and cache MODE has a decode instantiation.
#define MMA_SPECIALIZES(D, MODE) ((MODE) == 1 && MMA_KGROUPS(D) == 1)

__device__ __forceinline__ void mma_bf16(float* c, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The same with f16 inputs (the FP8 path: every e4m3 value is an f16, converted in one step).
__device__ __forceinline__ void mma_f16(float* c, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two floats → f16x2 (round to nearest even); `lo` in the low half.
__device__ __forceinline__ unsigned pack_f16(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Two floats → bf16x2 (round to nearest even) in one instruction; `lo` in the low half.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float fast_exp2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// 16 bytes global → shared, bypassing L1; `bytes` = 0 writes zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
// The same to a shared-space address (computed once, offsets added per copy).
__device__ __forceinline__ void cp_async16_at(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
// 4 bytes global → shared (through L1: .cg takes 16 only); `bytes` = 0 writes zeros.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;\n" ::); }
__device__ __forceinline__ void cp_async_wait2() { asm volatile("cp.async.wait_group 2;\n" ::); }

// Four 8×8 bf16 matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// Two e4m3 codes (low byte first) → f16x2, exactly (every e4m3 value is an f16): one instruction
// on sm_89+, integer arithmetic (common.cuh) before.
__device__ __forceinline__ unsigned e4m3x2_f16x2(unsigned two) {
#if __CUDA_ARCH__ >= 890
    unsigned h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((unsigned short)two));
    return h2;
#else
    return pack_f16(e4m3f(two & 0xffu), e4m3f((two >> 8) & 0xffu));
#endif
}
// The codes in bytes 2, 3 of `four` → f16x2: on sm_89+ the conversion reads the register's upper
// half itself (no shift first: one instruction fewer a pair).
__device__ __forceinline__ unsigned e4m3x2_f16x2_hi(unsigned four) {
#if __CUDA_ARCH__ >= 890
    unsigned short lo, hi;
    asm("mov.b32 {%0, %1}, %2;" : "=h"(lo), "=h"(hi) : "r"(four));
    unsigned h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(hi));
    return h2;
#else
    return e4m3x2_f16x2(four >> 16);
#endif
}

// 16 e4m3 codes (one 16-byte load) → 16 f16 in shared memory (two 16-byte stores), times `scale2`
// (f16x2, both halves the scale) when `scaled` (V; K's scales are applied to the scores).
__device__ __forceinline__ void dequant16(bf16* dst, uint4 w, bool scaled, unsigned scale2) {
    const unsigned words[4] = {w.x, w.y, w.z, w.w};
    unsigned o[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        o[2 * k] = e4m3x2_f16x2(words[k] & 0xffffu);
        o[2 * k + 1] = e4m3x2_f16x2_hi(words[k]);
    }
    if (scaled) {
#pragma unroll
        for (int k = 0; k < 8; ++k) asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(o[k]) : "r"(scale2));
    }
    reinterpret_cast<uint4*>(dst)[0] = make_uint4(o[0], o[1], o[2], o[3]);
    reinterpret_cast<uint4*>(dst)[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

// Two INT8 codes (low byte first) → f16x2, exactly: a code with its sign bit flipped is the low
// mantissa byte of 1024 + (code + 128) in f16, and 1152 subtracted leaves the code.
__device__ __forceinline__ unsigned i8x2_f16x2(unsigned two) {
    const unsigned h = __byte_perm(two ^ 0x8080u, 0x64646464u, 0x4140);
    unsigned r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(h), "r"(0x64806480u));
    return r;
}

// 16 INT8 codes (one 16-byte load) → 16 f16 in shared memory, unscaled (the INT8 cache's channel
// scales are applied to Q for K and to the output for V).
__device__ __forceinline__ void dequant16_i8(bf16* dst, uint4 w) {
    const unsigned words[4] = {w.x, w.y, w.z, w.w};
    unsigned o[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        o[2 * k] = i8x2_f16x2(words[k] & 0xffffu);
        o[2 * k + 1] = i8x2_f16x2(words[k] >> 16);
    }
    reinterpret_cast<uint4*>(dst)[0] = make_uint4(o[0], o[1], o[2], o[3]);
    reinterpret_cast<uint4*>(dst)[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

// f32 → f16 bits, round to nearest even.
__device__ __forceinline__ bf16 f2h(float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

// 8 pairs of a head as f32: x[0] = a[0..8), x[1] = b[0..8) (bf16, 16-byte aligned).
__device__ __forceinline__ void load_pairs8(const bf16* a, const bf16* b, float (&x)[2][8]) {
    const uint4 xa = *reinterpret_cast<const uint4*>(a), xb = *reinterpret_cast<const uint4*>(b);
    const unsigned wa[4] = {xa.x, xa.y, xa.z, xa.w}, wb[4] = {xb.x, xb.y, xb.z, xb.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        x[0][e] = bf2f((bf16)((wa[e / 2] >> (16 * (e & 1))) & 0xffffu));
        x[1][e] = bf2f((bf16)((wb[e / 2] >> (16 * (e & 1))) & 0xffffu));
    }
}

// The q/k head RMSNorm (Qwen3, Gemma 3; before RoPE) of 8 pairs whose head is spread over
// `lanes` consecutive lanes of the warp (all of them here): the sum of squares is reduced over
// those lanes, and each value becomes bf16(w · x · inv) as head_norm_bf16 rounds it. w_a and w_b
// are the weights of the a and b elements.
__device__ __forceinline__ void head_norm8(float (&x)[2][8], const bf16* w_a, const bf16* w_b, int lanes, int d,
                                           float eps) {
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += x[0][e] * x[0][e] + x[1][e] * x[1][e];
    const int lane = threadIdx.x & 31;
    const unsigned mask = ((lanes == 32 ? 0u : (1u << lanes)) - 1u) << (lane & ~(lanes - 1));
    for (int o = 1; o < lanes; o <<= 1) ss += __shfl_xor_sync(mask, ss, o);
    const float inv = rsqrtf(ss / d + eps);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        x[0][e] = bf2f(f2bf(bf2f(w_a[e]) * (x[0][e] * inv)));
        x[1][e] = bf2f(f2bf(bf2f(w_b[e]) * (x[1][e] * inv)));
    }
}

// RoPE of 8 pairs in f32: x1 = x[0], x2 = x[1], cos = cs[0..8) and sin = cs[half..half + 8);
// r[0] the rotated a, r[1] the rotated b.
__device__ __forceinline__ void rotate8(const float (&x)[2][8], const float* cs, int half, float (&r)[2][8]) {
    const float4 c0 = *reinterpret_cast<const float4*>(cs), c1 = *reinterpret_cast<const float4*>(cs + 4);
    const float4 s0 = *reinterpret_cast<const float4*>(cs + half);
    const float4 s1 = *reinterpret_cast<const float4*>(cs + half + 4);
    const float c[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
    const float s[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) rope_rotate(x[0][e], x[1][e], c[e], s[e], &r[0][e], &r[1][e]);
}

// One staged chunk of a q or k head: 8 pairs at i and HALF + i of the head at `h`, head-normed
// with `norm` first where the model has it (every lane of the chunk's head reduces together),
// then rotated by RoPE at row `cs` of the table.
__device__ __forceinline__ void prep8(const bf16* h, int i, int half, const bf16* norm, int lanes, float eps,
                                      const float* cs, float (&rot)[2][8]) {
    float x[2][8];
    load_pairs8(h + i, h + half + i, x);
    if (norm) head_norm8(x, norm + i, norm + half + i, lanes, 2 * half, eps);
    rotate8(x, cs + i, half, rot);
}

// Eight rotated values as rope_kv stores them (bf16), times `mul` (the Q pre-scale; 1 for K),
// packed as bf16 or, with F16, as f16 (the FP8 path's Q).
template <bool F16>
__device__ __forceinline__ uint4 pack8(const float (&r)[8], float mul) {
    unsigned o[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float lo = bf2f(f2bf(r[2 * k])) * mul, hi = bf2f(f2bf(r[2 * k + 1])) * mul;
        o[k] = F16 ? pack_f16(lo, hi) : pack_bf16(lo, hi);
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}

// Eight e4m3 codes of r · inv, low byte first.
__device__ __forceinline__ uint2 codes8(const float* r, float inv) {
    unsigned w[2] = {0u, 0u};
#pragma unroll
    for (int e = 0; e < 8; ++e) w[e / 4] |= (unsigned)f2e4m3(r[e] * inv) << (8 * (e % 4));
    return make_uint2(w[0], w[1]);
}

// FP8: the cache holds e4m3 codes with an f32 scale per (slot, kv head). Codes and scales are
// copied with cp.async, two tiles ahead, into two raw stages (64 rows × D bytes each for K and V);
// each tile is then converted into one f16 K/V tile (K as plain codes, its scales applied to the
// scores; V times its scales), and the tensor-core loop runs in f16 (Q and P in f16 too): one
// conversion per two values. Half the bytes of the bf16 path in flight per tile, twice the tiles.
// INT8 (MODE 2; the same buffers, `kv_table` the layer's table, common.cuh) takes the FP8 path with
// three changes: Q is staged times K's channel scales (0 at K's outlier channels), and each score
// gets Σ_i q[o_i] · k[o_i] over K's outliers (kout, rebuilt from their two bytes per tile) instead
// of a per-key scale; V's tile holds plain codes with its outlier channels written over, and the
// output is multiplied by V's channel scales (1 at the outliers).
// MODE: 0 bf16 cache, 1 FP8, 2 INT8; `FP8` below means either coded cache.
// V's codes as the decode kernels' P·V fragments want them. Lane (r, q) of a warp takes V at the
// warp's keys kq = 2q, kq+1 | kq+8, kq+9 (P's columns as its C fragments hold them) and D/8
// consecutive values of d from d = r · D/8 (`rv`: the raw stage's V rows, offset by r · D/8): the
// products' D is a permutation of d chosen so, each lane reading 16 (d = 64: 8) consecutive codes
// of each of its four keys. pair01[β] holds keys kq, kq+1's codes of the lane's value β as an f16
// pair (kq's low), pair89[β] those of kq+8, kq+9, each times its key's scale (`vsc`, per row of
// the stage), in f16 as the f16 tile was.
template <int D>
__device__ __forceinline__ void v_code_pairs(const fp8* rv, int kq, const float* vsc, unsigned (&pair01)[D / 8],
                                             unsigned (&pair89)[D / 8]) {
    constexpr int W = D / 32;  // words of D/8 codes
    static_assert(W == 2 || W == 4, "head_dim 64 or 128");
    unsigned v0[W], v1[W], v8[W], v9[W];
    const fp8* rows[4] = {rv + kq * D, rv + (kq + 1) * D, rv + (kq + 8) * D, rv + (kq + 9) * D};
    unsigned* words[4] = {v0, v1, v8, v9};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        if constexpr (W == 4) {
            const uint4 a = *reinterpret_cast<const uint4*>(rows[k]);
            words[k][0] = a.x; words[k][1] = a.y; words[k][2] = a.z; words[k][3] = a.w;
        } else {
            const uint2 a = *reinterpret_cast<const uint2*>(rows[k]);
            words[k][0] = a.x; words[k][1] = a.y;
        }
    }
    const unsigned s01 = pack_f16(vsc[kq], vsc[kq + 1]), s89 = pack_f16(vsc[kq + 8], vsc[kq + 9]);
#pragma unroll
    for (int w = 0; w < W; ++w) {
        // Bytes 0, 1 | 2, 3 of the two keys' words interleaved: values 4w, 4w+1 | 4w+2, 4w+3.
        const unsigned p01[2] = {__byte_perm(v0[w], v1[w], 0x5140), __byte_perm(v0[w], v1[w], 0x7362)};
        const unsigned p89[2] = {__byte_perm(v8[w], v9[w], 0x5140), __byte_perm(v8[w], v9[w], 0x7362)};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            pair01[4 * w + i] = (i & 1) ? e4m3x2_f16x2_hi(p01[i >> 1]) : e4m3x2_f16x2(p01[i >> 1]);
            pair89[4 * w + i] = (i & 1) ? e4m3x2_f16x2_hi(p89[i >> 1]) : e4m3x2_f16x2(p89[i >> 1]);
            asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(pair01[4 * w + i]) : "r"(s01));
            asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(pair89[4 * w + i]) : "r"(s89));
        }
    }
}

// An attention output value (already divided by l where `whole`): bf16 into `o` when the block
// took the whole key range, else f32 into its split's partials `p`.
__device__ __forceinline__ void put_value(bool has, bool whole, bf16* o, float* p, float v) {
    if (!has) return;
    if (whole) *o = f2bf(v);
    else *p = v;
}
// Two consecutive values of d (`o`, `p` 4- and 8-byte aligned).
__device__ __forceinline__ void put_pair(bool has, bool whole, bf16* o, float* p, float v0, float v1) {
    if (!has) return;
    if (whole) {
        *reinterpret_cast<unsigned*>(o) = pack_bf16(v0, v1);
    } else {
        p[0] = v0;
        p[1] = v1;
    }
}
// NV consecutive values of d (NV a multiple of 8; `o`, `p` 16-byte aligned), times `inv` in bf16.
template <int NV>
__device__ __forceinline__ void put_run(const float (&v)[NV], bool whole, bf16* o, float* p, float inv) {
    if (whole) {
#pragma unroll
        for (int n = 0; n < NV; n += 8)
            *reinterpret_cast<uint4*>(o + n) =
                make_uint4(pack_bf16(v[n] * inv, v[n + 1] * inv), pack_bf16(v[n + 2] * inv, v[n + 3] * inv),
                           pack_bf16(v[n + 4] * inv, v[n + 5] * inv), pack_bf16(v[n + 6] * inv, v[n + 7] * inv));
    } else {
#pragma unroll
        for (int n = 0; n < NV; n += 4) *reinterpret_cast<float4*>(p + n) = make_float4(v[n], v[n + 1], v[n + 2], v[n + 3]);
    }
}

// DECODE: 0 the general body (prompts; decode too where not specialized), 1 the FP8 cache's decode
// blocks of up to 16 query rows (MMA_SPECIALIZES), 2 the same of up to 8 rows with the products
// transposed (paged_attention_mma_*_fp8_dec, below).
template <int D, int MODE, int DECODE>
__device__ __forceinline__ void attention_mma(const bf16* __restrict__ qkv, void* __restrict__ k_cache,
                                              void* __restrict__ v_cache, float* __restrict__ k_scale,
                                              float* __restrict__ v_scale, const unsigned* __restrict__ pos,
                                              const unsigned* __restrict__ tile_seq,
                                              const unsigned* __restrict__ tile_start,
                                              const unsigned* __restrict__ tile_len,
                                              const unsigned* __restrict__ block_tables, int max_blocks,
                                              bf16* __restrict__ out, float* __restrict__ part_o,
                                              float* __restrict__ part_ml, int n_heads, int n_kv, int block_size,
                                              float scale, int split_len, int group, int sub_tokens,
                                              int units_per_tile, const float* __restrict__ rope,
                                              const unsigned* __restrict__ slots, int fused, int window,
                                              const bf16* __restrict__ q_norm, const bf16* __restrict__ k_norm,
                                              float norm_eps, const float* __restrict__ kv_table) {
    constexpr bool FP8 = MODE != 0, I8 = MODE == 2;
    constexpr int DP = D + 8;  // padded bf16 row stride (16-byte aligned rows, no ldmatrix bank conflicts)
    constexpr int KG = MMA_KGROUPS(D), THREADS = MMA_THREADS * KG;
    constexpr int TILE = MMA_TK * DP;
    extern __shared__ float smem_f[];
    // bf16: two stages of [K tile | V tile]; Q is staged once in stage 1's K tile before the loop.
    // FP8: one [K tile | V tile], then two raw stages of [K codes | V codes] (MMA_TK × D bytes
    // each), where Q is staged before the loop.
    bf16* stage = reinterpret_cast<bf16*>(smem_f);
    // Transposed decode (DECODE 2): the key tile takes the MMAs' 16 rows and the block's (at most
    // 8) query rows their 8 columns — S^T = K Q^T, O^T += V^T P^T — so half the products of the
    // 16-row decode (where 12 of 16 rows are padding for a GQA group of 4), half its accumulator
    // and Q registers (FP8: 4 blocks an SM by its own symbol's bounds, shared memory only the
    // three raw stages, Q staged in them before the loop and the warps' merge after it; bf16: the
    // two stages of K and V tiles as in prompts, each warp copying and taking its 16 keys of a
    // tile, where the 16-row kernel leaves three of four warps without query rows).
    constexpr bool TR = DECODE == 2;
    static_assert(!TR || (MODE != 2 && KG == 1), "the transposed decode: bf16 or FP8 cache, d <= 128");
    fp8* raw = reinterpret_cast<fp8*>(stage + ((TR && FP8) ? 0 : 2 * TILE));
    // D = 256 (bf16): Q stays in a shared region of its own after the two stages, and the A
    // fragments are read from it at each k-step (in registers they would spill).
    constexpr bool Q_SHARED = !FP8 && D > 128;
    bf16* Qs = FP8 ? reinterpret_cast<bf16*>(raw) : stage + (Q_SHARED ? 4 : 2) * TILE;
    // FP8 decode (below): one f16 V tile, then three raw stages — K's codes go from their raw stage
    // straight into MMA fragments, so only V is converted in shared memory, and the smem of the K
    // tile holds a third stage in flight.
    constexpr int DEC_STAGES = 3;
    constexpr bool RESCALE_SKIP = FP8;  // (the bf16 d128 kernel spills with the vote)
    fp8* raw_dec = reinterpret_cast<fp8*>(stage + ((TR && FP8) ? 0 : TILE));
    __shared__ float raw_scale[FP8 ? DEC_STAGES : 1][2][MMA_TK];  // [stage][K, V][row]
    __shared__ float tile_k_scale[FP8 ? MMA_TK : 1];      // K scales of the tile being computed
    __shared__ float qout[I8 ? MMA_TQ : 1][KV_I8_OUTLIERS];  // INT8: each Q row at K's outliers
    __shared__ float4 kout[I8 ? MMA_TK : 1];                 // INT8: the tile's K at its outliers
    // Rows (slot * n_kv + kv head) of the key tiles in the cache, per stage: looked up once per
    // row, before the copies that read them.
    __shared__ unsigned slot_of[FP8 ? DEC_STAGES : 2][MMA_TK];
    // Units in reverse: the last tokens of a prompt have the longest causal range, so they start
    // first and the short ones fill in behind them.
    // `fused` bit 1: the grid is (kv heads, units, splits) — a sequence's kv heads are
    // consecutive blocks, scheduled together, so they walk the same keys at about the same time
    // and their rows (adjacent in the cache: slot-major, heads within a slot) are read from the
    // same DRAM pages together; otherwise (units, kv heads, splits).
    const bool heads_first = (fused & 2) != 0;
    fused &= 1;
    const int unit = heads_first ? gridDim.y - 1 - blockIdx.y : gridDim.x - 1 - blockIdx.x;
    const int kvh = heads_first ? blockIdx.x : blockIdx.y, split = blockIdx.z;
    const int tile = unit / units_per_tile, sub = unit % units_per_tile;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, fr = lane >> 2, fq = lane & 3;
    const int cols = (n_heads + 2 * n_kv) * D;
    // INT8: this kv head's outlier channels, K's and V's.
    int och_k[KV_I8_OUTLIERS], och_v[KV_I8_OUTLIERS];
    if constexpr (I8) {
#pragma unroll
        for (int i = 0; i < KV_I8_OUTLIERS; ++i) {
            och_k[i] = (int)kv_table[2 * n_kv * D + kvh * KV_I8_OUTLIERS + i];
            och_v[i] = (int)kv_table[2 * n_kv * D + (n_kv + kvh) * KV_I8_OUTLIERS + i];
        }
    }
    const int start = tile_start[tile] + sub * sub_tokens;
    const int ntok = min(sub_tokens, (int)tile_len[tile] - sub * sub_tokens);
    if (ntok <= 0) return;  // the whole block: no barrier skipped
    const int qlen = ntok * group;  // query rows of this block
    const unsigned* table = block_tables + (size_t)tile_seq[tile] * max_blocks;
    const int ctx_end = pos[start + ntok - 1] + 1;
    const int split_begin = split * split_len;
    // A sliding window (window > 0): key tiles wholly before the first token's window are
    // skipped; a split wholly before it leaves m = -inf, l = 0 for the combine.
    const int k_begin =
        window > 0 ? max(split_begin, max(0, (int)pos[start] + 1 - window) / MMA_TK * MMA_TK) : split_begin;
    const int k_end = min(ctx_end, split_begin + split_len);

    // Decode (every query row of the block in one 16-row MMA block, as in a decode step with a GQA
    // group of at most 16): the four warps split each key tile instead of its query rows — warp w
    // takes keys [16w, 16w + 16) with its own running max, sum and output, merged through shared
    // memory at the end — and each warp copies (and, FP8, converts) its own rows of every tile, so
    // the tile loop has no block-wide barrier: four warps at the tensor cores instead of one, and
    // none waiting for another's copies.
    constexpr bool DEC = FP8;
    static_assert(DECODE != 1 || MMA_SPECIALIZES(D, MODE), "a decode instantiation");
    // Specialized: the caller chose the instantiation by the same test (mma_decode_block).
    const bool dec = TR || (MMA_SPECIALIZES(D, MODE) ? DECODE != 0 : DEC && KG == 1 && ntok * group <= MMA_HK);
    if (TR && qlen > 8) __trap();  // the host launches it for steps of at most 8 rows a block
    // The FP8 cache's decode instantiation takes V's codes, like K's, from the raw stage straight
    // into MMA fragments: no f16 V tile in shared memory, no ldmatrix, no barrier between a
    // warp's conversion and its products (below, at P·V).
    constexpr bool VREG = DECODE != 0 && MODE == 1;
    // The transposed FP8 decode keeps its softmax row sums per lane until the end (below).
    constexpr bool LANE_SUMS = TR && FP8;
    // The work on a tile's rows [r0, r0 + nr) is spread over `nt` threads, this one being `me`:
    // the whole block's (0, MMA_TK, tid, THREADS), or in decode a warp's (16w, 16, lane, 32).
    // Block-table lookups for those rows of the key tile at k0, into slot_of[buf].
    // The decode instantiation divides by a power-of-two block size with a shift (a division and a
    // remainder are ~40 instructions a tile in its loop).
    const bool pow2_blocks = DECODE != 0 && (block_size & (block_size - 1)) == 0;
    const int block_shift = __ffs(block_size) - 1;
    auto lookup = [&](int k0, int buf, int r0, int nr, int me) {
        if (me < nr) {
            const int c = r0 + me, p = k0 + c;
            unsigned row = 0;
            if (p < k_end) {
                const unsigned b = pow2_blocks ? (unsigned)p >> block_shift : (unsigned)(p / block_size);
                const unsigned off = pow2_blocks ? (unsigned)p & (block_size - 1) : (unsigned)(p % block_size);
                row = (table[b] * block_size + off) * n_kv + kvh;
            }
            slot_of[buf][c] = row;
        }
    };
    // bf16: cp.async of those rows of the key tile at k0 into stage `buf` (rows past the range are
    // zero-filled).
    auto fetch = [&](int k0, int buf, int r0, int nr, int me, int nt) {
        bf16* Ks = stage + buf * 2 * TILE;
        bf16* Vs = Ks + TILE;
        const uint4* kc = reinterpret_cast<const uint4*>(k_cache);
        const uint4* vc = reinterpret_cast<const uint4*>(v_cache);
        for (int idx = me; idx < nr * (D / 8); idx += nt) {
            const int c = r0 + idx / (D / 8), i = idx % (D / 8);
            const int bytes = (k0 + c < k_end) ? 16 : 0;
            const size_t at = (size_t)slot_of[buf][c] * (D / 8) + i;
            cp_async16(Ks + c * DP + i * 8, kc + at, bytes);
            cp_async16(Vs + c * DP + i * 8, vc + at, bytes);
        }
    };
    // FP8: cp.async of the codes and scales of those rows of the key tile at k0 into raw stage
    // `buf` (rows past the range are zero-filled: code 0, scale 0).
    // Decode reads K's raw rows 16 bytes a lane, lanes 4r..4r+3 the chunks q (+ 4g) of row r:
    // at d = 128 (eight chunks a row, one bank cycle) the odd rows' chunks are stored swapped by
    // halves, so the two rows a quarter-warp reads fall in different banks.
    auto kswz = [&](int c) { return (D >= 128 && (c & 1)) ? 4 : 0; };
    auto issue = [&](int k0, int buf, int r0, int nr, int me, int nt) {
        constexpr int CH = D / 16;  // 16-code chunks per row
        fp8* rk = (dec ? raw_dec : raw) + buf * 2 * MMA_TK * D;
        fp8* rv = rk + MMA_TK * D;
        const uint4* kc = reinterpret_cast<const uint4*>(k_cache);
        const uint4* vc = reinterpret_cast<const uint4*>(v_cache);
        for (int idx = me; idx < nr * CH; idx += nt) {
            const int c = r0 + idx / CH, i = idx % CH;
            const int p = k0 + c;
            const bool in = p < k_end;
            const size_t row = dec ? slot_of[buf][c] : in ? ((size_t)table[p / block_size] * block_size + p % block_size) * n_kv + kvh : 0;
            cp_async16(rk + c * D + (dec ? i ^ kswz(c) : i) * 16, kc + row * CH + i, in ? 16 : 0);
            cp_async16(rv + c * D + i * 16, vc + row * CH + i, in ? 16 : 0);
        }
        for (int idx = me; idx < 2 * nr; idx += nt) {
            const int c = r0 + idx % nr, which = idx / nr;  // which: 0 K, 1 V
            const int p = k0 + c;
            const bool in = p < k_end;
            const size_t row = dec ? slot_of[buf][c] : in ? ((size_t)table[p / block_size] * block_size + p % block_size) * n_kv + kvh : 0;
            cp_async4(&raw_scale[FP8 ? buf : 0][which][c], (which ? v_scale : k_scale) + row, in ? 4 : 0);
        }
    };
    // FP8: those rows of raw stage `buf` → the f16 K/V tile (decode: V only, into the V tile at
    // the start of shared memory).
    auto dequant_stage = [&](int buf, int r0, int nr, int me, int nt) {
        constexpr int CH = D / 16;
        const fp8* rk = (dec ? raw_dec : raw) + buf * 2 * MMA_TK * D;
        const fp8* rv = rk + MMA_TK * D;
        bf16* vt = dec ? stage : stage + TILE;
        if constexpr (I8) {
            for (int idx = me; idx < nr * CH; idx += nt) {
                const int c = r0 + idx / CH, i = idx % CH;
                if (!dec) dequant16_i8(stage + c * DP + i * 16, *reinterpret_cast<const uint4*>(rk + c * D + i * 16));
                dequant16_i8(vt + c * DP + i * 16, *reinterpret_cast<const uint4*>(rv + c * D + i * 16));
            }
            // Then the outliers from their two bytes (code slot, aux byte): V's over its tile's
            // codes, K's into kout (their codes meet a zero in Q).
            if (dec) __syncwarp();
            else __syncthreads();
            float* ko = reinterpret_cast<float*>(kout);
            for (int idx = me; idx < nr * KV_I8_OUTLIERS; idx += nt) {
                const int c = r0 + idx / KV_I8_OUTLIERS, i = idx % KV_I8_OUTLIERS;
                const unsigned ka = __float_as_uint(raw_scale[buf][0][c]), va = __float_as_uint(raw_scale[buf][1][c]);
                const int kc = och_k[i], vc = och_v[i];
                const int kat = dec ? ((kc >> 4) ^ kswz(c)) * 16 + (kc & 15) : kc;
                vt[c * DP + vc] = f2h(i8_outlier(rv[c * D + vc], va, i));
                ko[c * KV_I8_OUTLIERS + i] = i8_outlier(rk[c * D + kat], ka, i);
            }
        } else {
            for (int idx = me; idx < nr * CH; idx += nt) {
                const int c = r0 + idx / CH, i = idx % CH;
                const float vs = raw_scale[FP8 ? buf : 0][1][c];
                if (!dec)
                    dequant16(stage + c * DP + i * 16, *reinterpret_cast<const uint4*>(rk + c * D + i * 16), false, 0u);
                dequant16(vt + c * DP + i * 16, *reinterpret_cast<const uint4*>(rv + c * D + i * 16), true,
                          pack_f16(vs, vs));
            }
            for (int idx = me; idx < nr; idx += nt) tile_k_scale[r0 + idx] = raw_scale[FP8 ? buf : 0][0][r0 + idx];
        }
    };
    // This warp's rows of every tile in decode.
    const int my_r0 = warp * MMA_HK;
    // FP8 decode: `issue` for this warp's rows, addressed from per-lane constants. Lane (g, i) =
    // (lane / CH, lane % CH) copies chunk i of rows my_r0 + g + RP·j (RP = 32 / CH rows a pass, an
    // even number, so a row's parity — all its swizzle depends on — is g's), and one scale: K's of
    // row my_r0 + lane (lane < 16), else V's of row my_r0 + lane - 16.
    // Decode instantiations only (a kernel deciding per block keeps `issue`: registers).
    constexpr bool DEC_KERNEL = TR || (MMA_SPECIALIZES(D, MODE) && DECODE != 0);
    constexpr int DEC_CH = D / 16, DEC_RP = 32 / DEC_CH;
    static_assert(DEC_RP % 2 == 0 && MMA_HK % DEC_RP == 0, "whole passes of even rows");
    const int dec_g = lane / DEC_CH, dec_i = lane % DEC_CH;
    const unsigned dec_k_at = smem_addr(raw_dec) + (my_r0 + dec_g) * D + (dec_i ^ kswz(dec_g)) * 16;
    const unsigned dec_v_at = smem_addr(raw_dec) + MMA_TK * D + (my_r0 + dec_g) * D + dec_i * 16;
    const char* dec_k_src = static_cast<const char*>(k_cache) + dec_i * 16;
    const char* dec_v_src = static_cast<const char*>(v_cache) + dec_i * 16;
    auto issue_dec = [&](int k0, int buf) {
        const unsigned at = buf * 2 * MMA_TK * D;
#pragma unroll
        for (int j = 0; j < MMA_HK / DEC_RP; ++j) {
            const int c = my_r0 + dec_g + DEC_RP * j;
            const int bytes = k0 + c < k_end ? 16 : 0;
            const size_t row = slot_of[buf][c];
            cp_async16_at(dec_k_at + at + DEC_RP * j * D, dec_k_src + row * D, bytes);
            cp_async16_at(dec_v_at + at + DEC_RP * j * D, dec_v_src + row * D, bytes);
        }
        const int c = my_r0 + (lane & (MMA_HK - 1)), which = lane / MMA_HK;
        cp_async4(&raw_scale[FP8 ? buf : 0][which][c], (which ? v_scale : k_scale) + slot_of[buf][c],
                  k0 + c < k_end ? 4 : 0);
    };
    // FP8 decode, once the warp is done with raw stage `buf` (tile k0's): its rows of the tile
    // DEC_STAGES ahead go into it (the stage's copies form one group whether or not there are any).
    auto refill_dec = [&](int k0, int buf) {
        __syncwarp();
        if (k0 + DEC_STAGES * MMA_TK < k_end) {
            lookup(k0 + DEC_STAGES * MMA_TK, buf, my_r0, MMA_HK, lane);
            __syncwarp();
            if constexpr (DEC_KERNEL) issue_dec(k0 + DEC_STAGES * MMA_TK, buf);
            else issue(k0 + DEC_STAGES * MMA_TK, buf, my_r0, MMA_HK, lane, 32);
        }
        cp_async_commit();
    };

    if constexpr (!FP8) lookup(k_begin, 0, 0, MMA_TK, tid);
    // Q rows, 8 elements per 16-byte load, pre-scaled: scores come out in log2 units, so exp2 of
    // them is the softmax's exp.
    const float qscale = scale * LOG2E;
    if (!I8 && fused) {
        // Fused decode path (every sequence one unit): the q and k heads arrive unrotated and no
        // rope_kv launch ran. Q is rotated as it is staged (8 pairs per thread: elements i.. and
        // i + D/2..), and the block whose key range holds a new token's position rotates that
        // token's k head, writes it and its v head into the cache (bf16, or e4m3 codes with the
        // head's scale, exactly as rope_kv does) and reads them back with the rest of the tile
        // below (the barrier after this orders the writes before the copies). Each position lies
        // in exactly one split, so each write has one writer, and no other block reads it: a
        // unit's new keys are its own sequence's, in its own range.
        constexpr int HALF = D / 2, PAIRS = HALF / 8;  // 8-pair chunks per head
        for (int idx = tid; idx < MMA_TQ * PAIRS; idx += THREADS) {
            const int r = idx / PAIRS, i = (idx % PAIRS) * 8;
            uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
            if (r < qlen) {
                const int tok = start + r / group;
                const bf16* q = qkv + (size_t)tok * cols + (kvh * group + r % group) * D;
                float rot[2][8];
                prep8(q, i, HALF, q_norm, PAIRS, norm_eps, rope + (size_t)pos[tok] * D, rot);
                lo = pack8<FP8>(rot[0], qscale);
                hi = pack8<FP8>(rot[1], qscale);
            }
            *reinterpret_cast<uint4*>(Qs + r * DP + i) = lo;
            *reinterpret_cast<uint4*>(Qs + r * DP + HALF + i) = hi;
        }
        // A token's PAIRS chunks are PAIRS consecutive lanes of one warp (ntok * PAIRS is a
        // multiple of PAIRS), and whether they write is the token's: the group reduces together.
        for (int idx = tid; idx < ntok * PAIRS; idx += THREADS) {
            const int t = idx / PAIRS, i = (idx % PAIRS) * 8, tok = start + t;
            const int p = pos[tok];
            const unsigned slot = slots[tok];
            if (p < split_begin || p >= split_begin + split_len || slot == 0xFFFFFFFFu) continue;
            const bf16* k = qkv + (size_t)tok * cols + (n_heads + kvh) * D;
            const uint4* v = reinterpret_cast<const uint4*>(k + n_kv * D);
            float rot[2][8];
            prep8(k, i, HALF, k_norm, PAIRS, norm_eps, rope + (size_t)p * D, rot);
            const size_t head = (size_t)slot * n_kv + kvh;
            const uint4 v1 = v[i / 8], v2 = v[(HALF + i) / 8];
            if constexpr (FP8) {
                // One scale per token and head: its largest magnitude maps to E4M3_MAX; K from the
                // rotation's f32 result.
                const unsigned vw[8] = {v1.x, v1.y, v1.z, v1.w, v2.x, v2.y, v2.z, v2.w};
                float vf[2][8], ka = 0.f, va = 0.f;
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    vf[0][e] = bf2f((bf16)((vw[e / 2] >> (16 * (e & 1))) & 0xffffu));
                    vf[1][e] = bf2f((bf16)((vw[4 + e / 2] >> (16 * (e & 1))) & 0xffffu));
                    ka = fmaxf(ka, fmaxf(fabsf(rot[0][e]), fabsf(rot[1][e])));
                    va = fmaxf(va, fmaxf(fabsf(vf[0][e]), fabsf(vf[1][e])));
                }
                const unsigned mask = ((1u << PAIRS) - 1u) << (lane & ~(PAIRS - 1));
#pragma unroll
                for (int o = 1; o < PAIRS; o <<= 1) {
                    ka = fmaxf(ka, __shfl_xor_sync(mask, ka, o));
                    va = fmaxf(va, __shfl_xor_sync(mask, va, o));
                }
                const float ki = ka > 0.f ? E4M3_MAX / ka : 0.f, vi = va > 0.f ? E4M3_MAX / va : 0.f;
                uint2* kc = reinterpret_cast<uint2*>(static_cast<fp8*>(k_cache) + head * D);
                uint2* vc = reinterpret_cast<uint2*>(static_cast<fp8*>(v_cache) + head * D);
                kc[i / 8] = codes8(rot[0], ki);
                kc[(HALF + i) / 8] = codes8(rot[1], ki);
                vc[i / 8] = codes8(vf[0], vi);
                vc[(HALF + i) / 8] = codes8(vf[1], vi);
                if (i == 0) {
                    k_scale[head] = ka / E4M3_MAX;
                    v_scale[head] = va / E4M3_MAX;
                }
            } else {
                uint4* kc = reinterpret_cast<uint4*>(static_cast<bf16*>(k_cache) + head * D);
                uint4* vc = reinterpret_cast<uint4*>(static_cast<bf16*>(v_cache) + head * D);
                kc[i / 8] = pack8<false>(rot[0], 1.f);
                kc[(HALF + i) / 8] = pack8<false>(rot[1], 1.f);
                vc[i / 8] = v1;
                vc[(HALF + i) / 8] = v2;
            }
        }
    } else {
        for (int idx = tid; idx < MMA_TQ * D / 8; idx += THREADS) {
            const int r = idx / (D / 8), i = (idx % (D / 8)) * 8;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (r < qlen) {
                const uint4 x = *reinterpret_cast<const uint4*>(
                    qkv + (size_t)(start + r / group) * cols + (kvh * group + r % group) * D + i);
                const unsigned w[4] = {x.x, x.y, x.z, x.w};
                unsigned o4[4];
                // INT8: times K's channel scale (0 at an outlier channel).
                const float* ks = kv_table + kvh * D + i;
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const float s0 = I8 ? qscale * ks[2 * k] : qscale, s1 = I8 ? qscale * ks[2 * k + 1] : qscale;
                    o4[k] = FP8 ? pack_f16(bf2f((bf16)(w[k] & 0xffffu)) * s0, bf2f((bf16)(w[k] >> 16)) * s1)
                                : pack_bf16(bf2f((bf16)(w[k] & 0xffffu)) * s0, bf2f((bf16)(w[k] >> 16)) * s1);
                }
                v = make_uint4(o4[0], o4[1], o4[2], o4[3]);
            }
            *reinterpret_cast<uint4*>(Qs + r * DP + i) = v;
        }
        if constexpr (I8) {
            for (int idx = tid; idx < MMA_TQ * KV_I8_OUTLIERS; idx += THREADS) {
                const int r = idx / KV_I8_OUTLIERS, i = idx % KV_I8_OUTLIERS;
                qout[r][i] = r < qlen ? bf2f(qkv[(size_t)(start + r / group) * cols + (kvh * group + r % group) * D +
                                                 och_k[i]]) * qscale
                                      : 0.f;
            }
        }
    }
    __syncthreads();
    if constexpr (!FP8) {
        if (k_begin < k_end) {
            if (dec) fetch(k_begin, 0, my_r0, MMA_HK, lane, 32);
            else fetch(k_begin, 0, 0, MMA_TK, tid, THREADS);
        }
        cp_async_commit();
    }
    // This warp's 16 query rows: A fragments of Q for every 16-wide slice of D; its key group
    // takes keys [kg · MMA_TK / KG, (kg + 1) · MMA_TK / KG) of each tile (decode: rows 0..15 and
    // keys [16w, 16w + 16)).
    const int kg = dec ? warp : KG > 1 ? warp / 4 : 0, row0 = dec ? 0 : (warp % 4) * 16;
    const bool active = row0 < qlen;  // warp-uniform: idle warps only help with the copies
    // The A fragment of Q's 16-wide slice kk.
    auto q_frag = [&](unsigned* f, int kk) {
        const bf16* base = Qs + (row0 + fr) * DP + kk * 16 + 2 * fq;
        f[0] = *reinterpret_cast<const unsigned*>(base);
        f[1] = *reinterpret_cast<const unsigned*>(base + 8 * DP);
        f[2] = *reinterpret_cast<const unsigned*>(base + 8);
        f[3] = *reinterpret_cast<const unsigned*>(base + 8 * DP + 8);
    };
    // FP8 decode: K's B fragments come from 16-byte loads of raw codes — lane (r, q) takes bytes
    // [64g + 16q, 64g + 16q + 16) of key r, whose word j holds the four values the fragment of
    // slice 4g + j wants (its k = 2q, 2q+1, 2q+8, 2q+9). Q·Kᵀ sums over d in any order, so Q's
    // A fragments take the same permutation of d: slice 4g + j's values of k = 2q, 2q+1 | 2q+8,
    // 2q+9 are Q's d = 64g + 16q + 4j + 0, 1 | 2, 3.
    auto q_frag_perm = [&](unsigned* f, int kk) {
        const bf16* base = Qs + (row0 + fr) * DP + 64 * (kk / 4) + 16 * fq + 4 * (kk % 4);
        f[0] = *reinterpret_cast<const unsigned*>(base);
        f[1] = *reinterpret_cast<const unsigned*>(base + 8 * DP);
        f[2] = *reinterpret_cast<const unsigned*>(base + 2);
        f[3] = *reinterpret_cast<const unsigned*>(base + 8 * DP + 2);
    };
    unsigned qa[Q_SHARED ? 1 : D / 16][4];
    if constexpr (!Q_SHARED) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            if (FP8 && dec) q_frag_perm(qa[kk], kk);
            else q_frag(qa[kk], kk);
        }
    }
    // The two rows this thread holds (transposed: the two query columns 2q, 2q+1 of its C fragments).
    const int ra = TR ? 2 * fq : row0 + fr, rb = TR ? ra + 1 : ra + 8;
    float qo_a[KV_I8_OUTLIERS], qo_b[KV_I8_OUTLIERS];  // INT8: their values at K's outliers
    if constexpr (I8) {
#pragma unroll
        for (int i = 0; i < KV_I8_OUTLIERS; ++i) {
            qo_a[i] = qout[ra][i];
            qo_b[i] = qout[rb][i];
        }
    }
    const int pos_a = (ra < qlen) ? (int)pos[start + ra / group] : -1;
    const int pos_b = (rb < qlen) ? (int)pos[start + rb / group] : -1;
    const int first_pos = pos[start];  // the unit's tokens are consecutive: the smallest position
    float m_a = -CACHET_INF, m_b = -CACHET_INF, l_a = 0.f, l_b = 0.f;
    // Output accumulators: 8-wide blocks of d (transposed: 16-wide blocks of d, two query columns).
    constexpr int NO = TR ? D / 16 : D / 8;
    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    // ldmatrix row addresses of this lane: matrix lane / 8, row lane % 8.
    const int lm = lane >> 3, lr = lane & 7;
    if constexpr (FP8) {
        const int r0 = dec ? my_r0 : 0, nr = dec ? MMA_HK : MMA_TK, me = dec ? lane : tid, nt = dec ? 32 : THREADS;
        if (dec)
            for (int b = 0; b < DEC_STAGES; ++b) lookup(k_begin + b * MMA_TK, b, r0, nr, me);
        __syncthreads();  // every warp holds its Q fragments: the raw stages are free; rows looked up
        auto first = [&](int b) {  // tile b of the range into raw stage b
            if (k_begin + b * MMA_TK >= k_end) return;
            if constexpr (DEC_KERNEL) issue_dec(k_begin + b * MMA_TK, b);
            else issue(k_begin + b * MMA_TK, b, r0, nr, me, nt);
        };
        first(0);
        cp_async_commit();
        first(1);
        cp_async_commit();
        if (dec) {
            first(2);
            cp_async_commit();
        }
    } else if (dec) {
        __syncthreads();  // every warp holds its Q fragments: stage 1 (where Q is) is free
    }

    int t = 0;
    for (int k0 = k_begin; k0 < k_end; k0 += MMA_TK, ++t) {
        const int cur = t & 1, nxt = cur ^ 1;
        const bool more = k0 + MMA_TK < k_end;
        if (dec) {
            // The warp's own rows only: warp-wide barriers.
            if constexpr (FP8) {
                cp_async_wait2();  // this lane's copies of tile t have landed...
                __syncwarp();      // ...and the warp's; it is done with its f16 V rows (tile t - 1)
                if constexpr (!VREG) {
                    dequant_stage(t % DEC_STAGES, my_r0, MMA_HK, lane, 32);
                    __syncwarp();
                }
                // The next copy into this raw stage is issued once the scores have read its K.
            } else {
                __syncwarp();  // the warp is done with its rows of stage nxt (tile t - 1)
                if (more) {
                    lookup(k0 + MMA_TK, nxt, my_r0, MMA_HK, lane);
                    __syncwarp();
                    fetch(k0 + MMA_TK, nxt, my_r0, MMA_HK, lane, 32);
                }
                cp_async_commit();
                cp_async_wait1();
                __syncwarp();
            }
        } else if constexpr (FP8) {
            cp_async_wait1();  // this thread's copies of tile t have landed (t + 1 may be in flight)...
            __syncthreads();   // ...and everyone's; everyone is done with the bf16 tile (tile t - 1)
            dequant_stage(cur, 0, MMA_TK, tid, THREADS);
            __syncthreads();   // the bf16 tile is ready; raw stage cur is free
            if (k0 + 2 * MMA_TK < k_end) issue(k0 + 2 * MMA_TK, cur, 0, MMA_TK, tid, THREADS);
            cp_async_commit();
        } else {
            if (more) lookup(k0 + MMA_TK, nxt, 0, MMA_TK, tid);
            // Everyone is done with stage nxt (the previous tile, or Q) and sees slot_of[nxt].
            __syncthreads();
            if (more) fetch(k0 + MMA_TK, nxt, 0, MMA_TK, tid, THREADS);
            cp_async_commit();
            cp_async_wait1();  // this thread's copies of tile t have landed...
            __syncthreads();   // ...and everyone's
        }
        if (!active) continue;
        const bf16* Ks = stage + (FP8 ? 0 : cur * 2 * TILE);
        const bf16* Vs = (FP8 && dec) ? stage : Ks + TILE;
        const int kn = min(MMA_TK, k_end - k0);
        // The group's keys of the tile in steps of MMA_HK (fewer live score registers: 3 blocks
        // fit an SM).
        const int h_first = dec ? my_r0 : kg * (MMA_TK / KG), h_span = dec ? MMA_HK : MMA_TK / KG;
#pragma unroll
        for (int hh = 0; hh < MMA_TK / KG; hh += MMA_HK) {
            if (hh >= h_span) break;
            const int h = h_first + hh;
            const bf16* Kh = Ks + h * DP;
            const bf16* Vh = Vs + h * DP;
            const int hn = kn - h, kb = k0 + h;  // keys of this half in range; its first key
            if (hn <= 0) continue;
            if constexpr (TR) {
                // S^T = K Q^T: this warp's 16 keys are the MMA's rows, Q's rows its 8 columns (B:
                // Q's fragments of rows r). FP8: A from the raw codes — lane (r, q) reads keys r and
                // r + 8, 16 bytes at the same permuted offsets as the 16-row decode, Q's fragments
                // permuted alike; bf16: A by ldmatrix from the warp's rows of the K tile.
                const int st_buf = t % DEC_STAGES;
                const fp8* rk = raw_dec + st_buf * 2 * MMA_TK * D;
                const int c0 = h + fr, c1 = c0 + 8;
                float st[4] = {0.f, 0.f, 0.f, 0.f};  // [key r | r + 8][query 2q | 2q+1]
                if constexpr (!FP8) {
#pragma unroll
                    for (int kk = 0; kk < D / 16; ++kk) {
                        unsigned a[4];
                        ldmatrix_x4(a, Kh + (lane & 15) * DP + kk * 16 + (lane >> 4) * 8);
                        const unsigned b[2] = {qa[kk][0], qa[kk][2]};
                        mma_bf16(st, a, b);
                    }
                } else {
#pragma unroll
                for (int g = 0; g < D / 64; ++g) {
                    const uint4 w0 = *reinterpret_cast<const uint4*>(rk + c0 * D + ((4 * g + fq) ^ kswz(c0)) * 16);
                    const uint4 w1 = *reinterpret_cast<const uint4*>(rk + c1 * D + ((4 * g + fq) ^ kswz(c1)) * 16);
                    const unsigned x0[4] = {w0.x, w0.y, w0.z, w0.w}, x1[4] = {w1.x, w1.y, w1.z, w1.w};
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const unsigned a[4] = {e4m3x2_f16x2(x0[j] & 0xffffu), e4m3x2_f16x2(x1[j] & 0xffffu),
                                               e4m3x2_f16x2_hi(x0[j]), e4m3x2_f16x2_hi(x1[j])};
                        const unsigned b[2] = {qa[4 * g + j][0], qa[4 * g + j][2]};
                        mma_f16(st, a, b);
                    }
                }
                const float* ksc = raw_scale[st_buf][0];
                const float k0s = ksc[c0], k1s = ksc[c1];
                st[0] *= k0s;
                st[1] *= k0s;
                st[2] *= k1s;
                st[3] *= k1s;
                }
                if (hn < MMA_HK || kb + MMA_HK - 1 > first_pos || (window > 0 && kb + window < ctx_end)) {
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const int c = fr + 8 * i, kp = kb + c;
                        const bool out_a = window > 0 && kp + window <= pos_a;
                        const bool out_b = window > 0 && kp + window <= pos_b;
                        if (c >= hn || kp > pos_a || out_a) st[2 * i] = -CACHET_INF;
                        if (c >= hn || kp > pos_b || out_b) st[2 * i + 1] = -CACHET_INF;
                    }
                }
                // Online softmax of query columns a, b: each over the 8 lanes of its quarter.
                float tmax_a = fmaxf(st[0], st[2]), tmax_b = fmaxf(st[1], st[3]);
#pragma unroll
                for (int x = 4; x < 32; x <<= 1) {
                    tmax_a = fmaxf(tmax_a, __shfl_xor_sync(0xffffffffu, tmax_a, x));
                    tmax_b = fmaxf(tmax_b, __shfl_xor_sync(0xffffffffu, tmax_b, x));
                }
                const float mn_a = fmaxf(m_a, tmax_a), mn_b = fmaxf(m_b, tmax_b);
                const float al_a = (mn_a == -CACHET_INF) ? 1.f : fast_exp2(m_a - mn_a);
                const float al_b = (mn_b == -CACHET_INF) ? 1.f : fast_exp2(m_b - mn_b);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float mn = (e & 1) ? mn_b : mn_a;
                    st[e] = (st[e] == -CACHET_INF) ? 0.f : fast_exp2(st[e] - mn);
                }
                // FP8: each lane sums its own keys' probabilities (the max is the quarter's, so the
                // lanes' sums add up), the 8 lanes of a column summed once after the last tile
                // (LANE_SUMS; bf16 keeps the measured per-tile sums).
                float sum_a = st[0] + st[2], sum_b = st[1] + st[3];
                if constexpr (!LANE_SUMS) {
#pragma unroll
                    for (int x = 4; x < 32; x <<= 1) {
                        sum_a += __shfl_xor_sync(0xffffffffu, sum_a, x);
                        sum_b += __shfl_xor_sync(0xffffffffu, sum_b, x);
                    }
                }
                l_a = l_a * al_a + sum_a;
                l_b = l_b * al_b + sum_b;
                m_a = mn_a;
                m_b = mn_b;
                if (__any_sync(0xffffffffu, al_a != 1.f || al_b != 1.f)) {
#pragma unroll
                    for (int n = 0; n < NO; ++n) {
                        o[n][0] *= al_a;
                        o[n][1] *= al_b;
                        o[n][2] *= al_a;
                        o[n][3] *= al_b;
                    }
                }
                // O^T += V^T P^T. B = P^T: the C fragments of S^T, packed as f16 (bf16) pairs (key
                // r: its two queries), are two 8×8 matrices [key][query] in the layout movmatrix
                // transposes into B's (lane (r, q): keys 2q, 2q+1 of query r). A = V^T, FP8: rows
                // are d permuted so that lane (r, q) reads D/8 consecutive codes of each of its keys
                // 2q, 2q+1, 2q+8, 2q+9 — row r (+8) of 16-wide block n is d = r · D/8 (+ D/16) + n
                // — two keys' codes interleaved by byte permutes, converted, times each key's scale.
                unsigned pb[2];
                {
                    const unsigned p0 = FP8 ? pack_f16(st[0], st[1]) : pack_bf16(st[0], st[1]);
                    const unsigned p1 = FP8 ? pack_f16(st[2], st[3]) : pack_bf16(st[2], st[3]);
                    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(pb[0]) : "r"(p0));
                    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(pb[1]) : "r"(p1));
                }
                if constexpr (FP8) {
                    unsigned lo01[D / 8], lo89[D / 8];
                    v_code_pairs<D>(rk + MMA_TK * D + fr * (D / 8), h + 2 * fq, raw_scale[st_buf][1], lo01, lo89);
#pragma unroll
                    for (int n = 0; n < NO; ++n) {
                        const unsigned a[4] = {lo01[n], lo01[NO + n], lo89[n], lo89[NO + n]};
                        mma_f16(o[n], a, pb);
                    }
                    refill_dec(k0, st_buf);  // the raw stage is read
                } else {
                    // bf16: d in its own order — block n's rows r, r + 8 are d = 16n + r, + 8 — V^T's
                    // fragments by ldmatrix.trans of the warp's rows of the V tile (matrices: keys
                    // 0-7 | 8-15 × d 16n + 0-7 | + 8-15).
#pragma unroll
                    for (int n = 0; n < NO; ++n) {
                        unsigned a[4];
                        ldmatrix_x4_trans(a, Vh + ((lane >> 4) * 8 + (lane & 7)) * DP + n * 16 + ((lane >> 3) & 1) * 8);
                        mma_bf16(o[n], a, pb);
                    }
                }
            } else {
            // S = Q Kᵀ for 2 blocks of 8 keys; one ldmatrix.x4 gives the B fragments of two D slices.
            float s[MMA_HK / 8][4];
            if constexpr (Q_SHARED) {
                // Q's fragments come from shared memory: each slice pair once, for every key block.
#pragma unroll
                for (int nb = 0; nb < MMA_HK / 8; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
#pragma unroll
                for (int kk = 0; kk < D / 16; kk += 2) {
                    unsigned q0[4], q1[4];
                    q_frag(q0, kk);
                    q_frag(q1, kk + 1);
#pragma unroll
                    for (int nb = 0; nb < MMA_HK / 8; ++nb) {
                        unsigned b[4];
                        ldmatrix_x4(b, Kh + (nb * 8 + lr) * DP + kk * 16 + lm * 8);
                        mma_bf16(s[nb], q0, b);
                        mma_bf16(s[nb], q1, b + 2);
                    }
                }
            } else if (FP8 && dec) {
                // K's codes from the raw stage into f16 B fragments (d permuted as Q's), then the
                // stage is free for the tile DEC_STAGES ahead.
                const fp8* rk = raw_dec + (t % DEC_STAGES) * 2 * MMA_TK * D;
#pragma unroll
                for (int nb = 0; nb < MMA_HK / 8; ++nb) {
                    s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
                    const int c = h + nb * 8 + fr;
#pragma unroll
                    for (int g = 0; g < D / 64; ++g) {
                        const uint4 w = *reinterpret_cast<const uint4*>(rk + c * D + ((4 * g + fq) ^ kswz(c)) * 16);
                        const unsigned words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            const unsigned b[2] = {I8 ? i8x2_f16x2(words[j] & 0xffffu) : e4m3x2_f16x2(words[j] & 0xffffu),
                                                   I8 ? i8x2_f16x2(words[j] >> 16) : e4m3x2_f16x2_hi(words[j])};
                            mma_f16(s[nb], qa[4 * g + j], b);
                        }
                    }
                }
                if constexpr (!VREG) refill_dec(k0, t % DEC_STAGES);  // (VREG: V's codes are read after P·V)
            } else {
#pragma unroll
                for (int nb = 0; nb < MMA_HK / 8; ++nb) {
                    s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
#pragma unroll
                    for (int kk = 0; kk < D / 16; kk += 2) {
                        unsigned b[4];
                        ldmatrix_x4(b, Kh + (nb * 8 + lr) * DP + kk * 16 + lm * 8);
                        if constexpr (FP8) {
                            mma_f16(s[nb], qa[kk], b);
                            mma_f16(s[nb], qa[kk + 1], b + 2);
                        } else {
                            mma_bf16(s[nb], qa[kk], b);
                            mma_bf16(s[nb], qa[kk + 1], b + 2);
                        }
                    }
                }
            }
            if constexpr (I8) {
                // K's outlier channels: Q met zeros there; add q[o] · k[o] (rows past the range
                // have zero outliers).
#pragma unroll
                for (int nb = 0; nb < MMA_HK / 8; ++nb) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float4 kv = kout[h + nb * 8 + 2 * fq + e];
                        s[nb][e] += qo_a[0] * kv.x + qo_a[1] * kv.y + qo_a[2] * kv.z + qo_a[3] * kv.w;
                        s[nb][2 + e] += qo_b[0] * kv.x + qo_b[1] * kv.y + qo_b[2] * kv.z + qo_b[3] * kv.w;
                    }
                }
            } else if constexpr (FP8) {
                // Scores of plain K codes times each key's scale (before masking: a row past the
                // range has scale 0, and -inf × 0 would be NaN).
#pragma unroll
                for (int nb = 0; nb < MMA_HK / 8; ++nb) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int c = h + nb * 8 + 2 * fq + e;
                        const float ks = VREG ? raw_scale[t % DEC_STAGES][0][c] : tile_k_scale[c];
                        s[nb][e] *= ks;
                        s[nb][2 + e] *= ks;
                    }
                }
            }
            // Mask (only tiles that reach past the range or the unit's first position), then the
            // online softmax of rows a and b.
            if (hn < MMA_HK || kb + MMA_HK - 1 > first_pos || (window > 0 && kb + window < ctx_end)) {
#pragma unroll
                for (int nb = 0; nb < MMA_HK / 8; ++nb) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int c = nb * 8 + 2 * fq + e;
                        const int kp = kb + c;
                        const bool out_a = window > 0 && kp + window <= pos_a;
                        const bool out_b = window > 0 && kp + window <= pos_b;
                        if (c >= hn || kp > pos_a || out_a) s[nb][e] = -CACHET_INF;
                        if (c >= hn || kp > pos_b || out_b) s[nb][2 + e] = -CACHET_INF;
                    }
                }
            }
            float tmax_a = -CACHET_INF, tmax_b = -CACHET_INF;
#pragma unroll
            for (int nb = 0; nb < MMA_HK / 8; ++nb) {
                tmax_a = fmaxf(tmax_a, fmaxf(s[nb][0], s[nb][1]));
                tmax_b = fmaxf(tmax_b, fmaxf(s[nb][2], s[nb][3]));
            }
            tmax_a = fmaxf(tmax_a, __shfl_xor_sync(0xffffffffu, tmax_a, 1));
            tmax_a = fmaxf(tmax_a, __shfl_xor_sync(0xffffffffu, tmax_a, 2));
            tmax_b = fmaxf(tmax_b, __shfl_xor_sync(0xffffffffu, tmax_b, 1));
            tmax_b = fmaxf(tmax_b, __shfl_xor_sync(0xffffffffu, tmax_b, 2));
            const float mn_a = fmaxf(m_a, tmax_a), mn_b = fmaxf(m_b, tmax_b);
            const float al_a = (mn_a == -CACHET_INF) ? 1.f : fast_exp2(m_a - mn_a);
            const float al_b = (mn_b == -CACHET_INF) ? 1.f : fast_exp2(m_b - mn_b);
            float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
            for (int nb = 0; nb < MMA_HK / 8; ++nb) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float pa = (s[nb][e] == -CACHET_INF) ? 0.f : fast_exp2(s[nb][e] - mn_a);
                    const float pb = (s[nb][2 + e] == -CACHET_INF) ? 0.f : fast_exp2(s[nb][2 + e] - mn_b);
                    s[nb][e] = pa;
                    s[nb][2 + e] = pb;
                    sum_a += pa;
                    sum_b += pb;
                }
            }
            sum_a += __shfl_xor_sync(0xffffffffu, sum_a, 1);
            sum_a += __shfl_xor_sync(0xffffffffu, sum_a, 2);
            sum_b += __shfl_xor_sync(0xffffffffu, sum_b, 1);
            sum_b += __shfl_xor_sync(0xffffffffu, sum_b, 2);
            l_a = l_a * al_a + sum_a;
            l_b = l_b * al_b + sum_b;
            m_a = mn_a;
            m_b = mn_b;
            // Rescale only when some row's max moved (past the first tiles of a long range, rarely).
            if (!RESCALE_SKIP || __any_sync(0xffffffffu, al_a != 1.f || al_b != 1.f)) {
#pragma unroll
                for (int n = 0; n < D / 8; ++n) {
                    o[n][0] *= al_a;
                    o[n][1] *= al_a;
                    o[n][2] *= al_b;
                    o[n][3] *= al_b;
                }
            }
            // O += P V: P's C fragments of key blocks 2j, 2j+1 are the A fragment of key slice j; one
            // ldmatrix.x4.trans gives the B fragments of two 8-wide D blocks.
            if constexpr (VREG) {
                // V's B fragments from the raw stage: lane (r, q) wants V at keys 2q, 2q+1 | 2q+8,
                // 2q+9 of the warp's 16 (P's columns as its C fragments hold them) and, for the
                // 8-wide block n of D, its column r. Columns are a permutation of d chosen so that
                // they are contiguous for the lane: column r of block n is d = r · D/8 + n, so the
                // lane reads D/8 consecutive codes of each of its four keys, and its output column
                // 2q+e of block n is d = (2q+e) · D/8 + n (the writes below). Each key's scale
                // multiplies its codes in f16, as the f16 tile did.
                unsigned lo01[D / 8], lo89[D / 8];
                v_code_pairs<D>(raw_dec + (t % DEC_STAGES) * 2 * MMA_TK * D + MMA_TK * D + fr * (D / 8), h + 2 * fq,
                                raw_scale[t % DEC_STAGES][1], lo01, lo89);
                unsigned pa[4];
                pa[0] = pack_f16(s[0][0], s[0][1]);
                pa[1] = pack_f16(s[0][2], s[0][3]);
                pa[2] = pack_f16(s[1][0], s[1][1]);
                pa[3] = pack_f16(s[1][2], s[1][3]);
#pragma unroll
                for (int n = 0; n < D / 8; ++n) {
                    const unsigned b[2] = {lo01[n], lo89[n]};
                    mma_f16(o[n], pa, b);
                }
                refill_dec(k0, t % DEC_STAGES);  // the raw stage is read
            } else {
#pragma unroll
            for (int j = 0; j < MMA_HK / 16; ++j) {
                unsigned pa[4];
                if constexpr (FP8) {
                    pa[0] = pack_f16(s[2 * j][0], s[2 * j][1]);
                    pa[1] = pack_f16(s[2 * j][2], s[2 * j][3]);
                    pa[2] = pack_f16(s[2 * j + 1][0], s[2 * j + 1][1]);
                    pa[3] = pack_f16(s[2 * j + 1][2], s[2 * j + 1][3]);
                } else {
                    pa[0] = pack_bf16(s[2 * j][0], s[2 * j][1]);
                    pa[1] = pack_bf16(s[2 * j][2], s[2 * j][3]);
                    pa[2] = pack_bf16(s[2 * j + 1][0], s[2 * j + 1][1]);
                    pa[3] = pack_bf16(s[2 * j + 1][2], s[2 * j + 1][3]);
                }
#pragma unroll
                for (int n = 0; n < D / 8; n += 2) {
                    unsigned b[4];
                    ldmatrix_x4_trans(b, Vh + (j * 16 + (lm & 1) * 8 + lr) * DP + (n + (lm >> 1)) * 8);
                    if constexpr (FP8) {
                        mma_f16(o[n], pa, b);
                        mma_f16(o[n + 1], pa, b + 2);
                    } else {
                        mma_bf16(o[n], pa, b);
                        mma_bf16(o[n + 1], pa, b + 2);
                    }
                }
            }
            }  // not VREG
            }  // not TR
        }
    }
    if constexpr (LANE_SUMS) {
        // The transposed tiles' row sums, per lane so far: summed over each column's 8 lanes.
#pragma unroll
        for (int x = 4; x < 32; x <<= 1) {
            l_a += __shfl_xor_sync(0xffffffffu, l_a, x);
            l_b += __shfl_xor_sync(0xffffffffu, l_b, x);
        }
    }
    if (KG > 1 || dec) {
        // Merge the key groups: each thread of a group > 0 leaves its m, l and accumulators in a
        // slot (its row warp's; in decode, its warp's) where the thread of group 0 with the same
        // lane and rows finds them (the stages are free once every warp is past its last tile).
        float* mo = reinterpret_cast<float*>(smem_f);  // [slot][n][4][lane]
        float* ml = mo + 4 * NO * 4 * 32;              // [slot][4][lane]
        const int groups = dec ? 4 : KG;
        const int slot = dec ? warp : warp % 4;
        __syncthreads();
        if (kg > 0 && active) {
#pragma unroll
            for (int n = 0; n < NO; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) mo[((slot * NO + n) * 4 + e) * 32 + lane] = o[n][e];
            ml[(slot * 4 + 0) * 32 + lane] = m_a;
            ml[(slot * 4 + 1) * 32 + lane] = m_b;
            ml[(slot * 4 + 2) * 32 + lane] = l_a;
            ml[(slot * 4 + 3) * 32 + lane] = l_b;
        }
        __syncthreads();
        if (kg > 0 || !active) return;
        for (int g = 1; g < groups; ++g) {
            const int from = dec ? g : slot;
            const float m2a = ml[(from * 4 + 0) * 32 + lane], m2b = ml[(from * 4 + 1) * 32 + lane];
            const float mn_a = fmaxf(m_a, m2a), mn_b = fmaxf(m_b, m2b);
            const float a1 = (m_a == -CACHET_INF) ? 0.f : fast_exp2(m_a - mn_a);
            const float a2 = (m2a == -CACHET_INF) ? 0.f : fast_exp2(m2a - mn_a);
            const float b1 = (m_b == -CACHET_INF) ? 0.f : fast_exp2(m_b - mn_b);
            const float b2 = (m2b == -CACHET_INF) ? 0.f : fast_exp2(m2b - mn_b);
            l_a = l_a * a1 + ml[(from * 4 + 2) * 32 + lane] * a2;
            l_b = l_b * b1 + ml[(from * 4 + 3) * 32 + lane] * b2;
            m_a = mn_a;
            m_b = mn_b;
            // Elements of row a: 0, 1 (transposed: 0, 2); of row b: 2, 3 (1, 3).
#pragma unroll
            for (int n = 0; n < NO; ++n) {
                const float* po = mo + (from * NO + n) * 4 * 32 + lane;
                o[n][0] = o[n][0] * a1 + po[0] * a2;
                o[n][1] = TR ? o[n][1] * b1 + po[32] * b2 : o[n][1] * a1 + po[32] * a2;
                o[n][2] = TR ? o[n][2] * a1 + po[64] * a2 : o[n][2] * b1 + po[64] * b2;
                o[n][3] = o[n][3] * b1 + po[96] * b2;
            }
        }
    }
    const bool has_a = ra < qlen, has_b = rb < qlen;
    if constexpr (I8) {
        // V's channel scales (an outlier channel's table scale is 0: its values are real ones).
        const float* vs = kv_table + (size_t)(n_kv + kvh) * D;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const int dcol = n * 8 + 2 * fq;
            const float s0 = vs[dcol] > 0.f ? vs[dcol] : 1.f, s1 = vs[dcol + 1] > 0.f ? vs[dcol + 1] : 1.f;
            o[n][0] *= s0;
            o[n][1] *= s1;
            o[n][2] *= s0;
            o[n][3] *= s1;
        }
    }
    // Rows a and b out: in bf16 divided by l where the block took the whole key range (one
    // split), else the split's f32 partials and (m, l) for attention_combine_bf16.
    const bool whole = gridDim.z == 1;
    const size_t base = (((size_t)unit * n_kv + kvh) * gridDim.z + split) * MMA_TQ;  // split rows
    const float ia = !whole ? 1.f : l_a > 0.f ? 1.f / l_a : 0.f;
    const float ib = !whole ? 1.f : l_b > 0.f ? 1.f / l_b : 0.f;
    bf16* oa = out + (size_t)(start + ra / group) * n_heads * D + (kvh * group + ra % group) * D;
    bf16* ob = out + (size_t)(start + rb / group) * n_heads * D + (kvh * group + rb % group) * D;
    float* pa = part_o + (base + ra) * D;
    float* pb = part_o + (base + rb) * D;
    if constexpr (TR && !FP8) {
        // o[n][0] is query a's d = 16n + r, o[n][2] its d = 16n + r + 8; o[n][1], o[n][3] query b's.
#pragma unroll
        for (int n = 0; n < NO; ++n) {
#pragma unroll
            for (int h8 = 0; h8 < 2; ++h8) {
                const int d = 16 * n + fr + 8 * h8;
                put_value(has_a, whole, oa + d, pa + d, o[n][2 * h8] * ia);
                put_value(has_b, whole, ob + d, pb + d, o[n][2 * h8 + 1] * ib);
            }
        }
    } else if constexpr (TR) {
        // Query a's d = r · D/8 + [0, D/16) from o[·][0], + D/16 + [0, D/16) from o[·][2]; b's
        // from o[·][1], o[·][3]: D/8 consecutive values of d a query.
        float va[D / 8], vb[D / 8];
#pragma unroll
        for (int n = 0; n < NO; ++n) {
            va[n] = o[n][0];
            va[NO + n] = o[n][2];
            vb[n] = o[n][1];
            vb[NO + n] = o[n][3];
        }
        const int d0 = fr * (D / 8);
        if (has_a) put_run(va, whole, oa + d0, pa + d0, ia);
        if (has_b) put_run(vb, whole, ob + d0, pb + d0, ib);
    } else if constexpr (VREG) {
        // Output column 2q+e of block n is d = (2q+e) · D/8 + n: this lane holds D/8 consecutive
        // values of d for each e.
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            float va[D / 8], vb[D / 8];
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                va[n] = o[n][e];
                vb[n] = o[n][2 + e];
            }
            const int d0 = (2 * fq + e) * (D / 8);
            if (has_a) put_run(va, whole, oa + d0, pa + d0, ia);
            if (has_b) put_run(vb, whole, ob + d0, pb + d0, ib);
        }
    } else {
        // Block n's columns 2q, 2q+1 are d = 8n + 2q, + 1.
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const int d = n * 8 + 2 * fq;
            put_pair(has_a, whole, oa + d, pa + d, o[n][0] * ia, o[n][1] * ia);
            put_pair(has_b, whole, ob + d, pb + d, o[n][2] * ib, o[n][3] * ib);
        }
    }
    // One lane a row (the row's other lanes hold the same m and l); the running max in
    // natural-log units, as the combine expects.
    if (!whole && (TR ? fr : fq) == 0) {
        if (has_a) { part_ml[(base + ra) * 2] = m_a * LN2; part_ml[(base + ra) * 2 + 1] = l_a; }
        if (has_b) { part_ml[(base + rb) * 2] = m_b * LN2; part_ml[(base + rb) * 2 + 1] = l_b; }
    }
}

// Arguments (the same list) and layouts as paged_attention_bf16 (attention.cu), except: `d` is fixed
// by the symbol; `group` = n_heads / n_kv, `sub_tokens` = min(floor(64 / group), 32) tokens per
// block, `units_per_tile` = ceil(longest tile / sub_tokens); grid (num_tiles * units_per_tile, n_kv, splits),
// block of 128 threads (256 for head_dim 256: MMA_KGROUPS), dynamic shared memory 4 * MMA_TK * (D + 8) bf16 (two K/V stages; _fp8: one K/V
// tile of 2 * MMA_TK * (D + 8) bf16 plus 4 * MMA_TK * D bytes of raw stages); split rows are
// indexed [unit, kv head, split, row] with 64 rows per unit, row = token_in_unit * group + head_in_group.
// The _fp8 symbols read an e4m3 cache with its scales (as paged_attention_fp8). `fused` bit 1 puts
// the kv heads on the grid's x (see attention_mma). `fused` bit 0 = 1 (only
// when every sequence of the batch is one unit: units_per_tile = 1 and every tile shorter than 32
// tokens) takes the q and k heads unrotated and does rope_kv's work
// itself: `rope` is rope_kv's cos/sin table, `slots` the tokens' cache slots (0xFFFFFFFF: a
// padding row, written nowhere); with `fused` = 0 they are not read.
// BLOCKS: resident blocks per SM the registers are bounded for — 3 for d64 / d128; 1 for head_dim
// 256 (Gemma 3, bf16 cache), whose Q fragments and output accumulators take twice the registers
// of d128. An FP8 cache at d256 spills and runs on paged_attention_d256_fp8 (attention.cu).
// Whether this block runs attention_mma's decode path (every query row of the block in one 16-row
// MMA block): the test attention_mma makes itself when not specialized.
template <int D, int MODE>
__device__ __forceinline__ bool mma_decode_block(const unsigned* __restrict__ tile_len, int fused, int group,
                                                 int sub_tokens, int units_per_tile) {
    const int unit = (fused & 2) ? gridDim.y - 1 - blockIdx.y : gridDim.x - 1 - blockIdx.x;
    const int tile = unit / units_per_tile, sub = unit % units_per_tile;
    const int ntok = min(sub_tokens, (int)tile_len[tile] - sub * sub_tokens);
    return ntok * group <= MMA_HK;
}
#define MMA_CALL(D, MODE, DECODE)                                                                             \
    attention_mma<D, MODE, DECODE>(qkv, k_cache, v_cache, k_scale, v_scale, pos, tile_seq, tile_start, tile_len, \
                                   block_tables, max_blocks, out, part_o, part_ml, n_heads, n_kv, block_size,   \
                                   scale, split_len, group, sub_tokens, units_per_tile, rope, slots, fused,     \
                                   window, q_norm, k_norm, norm_eps, kv_table)
#define MMA_KERNEL(NAME, D, MODE, KV, BLOCKS)                                                                 \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS * MMA_KGROUPS(D), BLOCKS) NAME(PAGED_ATTENTION_ARGS(KV)) {        \
        wait_for_prior_kernels();                                                                             \
        if constexpr (MMA_SPECIALIZES(D, MODE)) {                                                             \
            if (mma_decode_block<D, MODE>(tile_len, fused, group, sub_tokens, units_per_tile)) {             \
                MMA_CALL(D, MODE, 1);                                                                      \
                return;                                                                                       \
            }                                                                                                 \
        }                                                                                                     \
        MMA_CALL(D, MODE, 0);                                                                             \
    }

// The transposed decode (attention_mma's DECODE 2), for steps whose every block has at most 8
// query rows (a decode step with a GQA group of at most 8): symbols of its own, so their
// registers are bounded for their own occupancy — FP8 cache: four blocks an SM, shared memory of
// mma_fp8_dec_smem_bytes; bf16: three, mma_smem_bytes as the prompt kernel.
#define MMA_DEC_KERNEL(NAME, D, MODE, KV, BLOCKS)                                                        \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS, BLOCKS) NAME(PAGED_ATTENTION_ARGS(KV)) { \
        wait_for_prior_kernels();                                                                       \
        MMA_CALL(D, MODE, 2);                                                                           \
    }

MMA_KERNEL(paged_attention_mma_d128_bf16, 128, 0, bf16, 3)
MMA_KERNEL(paged_attention_mma_d64_bf16, 64, 0, bf16, 3)
MMA_KERNEL(paged_attention_mma_d128_fp8, 128, 1, fp8, 3)
MMA_KERNEL(paged_attention_mma_d64_fp8, 64, 1, fp8, 3)
MMA_KERNEL(paged_attention_mma_d128_int8, 128, 2, fp8, 3)
MMA_KERNEL(paged_attention_mma_d64_int8, 64, 2, fp8, 3)
MMA_DEC_KERNEL(paged_attention_mma_d128_fp8_dec, 128, 1, fp8, 4)
MMA_DEC_KERNEL(paged_attention_mma_d64_fp8_dec, 64, 1, fp8, 4)
MMA_DEC_KERNEL(paged_attention_mma_d128_bf16_dec, 128, 0, bf16, 3)
MMA_DEC_KERNEL(paged_attention_mma_d64_bf16_dec, 64, 0, bf16, 3)
MMA_KERNEL(paged_attention_mma_d256_bf16, 256, 0, bf16, 1)
