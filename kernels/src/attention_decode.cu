// Decode attention: every batch tile is one token (one query per sequence), so a block serves one
// (sequence, kv head, key split) and all `group` q heads that share the kv head: each K/V row is
// read once per step for the whole GQA group. The work is bound by how fast the cache streams, so
// the block keeps its key range in flight: chunks of DEC_TK keys are copied with cp.async into two
// shared-memory stages (K and V in separate commit groups, two chunks ahead), the block-table
// entries of the whole split staged first so no copy waits on a table read.
//   QK: D / 8 lanes per key, 8 values each (one 16-byte bf16 or 8-byte e4m3 read), the partial dots
//       of the group's heads summed with shuffles; scores in log2 units (q pre-scaled by
//       scale · log2 e), FP8 K's scale applied to the score.
//   softmax: one warp per head over the chunk, online (running max and sum in shared memory).
//   PV: the same lanes own 8 output dims of every head for the keys of their key group; partial
//       sums meet in shared memory at the end.
// Splits are merged by attention_combine_bf16 (units = tiles, y = kv head, group rows of one token);
// part_ml holds the max in natural-log units as every attention kernel's does.
// Arguments: PAGED_ATTENTION_ARGS (attention.cu), tiles of one token each (the host checks), group
// ≤ GM, and split_len ≤ (DEC_MAX_BLOCKS - 1) · block_size keys.
// Launch: grid (num_tiles, n_kv, splits), block DEC_THREADS, dynamic shared memory
//         max(2 stages · 2 · DEC_TK · D · sizeof(value), 4 warps · GM · D · 4) bytes.
#include "common.cuh"

#define DEC_TK 64
#define DEC_THREADS 128
#define DEC_MAX_BLOCKS 512

template <int D, int GM, bool FP8>
__device__ __forceinline__ void attention_decode(
    const bf16* __restrict__ qkv, const void* __restrict__ k_cache, const void* __restrict__ v_cache,
    const float* __restrict__ k_scale, const float* __restrict__ v_scale, const unsigned* __restrict__ pos,
    const unsigned* __restrict__ tile_seq, const unsigned* __restrict__ tile_start,
    const unsigned* __restrict__ block_tables, int max_blocks, bf16* __restrict__ out, float* __restrict__ part_o,
    float* __restrict__ part_ml, int n_heads, int n_kv, int block_size, float scale, int split_len, int group) {
    constexpr int EB = FP8 ? 1 : 2;         // bytes per cached value
    constexpr int ROW = D * EB;             // bytes of one kv head's K (or V) row
    constexpr int CH = ROW / 16;            // 16-byte copies per row
    constexpr int LPK = D / 8;              // lanes per key (8 values each)
    constexpr int KPW = 32 / LPK;           // keys per warp step
    constexpr int KG = DEC_THREADS / LPK;   // key groups of the block (keys per block step)
    constexpr int TILE = DEC_TK * ROW;      // bytes of one K (or V) chunk
    static_assert(GM <= LPK, "a key's lanes write its heads' scores");
    extern __shared__ float smem_f[];
    unsigned char* stage = reinterpret_cast<unsigned char*>(smem_f);  // [2][K chunk | V chunk]
    __shared__ float S[GM][DEC_TK];         // scores, then probabilities (times V's scale for FP8)
    __shared__ float m_s[GM], l_s[GM], alpha_s[GM];
    __shared__ float ksc[2][DEC_TK], vsc[2][DEC_TK];
    __shared__ unsigned blocks_s[DEC_MAX_BLOCKS];

    const int tile = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5, part = lane % LPK;
    const int start = tile_start[tile];
    const unsigned* table = block_tables + (size_t)tile_seq[tile] * max_blocks;
    const int ctx_end = pos[start] + 1;
    const int k_begin = split * split_len;
    const int k_end = min(ctx_end, k_begin + split_len);
    const int first_blk = k_begin / block_size;
    const int n_blk = k_end > k_begin ? (k_end - 1) / block_size - first_blk + 1 : 0;
    for (int i = tid; i < n_blk; i += DEC_THREADS) blocks_s[i] = table[first_blk + i];
    if (tid < GM) {
        m_s[tid] = -CACHET_INF;
        l_s[tid] = 0.f;
    }
    // This lane's 8 dims of each head's query, pre-scaled into log2 units.
    float q[GM][8];
    const size_t cols = (size_t)(n_heads + 2 * n_kv) * D;
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        uint4 w = make_uint4(0, 0, 0, 0);
        if (g < group) w = *reinterpret_cast<const uint4*>(qkv + start * cols + (size_t)(kvh * group + g) * D + part * 8);
        const unsigned ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            q[g][2 * u] = __uint_as_float(ws[u] << 16) * scale * LOG2E;
            q[g][2 * u + 1] = __uint_as_float(ws[u] & 0xffff0000u) * scale * LOG2E;
        }
    }
    __syncthreads();

    const int chunks = (k_end - k_begin + DEC_TK - 1) / DEC_TK;  // ≤ 0: empty split
    const char* kc = static_cast<const char*>(k_cache);
    const char* vc = static_cast<const char*>(v_cache);
    // Copies chunk c into stage c % 2 (K then V, one commit group each; empty groups past the end).
    auto issue = [&](int c) {
        unsigned char* ks = stage + (c & 1) * 2 * TILE;
        unsigned char* vs = ks + TILE;
        const int k0 = k_begin + c * DEC_TK;
        const bool live = c < chunks;
        for (int half = 0; half < 2; ++half) {
            if (live) {
                for (int idx = tid; idx < DEC_TK * CH; idx += DEC_THREADS) {
                    const int key = idx / CH, piece = idx - key * CH, p = k0 + key;
                    const bool in = p < k_end;
                    const int b = in ? p / block_size - first_blk : 0;
                    const size_t row = in ? ((size_t)blocks_s[b] * block_size + p % block_size) * n_kv + kvh : 0;
                    cp_async16((half ? vs : ks) + key * ROW + piece * 16, (half ? vc : kc) + row * ROW + piece * 16,
                               in ? 16 : 0);
                }
                if constexpr (FP8) {
                    if (tid < DEC_TK) {
                        const int p = k0 + tid;
                        const bool in = p < k_end;
                        const int b = in ? p / block_size - first_blk : 0;
                        const size_t row = in ? ((size_t)blocks_s[b] * block_size + p % block_size) * n_kv + kvh : 0;
                        cp_async4(half ? &vsc[c & 1][tid] : &ksc[c & 1][tid], (half ? v_scale : k_scale) + row,
                                  in ? 4 : 0);
                    }
                }
            }
            cp_async_commit();
        }
    };
    issue(0);
    issue(1);

    float acc[GM][8];
#pragma unroll
    for (int g = 0; g < GM; ++g)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;

    for (int c = 0; c < chunks; ++c) {
        const int buf = c & 1, kn = min(DEC_TK, k_end - k_begin - c * DEC_TK);
        const unsigned char* ks = stage + buf * 2 * TILE;
        const unsigned char* vs = ks + TILE;
        asm volatile("cp.async.wait_group 3;\n" ::);  // this chunk's K (its V and the next chunk may be in flight)
        __syncthreads();
        // Scores: warp step j covers keys j · KG + warp · KPW + lane / LPK.
#pragma unroll
        for (int j = 0; j < DEC_TK / KG; ++j) {
            const int key = j * KG + warp * KPW + lane / LPK;
            float kv[8];
            if constexpr (FP8) {
                const uint2 w = *reinterpret_cast<const uint2*>(ks + key * ROW + part * 8);
                const unsigned ws[2] = {w.x, w.y};
#pragma unroll
                for (int u = 0; u < 8; ++u) kv[u] = e4m3f((ws[u >> 2] >> (8 * (u & 3))) & 0xffu);
            } else {
                const uint4 w = *reinterpret_cast<const uint4*>(ks + key * ROW + part * 16);
                const unsigned ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    kv[2 * u] = __uint_as_float(ws[u] << 16);
                    kv[2 * u + 1] = __uint_as_float(ws[u] & 0xffff0000u);
                }
            }
            float dot[GM];
#pragma unroll
            for (int g = 0; g < GM; ++g) {
                float s = 0.f;
#pragma unroll
                for (int u = 0; u < 8; ++u) s += q[g][u] * kv[u];
                dot[g] = s;
            }
#pragma unroll
            for (int o = LPK / 2; o > 0; o >>= 1)
#pragma unroll
                for (int g = 0; g < GM; ++g) dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], o);
            float mine = dot[0];
#pragma unroll
            for (int g = 1; g < GM; ++g) mine = part == g ? dot[g] : mine;
            if (part < GM) {
                if constexpr (FP8) mine *= ksc[buf][key];
                S[part][key] = key < kn ? mine : -CACHET_INF;
            }
        }
        __syncthreads();
        // Online softmax, one warp per head.
        for (int g = warp; g < group; g += DEC_THREADS / 32) {
            const float s0 = S[g][lane], s1 = S[g][lane + 32];
            const float m_old = m_s[g];
            const float m_new = fmaxf(m_old, warp_max(fmaxf(s0, s1)));
            const float p0 = s0 == -CACHET_INF ? 0.f : fast_exp2(s0 - m_new);
            const float p1 = s1 == -CACHET_INF ? 0.f : fast_exp2(s1 - m_new);
            const float sum = warp_sum(p0 + p1);
            if constexpr (FP8) {
                S[g][lane] = p0 * vsc[buf][lane];
                S[g][lane + 32] = p1 * vsc[buf][lane + 32];
            } else {
                S[g][lane] = p0;
                S[g][lane + 32] = p1;
            }
            if (lane == 0) {
                const float alpha = m_new == -CACHET_INF ? 1.f : fast_exp2(m_old - m_new);
                alpha_s[g] = alpha;
                l_s[g] = l_s[g] * alpha + sum;
                m_s[g] = m_new;
            }
        }
        asm volatile("cp.async.wait_group 2;\n" ::);  // this chunk's V
        __syncthreads();
        // P·V: key group tid / LPK takes keys kg, kg + KG, ...; this thread 8 dims of every head.
        float a[GM];
#pragma unroll
        for (int g = 0; g < GM; ++g) a[g] = g < group ? alpha_s[g] : 1.f;
#pragma unroll
        for (int g = 0; g < GM; ++g)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] *= a[g];
        for (int key = tid / LPK; key < kn; key += KG) {
            float vv[8];
            if constexpr (FP8) {
                const uint2 w = *reinterpret_cast<const uint2*>(vs + key * ROW + part * 8);
                const unsigned ws[2] = {w.x, w.y};
#pragma unroll
                for (int u = 0; u < 8; ++u) vv[u] = e4m3f((ws[u >> 2] >> (8 * (u & 3))) & 0xffu);
            } else {
                const uint4 w = *reinterpret_cast<const uint4*>(vs + key * ROW + part * 16);
                const unsigned ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    vv[2 * u] = __uint_as_float(ws[u] << 16);
                    vv[2 * u + 1] = __uint_as_float(ws[u] & 0xffff0000u);
                }
            }
#pragma unroll
            for (int g = 0; g < GM; ++g) {
                const float p = S[g][key];
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[g][i] += p * vv[i];
            }
        }
        __syncthreads();  // the stage and S are free again
        issue(c + 2);
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    // Key groups of a warp meet by shuffles, the four warps in shared memory (the stages' space).
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1)
#pragma unroll
        for (int g = 0; g < GM; ++g)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] += __shfl_xor_sync(0xffffffffu, acc[g][i], o);
    float* red = smem_f;  // [4 warps][GM][D]
    __syncthreads();
    if (lane < LPK) {
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            float4* dst = reinterpret_cast<float4*>(red + (warp * GM + g) * D + part * 8);
            dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
            dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
        }
    }
    __syncthreads();
    const int splits = gridDim.z;
    for (int idx = tid; idx < group * D; idx += DEC_THREADS) {
        const int g = idx / D, i = idx - g * D;
        const float o = red[g * D + i] + red[(GM + g) * D + i] + red[(2 * GM + g) * D + i] + red[(3 * GM + g) * D + i];
        if (splits == 1) {
            const float l = l_s[g];
            out[(size_t)start * n_heads * D + (size_t)(kvh * group + g) * D + i] = f2bf(l > 0.f ? o / l : 0.f);
        } else {
            const size_t row = (((size_t)tile * n_kv + kvh) * splits + split) * group + g;
            part_o[row * D + i] = o;
            if (i == 0) {
                part_ml[row * 2] = m_s[g] == -CACHET_INF ? -CACHET_INF : m_s[g] * LN2;
                part_ml[row * 2 + 1] = l_s[g];
            }
        }
    }
}

#define ATTENTION_DECODE(NAME, D, GM, FP8, KV, MIN_BLOCKS)                                                     \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS, MIN_BLOCKS) NAME(PAGED_ATTENTION_ARGS(KV)) {     \
        attention_decode<D, GM, FP8>(qkv, k_cache, v_cache, k_scale, v_scale, pos, tile_seq, tile_start,       \
                                     block_tables, max_blocks, out, part_o, part_ml, n_heads, n_kv, block_size, \
                                     scale, split_len, group);                                                  \
    }

ATTENTION_DECODE(attention_decode_d128_g4_bf16, 128, 4, false, bf16, 3)
ATTENTION_DECODE(attention_decode_d128_g8_bf16, 128, 8, false, bf16, 2)
ATTENTION_DECODE(attention_decode_d64_g4_bf16, 64, 4, false, bf16, 3)
ATTENTION_DECODE(attention_decode_d64_g8_bf16, 64, 8, false, bf16, 2)
ATTENTION_DECODE(attention_decode_d128_g4_fp8, 128, 4, true, fp8, 3)
ATTENTION_DECODE(attention_decode_d128_g8_fp8, 128, 8, true, fp8, 2)
ATTENTION_DECODE(attention_decode_d64_g4_fp8, 64, 4, true, fp8, 3)
ATTENTION_DECODE(attention_decode_d64_g8_fp8, 64, 8, true, fp8, 2)
