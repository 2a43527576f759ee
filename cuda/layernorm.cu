// y = (x - mean(x)) / sqrt(var(x) + eps) * w + b over each row (BERT's LayerNorm, after every
// residual add): one thread block per row. The variance is the mean of the centred squares, taken
// in a second pass over the row, as the NumPy backend takes it: E[x²] - E[x]² would cancel
// catastrophically in rows whose mean is large beside their spread.
#include "common.cuh"

extern "C" __global__ void layernorm_f32(const float* __restrict__ x, const float* __restrict__ w,
                                         const float* __restrict__ b, float* __restrict__ y, int ncols, float eps) {
    const float* xr = x + (i64)blockIdx.x * ncols;
    float* yr = y + (i64)blockIdx.x * ncols;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) sum += xr[i];
    const float mean = block_sum(sum) / ncols;
    float squares = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) squares += (xr[i] - mean) * (xr[i] - mean);
    const float s = 1.0f / sqrtf(block_sum(squares) / ncols + eps);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) yr[i] = (xr[i] - mean) * s * w[i] + b[i];
}
