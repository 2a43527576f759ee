// The grouped products back in pair order: y (P, n)[order[i]] = yg (P, n)[i], for moe_bias and
// moe_combine to take as the pair-by-pair product's output.
#include "common.cuh"

extern "C" __global__ void moe_scatter_f32(const float* __restrict__ yg, const int* __restrict__ order,
                                           float* __restrict__ y, int pairs, int n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)pairs * n) return;
    y[(i64)order[i / n] * n + i % n] = yg[i];
}
