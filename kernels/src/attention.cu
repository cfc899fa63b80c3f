// Paged causal attention with grouped-query heads over a varlen batch (prefill chunks and decode
// alike), flash-style: a block takes a tile of up to ATT_TQ consecutive query tokens of one
// sequence and one q head, walks the sequence's keys in tiles of ATT_TK through the block table
// (K and V staged in shared memory with coalesced loads), and keeps a running max / sum per query
// row (online softmax), so any context fits in fixed shared memory. For long contexts with few
// query tiles (decode), the key range is split over gridDim.z blocks (flash-decoding); the
// partial results are merged by attention_combine_bf16.
#include "common.cuh"

#define ATT_TQ 32
#define ATT_TK 64
#define ATT_THREADS 128
#define ATT_MAXD 128       // paged_attention_{bf16,fp8}
#define ATT_MAXD_WIDE 256  // paged_attention_d256_{bf16,fp8} (Gemma's head_dim)

// One query tile: tokens [start, start + len) of the flattened batch, all of sequence `seq`.
//   qkv          : device, bf16 [n, (n_heads + 2 * n_kv) * d] (q already rotated)
//   k_cache      : device, bf16 [num_slots, n_kv, d] of this layer (paged_attention_fp8: e4m3)
//   v_cache      : device, bf16 [num_slots, n_kv, d] of this layer (paged_attention_fp8: e4m3)
//   k_scale      : device, f32  [num_slots, n_kv] (paged_attention_fp8 only; value = code * scale)
//   v_scale      : device, f32  [num_slots, n_kv] (paged_attention_fp8 only)
//   pos          : device, u32  [n] position of each token (it attends to keys 0..=pos)
//   tile_seq     : device, u32  [num_tiles]
//   tile_start   : device, u32  [num_tiles]
//   tile_len     : device, u32  [num_tiles] (1..=ATT_TQ)
//   block_tables : device, u32  [num_seqs, max_blocks]
//   out          : device, bf16 [n, n_heads * d], written when gridDim.z == 1
//   part_o       : device, f32  [num_tiles, n_heads, gridDim.z, ATT_TQ, d] when gridDim.z > 1
//   part_ml      : device, f32  [num_tiles, n_heads, gridDim.z, ATT_TQ, 2] (running max, sum)
//   split_len    : keys per split (a multiple of ATT_TK)
//   window       : > 0: a sliding-window layer, query p sees keys p - window + 1 ..= p; 0: all keys
//   group, sub_tokens, units_per_tile : unused here (see attention_mma.cu)
// Launch: grid (num_tiles, n_heads, splits), block ATT_THREADS, dynamic shared memory
//         (ATT_TQ * (d + 1) + 2 * ATT_TK * (d + 1) + ATT_TQ * ATT_TK) floats. d ≤ MAXD: each
//         thread accumulates MAXD / 4 output dims.
// MODE: 0 bf16 cache, 1 FP8, 2 INT8 (the codes times their channel's scale, the outlier
// channels rebuilt from their two bytes; kv_table is the layer's table, common.cuh).
template <int MODE, int MAXD>
__device__ __forceinline__ void paged_attention(
    const bf16* __restrict__ qkv, const void* __restrict__ k_cache, const void* __restrict__ v_cache,
    const float* __restrict__ k_scale, const float* __restrict__ v_scale, const unsigned* __restrict__ pos, const unsigned* __restrict__ tile_seq, const unsigned* __restrict__ tile_start,
    const unsigned* __restrict__ tile_len, const unsigned* __restrict__ block_tables, int max_blocks,
    bf16* __restrict__ out, float* __restrict__ part_o, float* __restrict__ part_ml, int n_heads, int n_kv, int d,
    int block_size, float scale, int split_len, int window, const float* __restrict__ kv_table) {
    constexpr bool FP8 = MODE == 1, INT8 = MODE == 2;
    extern __shared__ float smem[];
    const int dp = d + 1;  // padded row stride: no bank conflicts across rows
    float* Qs = smem;                     // [ATT_TQ][dp]
    float* Ks = Qs + ATT_TQ * dp;         // [ATT_TK][dp]
    float* Vs = Ks + ATT_TK * dp;         // [ATT_TK][dp]
    float* Ss = Vs + ATT_TK * dp;         // [ATT_TQ][ATT_TK]
    __shared__ size_t slot_of[ATT_TK];
    __shared__ float k_sc[ATT_TK], v_sc[ATT_TK];  // FP8: each key's scales
    __shared__ float ch_sc[INT8 ? 2 : 1][INT8 ? MAXD : 1];  // INT8: the head's channel scales (K, V)
    __shared__ int ch_out[2][KV_I8_OUTLIERS];              // INT8: its outlier channels (K, V)
    const int tile = blockIdx.x, h = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
    const int kvh = h / (n_heads / n_kv);
    if constexpr (INT8) {
        for (int i = tid; i < 2 * d; i += ATT_THREADS)
            ch_sc[i / d][i % d] = kv_table[(size_t)((i / d) * n_kv + kvh) * d + i % d];
        if (tid < 2 * KV_I8_OUTLIERS)
            ch_out[tid / KV_I8_OUTLIERS][tid % KV_I8_OUTLIERS] =
                (int)kv_table[(size_t)2 * n_kv * d + ((tid / KV_I8_OUTLIERS) * n_kv + kvh) * KV_I8_OUTLIERS +
                              tid % KV_I8_OUTLIERS];
    }
    const int cols = (n_heads + 2 * n_kv) * d;
    const int start = tile_start[tile], qlen = tile_len[tile];
    const unsigned* table = block_tables + (size_t)tile_seq[tile] * max_blocks;
    const int ctx_end = pos[start + qlen - 1] + 1;  // keys the last query of the tile sees
    const int split_begin = split * split_len;
    // A window: no query of the tile sees keys before the first query's window (whole key tiles
    // below it are skipped; a split wholly below it leaves m = -inf, l = 0 for the combine).
    const int k_begin =
        window > 0 ? max(split_begin, max(0, (int)pos[start] + 1 - window) / ATT_TK * ATT_TK) : split_begin;
    const int k_end = min(ctx_end, split_begin + split_len);

    for (int idx = tid; idx < ATT_TQ * d; idx += ATT_THREADS) {
        const int r = idx / d, i = idx % d;
        Qs[r * dp + i] = (r < qlen) ? bf2f(qkv[(size_t)(start + r) * cols + h * d + i]) * scale : 0.f;
    }
    // Thread layout: row r = tid / 4 of the tile; lane4 = tid % 4 takes keys lane4 + 4j and
    // output dims lane4 + 4k.
    const int r = tid >> 2, lane4 = tid & 3;
    const int my_pos = (r < qlen) ? (int)pos[start + r] : -1;
    float m = -CACHET_INF, l = 0.f;
    float acc[MAXD / 4];
#pragma unroll
    for (int k = 0; k < MAXD / 4; ++k) acc[k] = 0.f;

    for (int k0 = k_begin; k0 < k_end; k0 += ATT_TK) {
        const int kn = min(ATT_TK, k_end - k0);
        __syncthreads();  // previous tile's K/V/S consumed (and Q loaded, the first time)
        if (tid < ATT_TK) {
            const int p = k0 + tid;
            const size_t head = (tid < kn) ? ((size_t)table[p / block_size] * block_size + p % block_size) * n_kv + kvh : 0;
            slot_of[tid] = head * d;
            if constexpr (FP8 || INT8) {
                k_sc[tid] = (tid < kn) ? k_scale[head] : 0.f;
                v_sc[tid] = (tid < kn) ? v_scale[head] : 0.f;
            }
        }
        __syncthreads();
        if constexpr (FP8 || INT8) {
            // 8-byte loads: 8 codes per thread per row chunk (d is a multiple of 8 for these
            // caches). FP8: each code times its key's scale. INT8: times its channel's scale (0
            // at an outlier), then the outliers written over from their two bytes (k_sc / v_sc
            // hold the aux words).
            const int chunks = d >> 3;
            const fp8* kq = static_cast<const fp8*>(k_cache);
            const fp8* vq = static_cast<const fp8*>(v_cache);
            for (int idx = tid; idx < ATT_TK * chunks; idx += ATT_THREADS) {
                const int c = idx / chunks, i = (idx - c * chunks) << 3;
                uint2 kw = make_uint2(0, 0), vw = make_uint2(0, 0);
                if (c < kn) {
                    kw = *reinterpret_cast<const uint2*>(kq + slot_of[c] + i);
                    vw = *reinterpret_cast<const uint2*>(vq + slot_of[c] + i);
                }
                const float ks = k_sc[c], vs = v_sc[c];
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    const unsigned kb = ((u < 4 ? kw.x : kw.y) >> (8 * (u & 3))) & 0xffu;
                    const unsigned vb = ((u < 4 ? vw.x : vw.y) >> (8 * (u & 3))) & 0xffu;
                    if constexpr (INT8) {
                        Ks[c * dp + i + u] = (float)(signed char)kb * ch_sc[0][i + u];
                        Vs[c * dp + i + u] = (float)(signed char)vb * ch_sc[INT8 ? 1 : 0][i + u];
                    } else {
                        Ks[c * dp + i + u] = e4m3f(kb) * ks;
                        Vs[c * dp + i + u] = e4m3f(vb) * vs;
                    }
                }
            }
            if constexpr (INT8) {
                __syncthreads();
                for (int idx = tid; idx < kn * 2 * KV_I8_OUTLIERS; idx += ATT_THREADS) {
                    const int c = idx / (2 * KV_I8_OUTLIERS), w = (idx / KV_I8_OUTLIERS) & 1, o = idx % KV_I8_OUTLIERS;
                    const int ch = ch_out[w][o];
                    const fp8* codes = w ? vq : kq;
                    (w ? Vs : Ks)[c * dp + ch] = i8_outlier(codes[slot_of[c] + ch], __float_as_uint(w ? v_sc[c] : k_sc[c]), o);
                }
            }
        } else if ((d & 7) == 0) {
            const bf16* k_cache16 = static_cast<const bf16*>(k_cache);
            const bf16* v_cache16 = static_cast<const bf16*>(v_cache);
            // 16-byte loads: 8 bf16 per thread per row chunk.
            const int chunks = d >> 3;
            for (int idx = tid; idx < ATT_TK * chunks; idx += ATT_THREADS) {
                const int c = idx / chunks, i = (idx - c * chunks) << 3;
                uint4 kw = make_uint4(0, 0, 0, 0), vw = make_uint4(0, 0, 0, 0);
                if (c < kn) {
                    kw = *reinterpret_cast<const uint4*>(k_cache16 + slot_of[c] + i);
                    vw = *reinterpret_cast<const uint4*>(v_cache16 + slot_of[c] + i);
                }
                const unsigned kk[4] = {kw.x, kw.y, kw.z, kw.w}, vv[4] = {vw.x, vw.y, vw.z, vw.w};
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    Ks[c * dp + i + 2 * u] = __uint_as_float(kk[u] << 16);
                    Ks[c * dp + i + 2 * u + 1] = __uint_as_float(kk[u] & 0xffff0000u);
                    Vs[c * dp + i + 2 * u] = __uint_as_float(vv[u] << 16);
                    Vs[c * dp + i + 2 * u + 1] = __uint_as_float(vv[u] & 0xffff0000u);
                }
            }
        } else {
            const bf16* k_cache16 = static_cast<const bf16*>(k_cache);
            const bf16* v_cache16 = static_cast<const bf16*>(v_cache);
            for (int idx = tid; idx < ATT_TK * d; idx += ATT_THREADS) {
                const int c = idx / d, i = idx - c * d;
                Ks[c * dp + i] = (c < kn) ? bf2f(k_cache16[slot_of[c] + i]) : 0.f;
                Vs[c * dp + i] = (c < kn) ? bf2f(v_cache16[slot_of[c] + i]) : 0.f;
            }
        }
        __syncthreads();
        // Scores of row r against keys lane4 + 4j.
        float tile_max = -CACHET_INF;
#pragma unroll
        for (int j = 0; j < ATT_TK / 4; ++j) {
            const int c = lane4 + 4 * j;
            float s = -CACHET_INF;
            if (c < kn && k0 + c <= my_pos && (window == 0 || k0 + c + window > my_pos)) {
                s = 0.f;
                for (int i = 0; i < d; ++i) s += Qs[r * dp + i] * Ks[c * dp + i];
            }
            Ss[r * ATT_TK + c] = s;
            tile_max = fmaxf(tile_max, s);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float m_new = fmaxf(m, tile_max);
        // A fully masked row so far keeps m = -inf: scale by 1 and add nothing.
        const float alpha = (m_new == -CACHET_INF) ? 1.f : __expf(m - m_new);
        float psum = 0.f;
#pragma unroll
        for (int j = 0; j < ATT_TK / 4; ++j) {
            const int c = lane4 + 4 * j;
            const float s = Ss[r * ATT_TK + c];
            const float p = (s == -CACHET_INF) ? 0.f : __expf(s - m_new);
            Ss[r * ATT_TK + c] = p;
            psum += p;
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        psum += __shfl_xor_sync(0xffffffffu, psum, 2);
        l = l * alpha + psum;
        m = m_new;
        __syncwarp();  // the row's 4 threads share Ss[r]
#pragma unroll
        for (int k = 0; k < MAXD / 4; ++k) acc[k] *= alpha;
        for (int c = 0; c < kn; ++c) {
            const float p = Ss[r * ATT_TK + c];
            const float* vr = Vs + c * dp;
#pragma unroll
            for (int k = 0; k < MAXD / 4; ++k) {
                const int i = lane4 + 4 * k;
                if (i < d) acc[k] += p * vr[i];
            }
        }
    }
    if (r >= qlen) return;
    if (gridDim.z == 1) {
        const float inv = (l > 0.f) ? 1.f / l : 0.f;
        bf16* o = out + (size_t)(start + r) * n_heads * d + h * d;
#pragma unroll
        for (int k = 0; k < MAXD / 4; ++k) {
            const int i = lane4 + 4 * k;
            if (i < d) o[i] = f2bf(acc[k] * inv);
        }
    } else {
        const size_t base = (((size_t)tile * n_heads + h) * gridDim.z + split) * ATT_TQ + r;
#pragma unroll
        for (int k = 0; k < MAXD / 4; ++k) {
            const int i = lane4 + 4 * k;
            if (i < d) part_o[base * d + i] = acc[k];
        }
        if (lane4 == 0) {
            part_ml[base * 2] = m;
            part_ml[base * 2 + 1] = l;
        }
    }
}

// Arguments: PAGED_ATTENTION_ARGS (common.cuh). `group`, `sub_tokens`, `units_per_tile`, `rope`,
// `slots` and `fused` exist so all attention kernels share one signature; this kernel always runs
// one q head per block with rows = tokens (group 1, ATT_TQ tokens, 1 unit per tile), over K/V the
// rope_kv launch has written.
#define PAGED_ATTENTION_CALL                                                                                  \
    qkv, k_cache, v_cache, k_scale, v_scale, pos, tile_seq, tile_start, tile_len, block_tables, max_blocks, out, \
        part_o, part_ml, n_heads, n_kv, d, block_size, scale, split_len, window, kv_table

extern "C" __global__ void __launch_bounds__(ATT_THREADS) paged_attention_bf16(PAGED_ATTENTION_ARGS(bf16)) {
    wait_for_prior_kernels();
    paged_attention<0, ATT_MAXD>(PAGED_ATTENTION_CALL);
}

// As paged_attention_bf16 over an FP8 cache (d a multiple of 8).
extern "C" __global__ void __launch_bounds__(ATT_THREADS) paged_attention_fp8(PAGED_ATTENTION_ARGS(fp8)) {
    wait_for_prior_kernels();
    paged_attention<1, ATT_MAXD>(PAGED_ATTENTION_CALL);
}

// As paged_attention_bf16 over an INT8 cache (d a multiple of 8; `kv_table` the layer's table).
extern "C" __global__ void __launch_bounds__(ATT_THREADS) paged_attention_int8(PAGED_ATTENTION_ARGS(fp8)) {
    wait_for_prior_kernels();
    paged_attention<2, ATT_MAXD>(PAGED_ATTENTION_CALL);
}

// The same for 128 < d ≤ 256 (Gemma), twice the accumulators per thread and (d = 256) 169 KiB of
// shared memory: one block per SM.
extern "C" __global__ void __launch_bounds__(ATT_THREADS) paged_attention_d256_bf16(PAGED_ATTENTION_ARGS(bf16)) {
    wait_for_prior_kernels();
    paged_attention<0, ATT_MAXD_WIDE>(PAGED_ATTENTION_CALL);
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS) paged_attention_d256_fp8(PAGED_ATTENTION_ARGS(fp8)) {
    wait_for_prior_kernels();
    paged_attention<1, ATT_MAXD_WIDE>(PAGED_ATTENTION_CALL);
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS) paged_attention_d256_int8(PAGED_ATTENTION_ARGS(fp8)) {
    wait_for_prior_kernels();
    paged_attention<2, ATT_MAXD_WIDE>(PAGED_ATTENTION_CALL);
}

// Merges the splits of the attention kernels: out = Σ e^(m_s - M) o_s / Σ e^(m_s - M) l_s.
// Block (unit, y, z) covers tokens [tile_start + sub * sub_tokens, +ntok) of batch tile unit /
// units_per_tile (sub = unit % units_per_tile); its rows r are token r / group, q head
// y * group + r % group, and it takes COMBINE_ELEMS of the unit's ntok · group · d outputs from
// z · COMBINE_ELEMS. The CUDA-core kernel uses group 1, sub_tokens ATT_TQ, units_per_tile 1
// (y = q head); the tensor-core kernel its own (y = kv head).
// Four lanes of a warp share each output element, each taking every fourth batch of 16 splits:
// up to 64 splits cost one memory round trip (all of a lane's loads issued before any is used),
// and the four partial merges meet through two shuffles.
//   part_o, part_ml : [units, gridDim.y, splits, unit_rows, d] and [..., 2] (unit_rows: ATT_TQ
//                     for paged_attention_bf16, 64 for the tensor-core kernel)
//   tile_start, tile_len : device, u32 [num_tiles]
//   out : device, bf16 [n, n_heads * d]
// Launch: grid (units, gridDim.y of the attention launch, ceil(rows · d / COMBINE_ELEMS) for the
// most rows a unit has), block COMBINE_THREADS.
#define COMBINE_THREADS 512
#define COMBINE_ELEMS (COMBINE_THREADS / 4)
#define COMBINE_BATCH 16
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS) attention_combine_bf16(
    const float* __restrict__ part_o, const float* __restrict__ part_ml, const unsigned* __restrict__ tile_start,
    const unsigned* __restrict__ tile_len, bf16* __restrict__ out, int n_heads, int d, int splits, int group,
    int sub_tokens, int units_per_tile, int unit_rows) {
    wait_for_prior_kernels();
    const int unit = blockIdx.x, y = blockIdx.y;
    const int tile = unit / units_per_tile, sub = unit % units_per_tile;
    const int start = tile_start[tile] + sub * sub_tokens;
    const int ntok = min(sub_tokens, (int)tile_len[tile] - sub * sub_tokens);
    if (ntok <= 0) return;
    // Lanes 8q..8q+7 of a warp: split group q, elements warp · 8 + lane % 8 of the block's share.
    const int lane = threadIdx.x & 31, sg = lane >> 3;
    const int idx = blockIdx.z * COMBINE_ELEMS + (threadIdx.x >> 5) * 8 + (lane & 7);
    const bool live = idx < ntok * group * d;  // dead lanes still join the shuffles
    const int r = live ? idx / d : 0, i = live ? idx % d : 0;
    const size_t b0 = ((size_t)unit * gridDim.y + y) * splits * unit_rows + r;
    float M = -CACHET_INF, num = 0.f, den = 0.f;
    for (int s0 = sg * COMBINE_BATCH; s0 < splits; s0 += 4 * COMBINE_BATCH) {
        float ms[COMBINE_BATCH], ls[COMBINE_BATCH], os[COMBINE_BATCH];
#pragma unroll
        for (int j = 0; j < COMBINE_BATCH; ++j) {
            const size_t b = b0 + (size_t)min(s0 + j, splits - 1) * unit_rows;
            ms[j] = (live && s0 + j < splits) ? part_ml[b * 2] : -CACHET_INF;
            ls[j] = live ? part_ml[b * 2 + 1] : 0.f;
            os[j] = live ? part_o[b * d + i] : 0.f;
        }
        float m_new = M;
#pragma unroll
        for (int j = 0; j < COMBINE_BATCH; ++j) m_new = fmaxf(m_new, ms[j]);
        if (m_new == -CACHET_INF) continue;
        const float c = __expf(M - m_new);  // M = -inf: 0
        num *= c;
        den *= c;
#pragma unroll
        for (int j = 0; j < COMBINE_BATCH; ++j) {
            const float w = ms[j] == -CACHET_INF ? 0.f : __expf(ms[j] - m_new);
            num += w * os[j];
            den += w * ls[j];
        }
        M = m_new;
    }
    // Merge the four split groups' (M, num, den).
#pragma unroll
    for (int o = 8; o <= 16; o <<= 1) {
        const float M2 = __shfl_xor_sync(0xffffffffu, M, o);
        const float n2 = __shfl_xor_sync(0xffffffffu, num, o);
        const float d2 = __shfl_xor_sync(0xffffffffu, den, o);
        const float Mx = fmaxf(M, M2);
        const float a = M == -CACHET_INF ? 0.f : __expf(M - Mx);
        const float b = M2 == -CACHET_INF ? 0.f : __expf(M2 - Mx);
        num = num * a + n2 * b;
        den = den * a + d2 * b;
        M = Mx;
    }
    if (!live || sg != 0) return;
    const int head = y * group + r % group;
    out[(size_t)(start + r / group) * n_heads * d + head * d + i] = f2bf(den > 0.f ? num / den : 0.f);
}
