// The RMSNorm's scale of a row, 1 / sqrt(mean(x²) + eps), in every thread of the block: one home
// for its sum, so that the products that normalize their input themselves (matvec_norm_*,
// matvec_q8_norm_*) get rmsnorm.cu's bits. The sum runs as a block of `threads` would run it
// (each thread a strided share, then each warp's sum, then the warps'), whatever blockDim.x is:
// a smaller block plays the larger's warps in turn. threads: a multiple of 32, at most 1024.
#pragma once
#include "common.cuh"

__device__ __forceinline__ float rms_scale(const float* __restrict__ xr, int ncols, float eps, int threads) {
    __shared__ float partial[WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE, nwarps = threads / WARP_SIZE;
    __syncthreads();  // a previous call may still be reading `partial`
    for (int warp = threadIdx.x / WARP_SIZE; warp < nwarps; warp += blockDim.x / WARP_SIZE) {
        float ss = 0.0f;
        for (int i = warp * WARP_SIZE + lane; i < ncols; i += threads) ss += xr[i] * xr[i];
        ss = warp_sum(ss);
        if (lane == 0) partial[warp] = ss;
    }
    __syncthreads();
    return 1.0f / sqrtf(warp_sum(lane < nwarps ? partial[lane] : 0.0f) / ncols + eps);
}
