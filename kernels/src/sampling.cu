// Token selection on the GPU, one block per logits row: greedy (argmax, lowest index on ties) or
// temperature + min-p + top-k + top-p sampling with a counter-based random number of (seed, step), so a
// seeded request reproduces. Only the chosen ids leave the GPU.
//
// top-k and top-p are applied as probability thresholds found by bisection (ties at the threshold
// are kept together); the draw then walks the kept tokens in index order.
#include "common.cuh"

#define SAMPLE_THREADS 1024
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

// Count and probability mass of entries with p >= t (block-wide).
__device__ __forceinline__ void mass_above(const float* p, int vocab, float t, float* count, float* mass) {
    float c = 0.f, m = 0.f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        if (p[i] >= t) {
            c += 1.f;
            m += p[i];
        }
    }
    *count = block_sum(c);
    *mass = block_sum(m);
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
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
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
    const float mx = best_v[0];
    if (pr.temperature <= 0.f || pr.top_k == 1) {
        if (tid == 0) out[row] = (unsigned)best_i[0];
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
    // threshold lies in (0, 1]; 40 halvings resolve 2^-40.
    float cnt, mass;
    float lo = pr.min_p > 0.f ? pr.min_p : 0.f;
    if (pr.top_k > 0 && pr.top_k < vocab) {
        float hi = 1.f;
        for (int it = 0; it < 40; ++it) {
            const float mid = 0.5f * (lo + hi);
            mass_above(p, vocab, mid, &cnt, &mass);
            if (cnt >= (float)pr.top_k) lo = mid; else hi = mid;
        }
    }
    if (pr.top_p < 1.f) {
        mass_above(p, vocab, lo, &cnt, &mass);
        const float want = pr.top_p * mass;
        float hi = 1.f;
        for (int it = 0; it < 40; ++it) {
            const float mid = 0.5f * (lo + hi);
            float m2;
            mass_above(p, vocab, mid, &cnt, &m2);
            if (m2 >= want) lo = mid; else hi = mid;
        }
    }
    const float t = lo;
    mass_above(p, vocab, t, &cnt, &mass);
    // Draw u in [0, mass) and find the token by a prefix sum over contiguous chunks.
    const float u = uniform01(pr.seed, pr.step) * mass;
    const int per = (vocab + blockDim.x - 1) / blockDim.x;
    const int c0 = tid * per, c1 = min(vocab, c0 + per);
    float local = 0.f;
    for (int i = c0; i < c1; ++i) if (p[i] >= t) local += p[i];
    chunk_mass[tid] = local;
    __syncthreads();
    if (tid == 0) {
        float acc = 0.f;
        int chosen = best_i[0];
        for (int c = 0; c < (int)blockDim.x; ++c) {
            if (acc + chunk_mass[c] > u) {
                const int a = c * per, b = min(vocab, a + per);
                for (int i = a; i < b; ++i) {
                    if (p[i] < t) continue;
                    acc += p[i];
                    if (acc > u) { chosen = i; break; }
                }
                break;
            }
            acc += chunk_mass[c];
        }
        out[row] = (unsigned)chosen;
    }
}

// The processors' sparse edits, one thread per entry: x <- (x > 0 ? x * pos : x * neg) + add at
// (row[i], token[i]); no (row, token) appears twice, so the writes never race.
//   logits : device, f32 [rows, vocab], edited in place
// Launch: ceil(n / 256) blocks of 256.
extern "C" __global__ void edit_logits_f32(float* __restrict__ logits, const unsigned* __restrict__ row,
                                           const unsigned* __restrict__ token, const float* __restrict__ pos,
                                           const float* __restrict__ neg, const float* __restrict__ add, int n,
                                           int vocab) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float* x = logits + (size_t)row[i] * vocab + token[i];
    const float v = *x;
    // Rounded as the host rounds (no fused multiply-add), so both devices edit alike.
    *x = __fadd_rn(v > 0.f ? __fmul_rn(v, pos[i]) : __fmul_rn(v, neg[i]), add[i]);
}

#define LOGPROB_THREADS 1024
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
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    const size_t row = blockIdx.x;
    const int k = want[row];
    if (k < 0) return;
    const float* x = logits + row * vocab;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
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
    // (value descending, index ascending).
    float pv = CACHET_INF;
    int pi = -1;
    const int rounds = k < MAX_TOP_LOGPROBS ? k : MAX_TOP_LOGPROBS;
    for (int r = 0; r < rounds && r < vocab; ++r) {
        float bv = -CACHET_INF;
        int bi = 0x7fffffff;
        for (int i = tid; i < vocab; i += blockDim.x) {
            const float v = x[i];
            const bool after = v < pv || (v == pv && i > pi);
            if (after && (v > bv || (v == bv && i < bi))) { bv = v; bi = i; }
        }
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
        pv = best_v[0];
        pi = best_i[0];
        if (tid == 0) {
            lp[1 + r] = pv - lse;
            out_id[row * MAX_TOP_LOGPROBS + r] = (unsigned)pi;
        }
    }
}
