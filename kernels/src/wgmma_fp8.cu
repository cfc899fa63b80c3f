// FP8 products of a few rows on Hopper's warpgroup tensor cores: raw[t, f] = Σ_k x[t, k] · w[f, k]
// over e4m3 codes, summed in f32 and rounded to bf16 — what cuBLASLt's FP8 product gives the
// engine (the scales are applied after, by the caller's launches), for steps of 16–64 padded
// rows. There cuBLASLt takes a fixed ~11 µs for a 4,096 × 4,096 weight whatever the rows, 2.7× the
// time to stream it (BENCHMARKS §12c); such a product is bound by reading W once from DRAM.
//
// A block owns 128 weight rows (two warpgroups of 64) and a range of k (split-K, so that a
// 4,096-row weight still puts a block or two on every SM). Its W rows and the tokens' codes go
// through SK_STAGES stages of shared memory by cp.async, SK_STAGES - 1 stages in flight while the
// tensor cores take the current one: `wgmma.mma_async` m64nNk32 e4m3·e4m3 → f32, both operands from
// shared memory, N = the padded rows (16, 32, 48 or 64), four k32 steps a 128-byte stage.
//
// Shared memory layout: wgmma's K-major layout with the 128-byte swizzle. A stage holds each row's
// 128 bytes of k as one 128-byte line, its 16-byte chunk c at chunk c ^ (row % 8), so the eight
// lanes copying one row's line from global memory (a whole 128-byte line a request: L2 serves
// whole lines, not the half lines an unswizzled core-matrix copy asks for) write one line of
// shared memory without bank conflicts. The descriptor: 8-row groups 1,024 bytes apart, each k32
// step 32 bytes further along the line (the hardware applies the swizzle to the address).
//
// With more than one split, each block writes its f32 partial sums to `partial` [splits, N, F],
// and the last block of a row tile to arrive (a counter per tile, left at zero again) adds the
// splits — in groups whose loads are all in flight together, in the same order whichever block
// finishes last — and writes bf16. With one split the block writes bf16 directly.
//
// Requirements (checked by the host): compiled for sm_90a (elsewhere the kernels trap), F % 128
// == 0, K % 128 == 0, x holding N rows of K codes, w and x 16-byte aligned, blockDim.x ==
// SK_THREADS, dynamic shared memory wgmma_fp8_smem_bytes(N) (its stages and 1 KB to align them
// to 1,024 bytes), gridDim = (F / 128, splits) with splits ≤ K / 128, counters ≥ F / 128 zeros.
#include "common.cuh"

#define SK_BM 128
#define SK_BK 128
#define SK_STAGES 4
#define SK_THREADS 256

__device__ __forceinline__ unsigned sk_smem(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// An f32 read from L2 (not L1: the other blocks' partial sums were written after this SM could
// have cached anything there).
__device__ __forceinline__ float4 sk_ld4_l2(const float* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ void sk_cp16(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

// A K-major descriptor with the 128-byte swizzle: start address, leading byte offset unused (1),
// stride byte offset 1,024 (the next 8 rows), layout type 1 (128-byte swizzle).
__device__ __forceinline__ unsigned long long sk_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3ffff) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
           (1ull << 62);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SK_WGMMA_HEAD(N) "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 "
#define SK_WGMMA_TAIL(A, B) ", %" #A ", %" #B ", 1, 1, 1;\n"

template <int N> __device__ __forceinline__ void sk_wgmma(float (&d)[N / 2], unsigned long long a, unsigned long long b);

template <> __device__ __forceinline__ void sk_wgmma<16>(float (&d)[8], unsigned long long a, unsigned long long b) {
    asm volatile(SK_WGMMA_HEAD(16) "{%0, %1, %2, %3, %4, %5, %6, %7}" SK_WGMMA_TAIL(8, 9)
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(a), "l"(b));
}

template <> __device__ __forceinline__ void sk_wgmma<32>(float (&d)[16], unsigned long long a, unsigned long long b) {
    asm volatile(SK_WGMMA_HEAD(32) "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
                 SK_WGMMA_TAIL(16, 17)
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(a), "l"(b));
}

template <> __device__ __forceinline__ void sk_wgmma<48>(float (&d)[24], unsigned long long a, unsigned long long b) {
    asm volatile(SK_WGMMA_HEAD(48) "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                                   "%16, %17, %18, %19, %20, %21, %22, %23}" SK_WGMMA_TAIL(24, 25)
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
                 : "l"(a), "l"(b));
}

template <> __device__ __forceinline__ void sk_wgmma<64>(float (&d)[32], unsigned long long a, unsigned long long b) {
    asm volatile(SK_WGMMA_HEAD(64) "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                                   "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
                 SK_WGMMA_TAIL(32, 33)
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(a), "l"(b));
}
#endif

// One stage: the block's 128 W rows and the N token rows, 128 bytes of k each, at k-tile `kt`.
// Copy i of a thread: chunk i % 8 of row i / 8, so eight lanes copy one row's whole line.
template <int N>
__device__ __forceinline__ void sk_load_stage(unsigned stage, const unsigned char* __restrict__ w,
                                              const unsigned char* __restrict__ x, int row0, int K, int kt) {
    const int tid = threadIdx.x;
    const size_t k0 = (size_t)kt * SK_BK;
#pragma unroll
    for (int i = 0; i < SK_BM * 8 / SK_THREADS; ++i) {
        const int idx = tid + i * SK_THREADS, c = idx & 7, r = idx >> 3;
        sk_cp16(stage + r * 128 + ((c ^ (r & 7)) << 4), w + (size_t)(row0 + r) * K + k0 + c * 16);
    }
    const unsigned xs = stage + SK_BM * SK_BK;
#pragma unroll
    for (int i = 0; i < (N * 8 + SK_THREADS - 1) / SK_THREADS; ++i) {
        const int idx = tid + i * SK_THREADS;
        if (idx < N * 8) {
            const int c = idx & 7, r = idx >> 3;
            sk_cp16(xs + r * 128 + ((c ^ (r & 7)) << 4), x + (size_t)r * K + k0 + c * 16);
        }
    }
}

template <int N>
__device__ __forceinline__ void wgmma_fp8_body(const unsigned char* __restrict__ w, const unsigned char* __restrict__ x,
                                               bf16* __restrict__ out, float* __restrict__ partial,
                                               unsigned* __restrict__ counters, int F, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char sk_shared[];
    constexpr int STAGE = SK_BM * SK_BK + N * SK_BK;  // a multiple of 1,024 (N % 16 == 0)
    const int tile = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
    const int row0 = tile * SK_BM, kts = K / SK_BK;
    const int kt0 = (int)((long long)split * kts / splits), kt1 = (int)((long long)(split + 1) * kts / splits);
    const int nk = kt1 - kt0;
    // The swizzle is a function of the address: stages start on 1,024-byte boundaries.
    const unsigned base = (sk_smem(sk_shared) + 1023u) & ~1023u;
    const int wg = threadIdx.x >> 7;

    float d[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) d[i] = 0.f;

#pragma unroll
    for (int s = 0; s < SK_STAGES - 1; ++s) {
        if (s < nk) sk_load_stage<N>(base + s * STAGE, w, x, row0, K, kt0 + s);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int it = 0; it < nk; ++it) {
        // Stage `it` has landed for this thread; the fence hands the copies (generic proxy) to
        // the tensor cores (async proxy); the barrier makes that every thread's, and means both
        // warpgroups finished the products of stage it - 1, whose buffer the next copy reuses.
        asm volatile("cp.async.wait_group %0;\n" ::"n"(SK_STAGES - 2));
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        const int next = it + SK_STAGES - 1;
        if (next < nk) sk_load_stage<N>(base + (next % SK_STAGES) * STAGE, w, x, row0, K, kt0 + next);
        asm volatile("cp.async.commit_group;\n" ::);

        const unsigned stage = base + (it % SK_STAGES) * STAGE;
        const unsigned a0 = stage + wg * 64 * SK_BK, b0 = stage + SK_BM * SK_BK;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int j = 0; j < SK_BK / 32; ++j) sk_wgmma<N>(d, sk_desc(a0 + j * 32), sk_desc(b0 + j * 32));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        // The sums are read only after the wait (nothing moves their reads above it).
#pragma unroll
        for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(d[i])::"memory");
    }
    asm volatile("cp.async.wait_group 0;\n" ::);

    // d[4j + r]: weight row 16·warp + lane/4 + 8·(r/2) of the warpgroup's 64, token 8j + 2·(lane%4) + r%2.
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
    const int f0 = row0 + wg * 64 + warp * 16 + (lane >> 2), t0 = 2 * (lane & 3);
    if (splits == 1) {
#pragma unroll
        for (int j = 0; j < N / 8; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r)
                out[(size_t)(8 * j + t0 + (r & 1)) * F + f0 + 8 * (r >> 1)] = f2bf(d[4 * j + r]);
        return;
    }
#pragma unroll
    for (int j = 0; j < N / 8; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r)
            partial[((size_t)split * N + 8 * j + t0 + (r & 1)) * F + f0 + 8 * (r >> 1)] = d[4 * j + r];
    __threadfence();
    __syncthreads();
    __shared__ int sk_last;
    if (threadIdx.x == 0) sk_last = atomicAdd(&counters[tile], 1u) == (unsigned)(splits - 1);
    __syncthreads();
    if (!sk_last) return;
    __threadfence();
    // The tile's sums, 4 features a chunk (chunk c: token c / 32, features 4 · (c % 32)), each
    // thread N / 8 chunks, the splits taken G at a time with all their loads in flight before
    // any add: a fixed order of additions whichever block got here.
    constexpr int CH = N / 8, G = N <= 32 ? 4 : 2;
    float4 acc[CH];
#pragma unroll
    for (int c = 0; c < CH; ++c) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int p0 = 0; p0 < splits; p0 += G) {
        float4 v[CH][G];
#pragma unroll
        for (int q = 0; q < G; ++q)
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                const int chunk = threadIdx.x + c * SK_THREADS;
                v[c][q] = p0 + q < splits ? sk_ld4_l2(partial + ((size_t)(p0 + q) * N + (chunk >> 5)) * F + row0 + 4 * (chunk & 31))
                                          : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            float4 t = v[c][0];
#pragma unroll
            for (int q = 1; q < G; ++q) t = make_float4(t.x + v[c][q].x, t.y + v[c][q].y, t.z + v[c][q].z, t.w + v[c][q].w);
            acc[c] = make_float4(acc[c].x + t.x, acc[c].y + t.y, acc[c].z + t.z, acc[c].w + t.w);
        }
    }
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int chunk = threadIdx.x + c * SK_THREADS;
        const unsigned lo = (unsigned)f2bf(acc[c].x) | ((unsigned)f2bf(acc[c].y) << 16);
        const unsigned hi = (unsigned)f2bf(acc[c].z) | ((unsigned)f2bf(acc[c].w) << 16);
        *(uint2*)(out + (size_t)(chunk >> 5) * F + row0 + 4 * (chunk & 31)) = make_uint2(lo, hi);
    }
    if (threadIdx.x == 0) counters[tile] = 0;
#else
    __trap();
#endif
}

#define WGMMA_FP8_KERNEL(name, N)                                                                           \
    extern "C" __global__ void __launch_bounds__(SK_THREADS) name(                                          \
        const unsigned char* __restrict__ w, const unsigned char* __restrict__ x, bf16* __restrict__ out,   \
        float* __restrict__ partial, unsigned* __restrict__ counters, int F, int K) {                       \
        wait_for_prior_kernels();                                                                           \
        wgmma_fp8_body<N>(w, x, out, partial, counters, F, K);                                              \
    }

WGMMA_FP8_KERNEL(wgmma_fp8_n16, 16)
WGMMA_FP8_KERNEL(wgmma_fp8_n32, 32)
WGMMA_FP8_KERNEL(wgmma_fp8_n48, 48)
WGMMA_FP8_KERNEL(wgmma_fp8_n64, 64)
