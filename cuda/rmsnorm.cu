// y = x / sqrt(mean(x²) + eps) * w over each row: one thread block per row (per token, or per
// head when normalizing queries and keys).
#include "common.cuh"

extern "C" __global__ void rmsnorm_f32(const float* __restrict__ x, const float* __restrict__ w,
                                       float* __restrict__ y, int ncols, float eps) {
    const float* xr = x + (i64)blockIdx.x * ncols;
    float* yr = y + (i64)blockIdx.x * ncols;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) ss += xr[i] * xr[i];
    const float s = 1.0f / sqrtf(block_sum(ss) / ncols + eps);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) yr[i] = xr[i] * s * w[i];
}
