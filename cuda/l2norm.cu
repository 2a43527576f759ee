// y = x / max(|x|, eps) over each row: one thread block per row.
#include "common.cuh"

extern "C" __global__ void l2norm_f32(const float* __restrict__ x, float* __restrict__ y, int ncols, float eps) {
    const float* xr = x + (i64)blockIdx.x * ncols;
    float* yr = y + (i64)blockIdx.x * ncols;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) ss += xr[i] * xr[i];
    const float s = 1.0f / sqrtf(fmaxf(block_sum(ss), eps * eps));
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) yr[i] = xr[i] * s;
}
