// Shared helpers for Cachet's kernels. Compiled by NVRTC with no host or CUDA headers: bf16 is
// carried as its raw 16 bits (`bf16`), converted with the two functions below.
#pragma once

typedef unsigned short bf16;

#define CACHET_INF __int_as_float(0x7f800000)

__device__ __forceinline__ float bf2f(bf16 x) { return __uint_as_float(((unsigned)x) << 16); }

// Round to nearest even; NaN stays NaN.
__device__ __forceinline__ bf16 f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum / max over a block whose size is a multiple of 32; every thread gets the result.
// Starts with a barrier, so it may be called back to back and after writes to shared memory.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = (lane < (int)(blockDim.x >> 5)) ? partial[lane] : 0.f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v) {
    __shared__ float partial_max[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) partial_max[warp] = v;
    __syncthreads();
    v = (lane < (int)(blockDim.x >> 5)) ? partial_max[lane] : -CACHET_INF;
    return warp_max(v);
}
