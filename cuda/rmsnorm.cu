// y = x / sqrt(mean(x²) + eps) * w over each row: one thread block per row (per token, or per
// head when normalizing queries and keys). rmsnorm_q8 also quantizes y for the integer products
// that take it next (q8_run.cuh; rows of a multiple of 32), saving quantize_q8's launch.
#include "q8_run.cuh"
#include "rms_scale.cuh"

extern "C" __global__ void rmsnorm_f32(const float* __restrict__ x, const float* __restrict__ w,
                                       float* __restrict__ y, int ncols, float eps) {
    const float* xr = x + (i64)blockIdx.x * ncols;
    float* yr = y + (i64)blockIdx.x * ncols;
    const float s = rms_scale(xr, ncols, eps, blockDim.x);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) yr[i] = xr[i] * s * w[i];
}

// Whole warps in every pass of the loop: ncols and blockDim.x are multiples of 32.
extern "C" __global__ void rmsnorm_q8(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                                      i8* __restrict__ xq, float2* __restrict__ xs, int ncols, float eps) {
    const i64 row = (i64)blockIdx.x * ncols;
    const float s = rms_scale(x + row, ncols, eps, blockDim.x);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float v = x[row + i] * s * w[i];
        y[row + i] = v;
        quantize_run(v, (row + i) / WARP_SIZE, xq, xs);
    }
}
