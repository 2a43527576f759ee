// Each row of x (rows, n) times its own factor: y[r, i] = x[r, i] s[r] (a gate per token, as
// Qwen2-MoE's shared expert has).
#include "common.cuh"

extern "C" __global__ void scale_rows_f32(const float* __restrict__ x, const float* __restrict__ s,
                                          float* __restrict__ y, int rows, int n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * n) return;
    y[i] = x[i] * s[i / n];
}
