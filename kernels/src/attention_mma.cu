// Tensor-core variant of paged_attention_bf16 for head_dim 64 or 128: S = Q·Kᵀ and O += P·V with
// mma.sync m16n8k16 (bf16 in, f32 accumulate). A block of two warps serves one kv head and takes
// 32 query rows (16 per warp): `sub_tokens` consecutive tokens × the `group` q heads that share the
// kv head, so each K/V tile staged in shared memory (bf16) serves the whole GQA group. A batch tile
// of up to 32 tokens is split into `units_per_tile` such units. Fragment layouts follow the PTX ISA for mma.m16n8k16 (.row.col):
//   A (16×16): a0 = (r, 2q..2q+1), a1 = (r+8, 2q..), a2 = (r, 2q+8..), a3 = (r+8, 2q+8..)
//   B (16×8) : b0 = (k = 2q..2q+1, n = r), b1 = (k = 2q+8.., n = r)
//   C (16×8) : c0,c1 = (r, 2q..2q+1), c2,c3 = (r+8, 2q..2q+1)
// with r = lane / 4, q = lane % 4.
#include "common.cuh"

#define MMA_TQ 32
#define MMA_TK 64

__device__ __forceinline__ void mma_bf16(float* c, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    return (unsigned)f2bf(lo) | ((unsigned)f2bf(hi) << 16);
}

template <int D>
__device__ __forceinline__ void attention_mma(const bf16* __restrict__ qkv, const bf16* __restrict__ k_cache,
                                              const bf16* __restrict__ v_cache, const unsigned* __restrict__ pos,
                                              const unsigned* __restrict__ tile_seq,
                                              const unsigned* __restrict__ tile_start,
                                              const unsigned* __restrict__ tile_len,
                                              const unsigned* __restrict__ block_tables, int max_blocks,
                                              bf16* __restrict__ out, float* __restrict__ part_o,
                                              float* __restrict__ part_ml, int n_heads, int n_kv, int block_size,
                                              float scale, int split_len, int group, int sub_tokens,
                                              int units_per_tile) {
    constexpr int DP = D + 8;  // padded bf16 row stride
    extern __shared__ float smem_f[];
    bf16* Qs = reinterpret_cast<bf16*>(smem_f);  // [MMA_TQ][DP]
    bf16* Ks = Qs + MMA_TQ * DP;                 // [MMA_TK][DP]
    bf16* Vs = Ks + MMA_TK * DP;                 // [MMA_TK][DP]
    __shared__ size_t slot_of[MMA_TK];
    const int unit = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int tile = unit / units_per_tile, sub = unit % units_per_tile;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, fr = lane >> 2, fq = lane & 3;
    const int nthreads = blockDim.x;
    const int cols = (n_heads + 2 * n_kv) * D;
    const int start = tile_start[tile] + sub * sub_tokens;
    const int ntok = min(sub_tokens, (int)tile_len[tile] - sub * sub_tokens);
    if (ntok <= 0) return;  // the whole block: no barrier skipped
    const int qlen = ntok * group;  // query rows of this block
    const unsigned* table = block_tables + (size_t)tile_seq[tile] * max_blocks;
    const int ctx_end = pos[start + ntok - 1] + 1;
    const int k_begin = split * split_len;
    const int k_end = min(ctx_end, k_begin + split_len);

    for (int idx = tid; idx < MMA_TQ * D / 2; idx += nthreads) {
        const int r = idx / (D / 2), i = (idx % (D / 2)) * 2;
        unsigned v = 0;
        if (r < qlen) {
            const bf16* src = qkv + (size_t)(start + r / group) * cols + (kvh * group + r % group) * D + i;
            v = pack_bf16(bf2f(src[0]) * scale, bf2f(src[1]) * scale);
        }
        *reinterpret_cast<unsigned*>(Qs + r * DP + i) = v;
    }
    __syncthreads();
    // This warp's 16 query rows: A fragments of Q for every 16-wide slice of D.
    const int row0 = warp * 16;
    unsigned qa[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const bf16* base = Qs + (row0 + fr) * DP + kk * 16 + 2 * fq;
        qa[kk][0] = *reinterpret_cast<const unsigned*>(base);
        qa[kk][1] = *reinterpret_cast<const unsigned*>(base + 8 * DP);
        qa[kk][2] = *reinterpret_cast<const unsigned*>(base + 8);
        qa[kk][3] = *reinterpret_cast<const unsigned*>(base + 8 * DP + 8);
    }
    const int ra = row0 + fr, rb = ra + 8;  // the two rows this thread holds
    const int pos_a = (ra < qlen) ? (int)pos[start + ra / group] : -1;
    const int pos_b = (rb < qlen) ? (int)pos[start + rb / group] : -1;
    float m_a = -CACHET_INF, m_b = -CACHET_INF, l_a = 0.f, l_b = 0.f;
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    for (int k0 = k_begin; k0 < k_end; k0 += MMA_TK) {
        const int kn = min(MMA_TK, k_end - k0);
        __syncthreads();
        if (tid < MMA_TK) {
            const int p = k0 + tid;
            slot_of[tid] = (tid < kn) ? (((size_t)table[p / block_size] * block_size + p % block_size) * n_kv + kvh) * D : 0;
        }
        __syncthreads();
        for (int idx = tid; idx < MMA_TK * (D / 8); idx += nthreads) {
            const int c = idx / (D / 8), i = (idx % (D / 8)) * 8;
            uint4 kw = make_uint4(0, 0, 0, 0), vw = make_uint4(0, 0, 0, 0);
            if (c < kn) {
                kw = *reinterpret_cast<const uint4*>(k_cache + slot_of[c] + i);
                vw = *reinterpret_cast<const uint4*>(v_cache + slot_of[c] + i);
            }
            *reinterpret_cast<uint4*>(Ks + c * DP + i) = kw;
            *reinterpret_cast<uint4*>(Vs + c * DP + i) = vw;
        }
        __syncthreads();
        // S = Q Kᵀ for 8 blocks of 8 keys.
        float s[MMA_TK / 8][4];
#pragma unroll
        for (int nb = 0; nb < MMA_TK / 8; ++nb) {
            s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const bf16* kb = Ks + (nb * 8 + fr) * DP + kk * 16 + 2 * fq;
                unsigned b[2] = {*reinterpret_cast<const unsigned*>(kb), *reinterpret_cast<const unsigned*>(kb + 8)};
                mma_bf16(s[nb], qa[kk], b);
            }
        }
        // Mask, then the online softmax of rows a and b.
        float tmax_a = -CACHET_INF, tmax_b = -CACHET_INF;
#pragma unroll
        for (int nb = 0; nb < MMA_TK / 8; ++nb) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = nb * 8 + 2 * fq + e;
                const int kp = k0 + c;
                if (c >= kn || kp > pos_a) s[nb][e] = -CACHET_INF;
                if (c >= kn || kp > pos_b) s[nb][2 + e] = -CACHET_INF;
                tmax_a = fmaxf(tmax_a, s[nb][e]);
                tmax_b = fmaxf(tmax_b, s[nb][2 + e]);
            }
        }
        tmax_a = fmaxf(tmax_a, __shfl_xor_sync(0xffffffffu, tmax_a, 1));
        tmax_a = fmaxf(tmax_a, __shfl_xor_sync(0xffffffffu, tmax_a, 2));
        tmax_b = fmaxf(tmax_b, __shfl_xor_sync(0xffffffffu, tmax_b, 1));
        tmax_b = fmaxf(tmax_b, __shfl_xor_sync(0xffffffffu, tmax_b, 2));
        const float mn_a = fmaxf(m_a, tmax_a), mn_b = fmaxf(m_b, tmax_b);
        const float al_a = (mn_a == -CACHET_INF) ? 1.f : __expf(m_a - mn_a);
        const float al_b = (mn_b == -CACHET_INF) ? 1.f : __expf(m_b - mn_b);
        float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
        for (int nb = 0; nb < MMA_TK / 8; ++nb) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float pa = (s[nb][e] == -CACHET_INF) ? 0.f : __expf(s[nb][e] - mn_a);
                const float pb = (s[nb][2 + e] == -CACHET_INF) ? 0.f : __expf(s[nb][2 + e] - mn_b);
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
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[n][0] *= al_a;
            o[n][1] *= al_a;
            o[n][2] *= al_b;
            o[n][3] *= al_b;
        }
        // O += P V: P's C fragments of key blocks 2j, 2j+1 are the A fragment of key slice j.
#pragma unroll
        for (int j = 0; j < MMA_TK / 16; ++j) {
            unsigned pa[4] = {pack_bf16(s[2 * j][0], s[2 * j][1]), pack_bf16(s[2 * j][2], s[2 * j][3]),
                              pack_bf16(s[2 * j + 1][0], s[2 * j + 1][1]), pack_bf16(s[2 * j + 1][2], s[2 * j + 1][3])};
            const bf16* v0 = Vs + (j * 16 + 2 * fq) * DP;
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                const int dcol = n * 8 + fr;
                unsigned b[2] = {(unsigned)v0[dcol] | ((unsigned)v0[DP + dcol] << 16),
                                 (unsigned)v0[8 * DP + dcol] | ((unsigned)v0[9 * DP + dcol] << 16)};
                mma_bf16(o[n], pa, b);
            }
        }
    }
    const bool has_a = ra < qlen, has_b = rb < qlen;
    if (gridDim.z == 1) {
        const float ia = (l_a > 0.f) ? 1.f / l_a : 0.f, ib = (l_b > 0.f) ? 1.f / l_b : 0.f;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const int dcol = n * 8 + 2 * fq;
            if (has_a) *reinterpret_cast<unsigned*>(out + (size_t)(start + ra / group) * n_heads * D + (kvh * group + ra % group) * D + dcol) = pack_bf16(o[n][0] * ia, o[n][1] * ia);
            if (has_b) *reinterpret_cast<unsigned*>(out + (size_t)(start + rb / group) * n_heads * D + (kvh * group + rb % group) * D + dcol) = pack_bf16(o[n][2] * ib, o[n][3] * ib);
        }
    } else {
        const size_t base = (((size_t)unit * n_kv + kvh) * gridDim.z + split) * MMA_TQ;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const int dcol = n * 8 + 2 * fq;
            if (has_a) { part_o[(base + ra) * D + dcol] = o[n][0]; part_o[(base + ra) * D + dcol + 1] = o[n][1]; }
            if (has_b) { part_o[(base + rb) * D + dcol] = o[n][2]; part_o[(base + rb) * D + dcol + 1] = o[n][3]; }
        }
        if (fq == 0) {
            if (has_a) { part_ml[(base + ra) * 2] = m_a; part_ml[(base + ra) * 2 + 1] = l_a; }
            if (has_b) { part_ml[(base + rb) * 2] = m_b; part_ml[(base + rb) * 2 + 1] = l_b; }
        }
    }
}

// Arguments (the same list) and layouts as paged_attention_bf16 (attention.cu), except: `d` is fixed
// by the symbol; `group`
// = n_heads / n_kv, `sub_tokens` = floor(32 / group) tokens per block, `units_per_tile` =
// ceil(32 / sub_tokens); grid (num_tiles * units_per_tile, n_kv, splits), block of 64 threads,
// dynamic shared memory (MMA_TQ + 2 * MMA_TK) * (D + 8) bf16; split rows are indexed
// [unit, kv head, split, row] with row = token_in_unit * group + head_in_group.
extern "C" __global__ void __launch_bounds__(64) paged_attention_mma_d128_bf16(
    const bf16* __restrict__ qkv, const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
    const unsigned* __restrict__ pos, const unsigned* __restrict__ tile_seq, const unsigned* __restrict__ tile_start,
    const unsigned* __restrict__ tile_len, const unsigned* __restrict__ block_tables, int max_blocks,
    bf16* __restrict__ out, float* __restrict__ part_o, float* __restrict__ part_ml, int n_heads, int n_kv,
    int /*d = 128*/, int block_size, float scale, int split_len, int group, int sub_tokens, int units_per_tile) {
    attention_mma<128>(qkv, k_cache, v_cache, pos, tile_seq, tile_start, tile_len, block_tables, max_blocks, out,
                       part_o, part_ml, n_heads, n_kv, block_size, scale, split_len, group, sub_tokens, units_per_tile);
}

extern "C" __global__ void __launch_bounds__(64) paged_attention_mma_d64_bf16(
    const bf16* __restrict__ qkv, const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
    const unsigned* __restrict__ pos, const unsigned* __restrict__ tile_seq, const unsigned* __restrict__ tile_start,
    const unsigned* __restrict__ tile_len, const unsigned* __restrict__ block_tables, int max_blocks,
    bf16* __restrict__ out, float* __restrict__ part_o, float* __restrict__ part_ml, int n_heads, int n_kv,
    int /*d = 64*/, int block_size, float scale, int split_len, int group, int sub_tokens, int units_per_tile) {
    attention_mma<64>(qkv, k_cache, v_cache, pos, tile_seq, tile_start, tile_len, block_tables, max_blocks, out,
                      part_o, part_ml, n_heads, n_kv, block_size, scale, split_len, group, sub_tokens, units_per_tile);
}
