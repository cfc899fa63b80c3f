// Token selection on the GPU, one block per logits row: greedy (argmax, lowest index on ties) or
// temperature + min-p + top-k + top-p sampling with a counter-based random number of (seed, step), so a
// seeded request reproduces. Only the chosen ids leave the GPU.
//
// top-k and top-p are applied as probability thresholds found by bisection (ties at the threshold
// are kept together), over a few candidates gathered in shared memory where they fit; the draw
// then walks the kept tokens in index order.
#include "common.cuh"

#define SAMPLE_THREADS 512  // 128 registers a thread: the fast path keeps its 48 bin sums in registers
#define ARGMAX_BATCH 8

struct RowParams {
    float temperature;  // <= 0: greedy
    int top_k;          // <= 0: all
    float top_p;        // >= 1: all
    float min_p;        // <= 0: all
    unsigned long long seed;
    unsigned long long step;
};

__device__ __forceinline__ float uniform01(unsigned long long seed, unsigned long long step) {
    unsigned long long z = seed ^ (step * 0xD1B54A32D192ED03ull) ^ 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (z >> 40) * (1.0f / 16777216.0f);
}

// Block-wide argmax, lowest index on ties: every thread brings its (value, index) and gets the
// block's. Starts with a barrier, so it may follow reads of best_v / best_i by any thread.
__device__ __forceinline__ void block_argmax(float& bv, int& bi, float* best_v, int* best_i) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    __syncthreads();
    if (lane == 0) { best_v[warp] = bv; best_i[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        bv = (lane < (int)(blockDim.x >> 5)) ? best_v[lane] : -CACHET_INF;
        bi = (lane < (int)(blockDim.x >> 5)) ? best_i[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) { best_v[0] = bv; best_i[0] = bi; }
    }
    __syncthreads();
    bv = best_v[0];
    bi = best_i[0];
}

#define SAMPLE_CAP 4096  // candidates the fast path keeps in shared memory
#define SAMPLE_BINS 24   // coarse thresholds of the fast path: within (j+1)^2/36 of the max

// The fast paths' distance from the max of threshold j: fine near the max, up to 16.
__device__ __forceinline__ float bin_dist(int j) { return (float)((j + 1) * (j + 1)) * (1.f / 36.f); }

// Count and mass of entries with p >= t among p[0..n) (block-wide, one reduction).
__device__ __forceinline__ void mass_above_n(const float* p, int n, float t, float* count, float* mass) {
    __shared__ float2 part[32];
    float c = 0.f, m = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        if (p[i] >= t) {
            c += 1.f;
            m += p[i];
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        c += __shfl_xor_sync(0xffffffffu, c, o);
        m += __shfl_xor_sync(0xffffffffu, m, o);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) part[warp] = make_float2(c, m);
    __syncthreads();
    float2 v = lane < (int)(blockDim.x >> 5) ? part[lane] : make_float2(0.f, 0.f);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
        v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
    }
    *count = v.x;
    *mass = v.y;
}

// The token drawn from probabilities p[0..n) (relative to the row's max; entry j is token ids[j],
// or j without ids, in increasing token order): min-p / top-k / top-p thresholds by bisection
// (ties at a threshold kept together), starting from `lo` (a threshold known to keep at least
// what the cuts keep), then the inverse CDF at u over the kept entries in token order. `base`:
// the mass top-p is a share of when there is no top-k (< 0: the mass of p >= lo here).
// Block-wide; every thread gets the token.
__device__ unsigned pick(const float* p, const int* ids, int n, const RowParams& pr, float lo, float base, float u01,
                         float* chunk_mass, unsigned fallback) {
    __shared__ unsigned chosen_s;
    float cnt, mass;
    const bool topk = pr.top_k > 0 && pr.top_k < n;
    if (topk) {
        float hi = 1.f;
        for (int it = 0; it < 40; ++it) {
            const float mid = 0.5f * (lo + hi);
            mass_above_n(p, n, mid, &cnt, &mass);
            if (cnt >= (float)pr.top_k) lo = mid; else hi = mid;
        }
    }
    if (pr.top_p < 1.f) {
        float b = base;
        if (topk || b < 0.f) mass_above_n(p, n, lo, &cnt, &b);
        const float want = pr.top_p * b;
        float hi = 1.f;
        for (int it = 0; it < 40; ++it) {
            const float mid = 0.5f * (lo + hi);
            float m2;
            mass_above_n(p, n, mid, &cnt, &m2);
            if (m2 >= want) lo = mid; else hi = mid;
        }
    }
    const float t = lo;
    mass_above_n(p, n, t, &cnt, &mass);
    // Draw u in [0, mass) and find the entry by a prefix sum over contiguous chunks.
    const float u = u01 * mass;
    const int tid = threadIdx.x;
    const int per = (n + blockDim.x - 1) / blockDim.x;
    const int c0 = tid * per, c1 = min(n, c0 + per);
    float local = 0.f;
    for (int i = c0; i < c1; ++i) if (p[i] >= t) local += p[i];
    chunk_mass[tid] = local;
    __syncthreads();
    if (tid == 0) {
        float acc = 0.f;
        int chosen = -1;
        for (int c = 0; c < (int)blockDim.x && chosen < 0; ++c) {
            if (acc + chunk_mass[c] > u) {
                const int a = c * per, b = min(n, a + per);
                for (int i = a; i < b; ++i) {
                    if (p[i] < t) continue;
                    acc += p[i];
                    if (acc > u) { chosen = i; break; }
                }
                break;
            }
            acc += chunk_mass[c];
        }
        chosen_s = chosen < 0 ? fallback : (ids ? (unsigned)ids[chosen] : (unsigned)chosen);
    }
    __syncthreads();
    return chosen_s;
}

//   logits  : device, f32 [rows, vocab]
//   params  : device, RowParams [rows]
//   scratch : device, f32 [rows, vocab] (probabilities)
//   out     : device, u32 [rows]
// Launch: grid rows, block SAMPLE_THREADS.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_f32(const float* __restrict__ logits,
                                                                       const RowParams* __restrict__ params,
                                                                       float* __restrict__ scratch,
                                                                       unsigned* __restrict__ out, int vocab) {
    wait_for_prior_kernels();
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    __shared__ float chunk_mass[SAMPLE_THREADS];
    const size_t row = blockIdx.x;
    const float* x = logits + row * vocab;
    const RowParams pr = params[row];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // Argmax (lowest index on ties): needed for greedy, and as the max for the softmax.
    // One block reads the whole row, so its loads must be in flight together: 16-byte loads,
    // ARGMAX_BATCH of them per thread before any comparison (a plain loop waits on memory once
    // per element: ~60 µs for a 128k vocabulary on the H200, now a few).
    float bv = -CACHET_INF;
    int bi = 0x7fffffff;
    const bool vec = (vocab & 3) == 0;  // rows start 16-byte aligned
    const int n4 = vec ? vocab >> 2 : 0;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int c0 = 0; c0 < n4; c0 += ARGMAX_BATCH * SAMPLE_THREADS) {
        float4 v[ARGMAX_BATCH];
#pragma unroll
        for (int j = 0; j < ARGMAX_BATCH; ++j) {
            const int c = c0 + j * SAMPLE_THREADS + tid;
            v[j] = c < n4 ? x4[c] : make_float4(-CACHET_INF, -CACHET_INF, -CACHET_INF, -CACHET_INF);
        }
#pragma unroll
        for (int j = 0; j < ARGMAX_BATCH; ++j) {
            const int i = (c0 + j * SAMPLE_THREADS + tid) * 4;
            const float e[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
            for (int q = 0; q < 4; ++q)
                if (e[q] > bv || (e[q] == bv && i + q < bi)) { bv = e[q]; bi = i + q; }
        }
    }
    for (int i = (vec ? vocab : 0) + tid; i < vocab; i += blockDim.x) {  // odd vocabularies
        const float v = x[i];
        if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
    }
    block_argmax(bv, bi, best_v, best_i);
    const float mx = bv;
    if (pr.temperature <= 0.f || pr.top_k == 1) {
        if (tid == 0) out[row] = (unsigned)bi;
        return;
    }
    float* p = scratch + row * vocab;
    for (int i = tid; i < vocab; i += blockDim.x) {
        const float e = __expf((x[i] - mx) / pr.temperature);
        p[i] = e;
    }
    __syncthreads();
    // Thresholds (keep p >= t), as the CPU sampler: min-p and top-k first, then top-p within
    // what they keep. p is relative to the max, so min-p is the threshold itself and every
    // threshold lies in (0, 1].
    //
    // Fast path: one pass counts the mass and number of entries above coarse thresholds
    // (within bin_dist(j), 1/36 .. 16, temperature-scaled logits of the max); the closest that
    // still holds the top-k (or the top-p mass) bounds the candidates,
    // which are gathered in token order into shared memory, and the bisections and the draw run
    // over those few instead of 40 passes over the whole vocabulary each. Rows whose candidates
    // do not fit (very flat distributions, top-p near 1) take the full path.
    __shared__ float cand_p[SAMPLE_CAP];
    __shared__ int cand_i[SAMPLE_CAP];
    __shared__ int scan[32];
    const float lo0 = pr.min_p > 0.f ? pr.min_p : 0.f;
    const bool topk = pr.top_k > 0 && pr.top_k < vocab, topp = pr.top_p < 1.f;
    const float u01 = uniform01(pr.seed, pr.step);
    const unsigned argmax_i = (unsigned)bi;
    if (!topk && !topp) {
        const unsigned c = pick(p, nullptr, vocab, pr, lo0, -1.f, u01, chunk_mass, argmax_i);
        if (tid == 0) out[row] = c;
        return;
    }
    // The thresholds once, in shared memory: counting and gathering compare against the same
    // numbers.
    __shared__ float thr[SAMPLE_BINS];
    if (tid < SAMPLE_BINS) thr[tid] = __expf(-bin_dist(tid));
    __syncthreads();
    float cnt_b[SAMPLE_BINS], mass_b[SAMPLE_BINS];
#pragma unroll
    for (int j = 0; j < SAMPLE_BINS; ++j) { cnt_b[j] = 0.f; mass_b[j] = 0.f; }
    float mass_all = 0.f;
    for (int i = tid; i < vocab; i += blockDim.x) {
        const float v = p[i];
        if (v < lo0) continue;
        mass_all += v;
#pragma unroll
        for (int j = 0; j < SAMPLE_BINS; ++j) {
            if (v >= thr[j]) { cnt_b[j] += 1.f; mass_b[j] += v; }
        }
    }
    mass_all = block_sum(mass_all);
    int bin = -1;
    float want = pr.top_p * mass_all;
#pragma unroll
    for (int j = 0; j < SAMPLE_BINS; ++j) {
        const float c = block_sum(cnt_b[j]);
        const float m = block_sum(mass_b[j]);
        const bool holds = topk ? c >= (float)pr.top_k : m >= want;
        if (bin < 0 && holds && c <= (float)SAMPLE_CAP) bin = j;
        if (bin < 0 && holds) bin = SAMPLE_BINS;  // held, but too many candidates
    }
    if (bin < 0 || bin >= SAMPLE_BINS) {
        const unsigned c = pick(p, nullptr, vocab, pr, lo0, -1.f, u01, chunk_mass, argmax_i);
        if (tid == 0) out[row] = c;
        return;
    }
    const float floor_t = fmaxf(lo0, thr[bin]);
    // Gather p >= floor_t in token order: each thread a contiguous chunk, an exclusive scan of
    // the chunks' counts gives where each writes.
    const int per = (vocab + blockDim.x - 1) / blockDim.x;
    const int c0 = tid * per, c1 = min(vocab, c0 + per);
    int mine = 0;
    for (int i = c0; i < c1; ++i) mine += p[i] >= floor_t;
    int incl = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31) scan[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        int w = lane < (int)(blockDim.x >> 5) ? scan[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        scan[lane] = w;  // inclusive over warps
    }
    __syncthreads();
    int at = (warp > 0 ? scan[warp - 1] : 0) + incl - mine;
    const int ncand = min(scan[(blockDim.x >> 5) - 1], SAMPLE_CAP);
    for (int i = c0; i < c1; ++i) {
        if (p[i] >= floor_t && at < SAMPLE_CAP) {
            cand_p[at] = p[i];
            cand_i[at] = i;
            ++at;
        }
    }
    __syncthreads();
    const unsigned c = pick(cand_p, cand_i, ncand, pr, floor_t, topk ? -1.f : mass_all, u01, chunk_mass, argmax_i);
    if (tid == 0) out[row] = c;
}

// The processors' sparse edits, one thread per entry: x <- (x > 0 ? x * pos : x * neg) + add at
// (row[i], token[i]); no (row, token) appears twice, so the writes never race.
//   logits : device, f32 [rows, vocab], edited in place
// Launch: ceil(n / 256) blocks of 256.
extern "C" __global__ void edit_logits_f32(float* __restrict__ logits, const unsigned* __restrict__ row,
                                           const unsigned* __restrict__ token, const float* __restrict__ pos,
                                           const float* __restrict__ neg, const float* __restrict__ add, int n,
                                           int vocab) {
    wait_for_prior_kernels();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float* x = logits + (size_t)row[i] * vocab + token[i];
    const float v = *x;
    // Rounded as the host rounds (no fused multiply-add), so both devices edit alike.
    *x = __fadd_rn(v > 0.f ? __fmul_rn(v, pos[i]) : __fmul_rn(v, neg[i]), add[i]);
}

// Grammar masks: logits of tokens a row's mask does not allow become -inf. Block i handles row
// rows[i]; bit t % 32 of word t / 32 allows token t.
//   logits : device, f32 [rows, vocab], edited in place
// Launch: grid n masks, block 256.
extern "C" __global__ void mask_logits_f32(float* __restrict__ logits, const unsigned* __restrict__ rows,
                                           const unsigned* __restrict__ bits, int words, int vocab) {
    wait_for_prior_kernels();
    float* x = logits + (size_t)rows[blockIdx.x] * vocab;
    const unsigned* b = bits + (size_t)blockIdx.x * words;
    for (int t = threadIdx.x; t < vocab; t += blockDim.x)
        if (!((b[t >> 5] >> (t & 31)) & 1u)) x[t] = -CACHET_INF;
}

#define LOGPROB_THREADS 512
#define LOGPROB_BINS 12
#define MAX_TOP_LOGPROBS 20

// Log-probabilities (log-softmax of the row) of the chosen token and of the `want[row]` most
// likely tokens (most likely first, lowest index on ties), one block per row; rows with
// want < 0 are skipped. Only these few numbers leave the GPU.
//   logits : device, f32 [rows, vocab]
//   chosen : device, u32 [rows] (the sampler's output)
//   want   : device, i32 [rows]
//   out_lp : device, f32 [rows, 1 + MAX_TOP_LOGPROBS]: chosen, then the top ones
//   out_id : device, u32 [rows, MAX_TOP_LOGPROBS]
// Launch: grid rows, block LOGPROB_THREADS.
extern "C" __global__ void __launch_bounds__(LOGPROB_THREADS) logprobs_f32(const float* __restrict__ logits,
                                                                           const unsigned* __restrict__ chosen,
                                                                           const int* __restrict__ want,
                                                                           float* __restrict__ out_lp,
                                                                           unsigned* __restrict__ out_id, int vocab) {
    wait_for_prior_kernels();
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    const size_t row = blockIdx.x;
    const int k = want[row];
    if (k < 0) return;
    const float* x = logits + row * vocab;
    const int tid = threadIdx.x;
    float m = -CACHET_INF;
    for (int i = tid; i < vocab; i += blockDim.x) m = fmaxf(m, x[i]);
    m = block_max(m);
    float s = 0.f;
    for (int i = tid; i < vocab; i += blockDim.x) s += __expf(x[i] - m);
    s = block_sum(s);
    const float lse = m + __logf(s);
    float* lp = out_lp + row * (1 + MAX_TOP_LOGPROBS);
    if (tid == 0) lp[0] = x[chosen[row]] - lse;
    // The top k, one per round: the largest entry strictly after the previous pick in the order
    // (value descending, index ascending). The rounds scan candidates gathered in shared memory
    // (entries within bin_dist(j) of the max, the smallest j that holds k of them) when they fit,
    // else the whole row.
    __shared__ float cand_v[SAMPLE_CAP];
    __shared__ int cand_i[SAMPLE_CAP];
    __shared__ int ncand_s;
    const int rounds = k < MAX_TOP_LOGPROBS ? k : MAX_TOP_LOGPROBS;
    // Every other threshold of the sampler's: half the registers (a block of 512 threads has
    // 128 a thread, and the kernel must not spill).
    float cnt_b[LOGPROB_BINS];
#pragma unroll
    for (int j = 0; j < LOGPROB_BINS; ++j) cnt_b[j] = 0.f;
    for (int i = tid; i < vocab; i += blockDim.x) {
        const float d = m - x[i];
#pragma unroll
        for (int j = 0; j < LOGPROB_BINS; ++j) cnt_b[j] += d <= bin_dist(2 * j + 1);
    }
    float within = -1.f;
#pragma unroll
    for (int j = 0; j < LOGPROB_BINS; ++j) {
        const float c = block_sum(cnt_b[j]);
        if (within < 0.f && c >= (float)rounds) within = c <= (float)SAMPLE_CAP ? bin_dist(2 * j + 1) : CACHET_INF;
    }
    const bool gathered = within >= 0.f && within < CACHET_INF;
    if (tid == 0) ncand_s = 0;
    __syncthreads();
    if (gathered) {
        for (int i = tid; i < vocab; i += blockDim.x) {
            if (m - x[i] <= within) {
                const int at = atomicAdd(&ncand_s, 1);
                if (at < SAMPLE_CAP) {
                    cand_v[at] = x[i];
                    cand_i[at] = i;
                }
            }
        }
    }
    __syncthreads();
    const int n = gathered ? min(ncand_s, SAMPLE_CAP) : vocab;
    float pv = CACHET_INF;
    int pi = -1;
    for (int r = 0; r < rounds && r < vocab; ++r) {
        float bv = -CACHET_INF;
        int bi = 0x7fffffff;
        for (int e = tid; e < n; e += blockDim.x) {
            const float v = gathered ? cand_v[e] : x[e];
            const int i = gathered ? cand_i[e] : e;
            const bool after = v < pv || (v == pv && i > pi);
            if (after && (v > bv || (v == bv && i < bi))) { bv = v; bi = i; }
        }
        block_argmax(bv, bi, best_v, best_i);
        pv = bv;
        pi = bi;
        if (tid == 0) {
            lp[1 + r] = pv - lse;
            out_id[row * MAX_TOP_LOGPROBS + r] = (unsigned)pi;
        }
    }
}
