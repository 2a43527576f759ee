// Each (token, choice) pair's expert bias added to its product, in place: y (T, k, n)[t, j] +=
// bias (n_expert, n)[experts[t, j]] (gpt-oss's experts carry biases).
#include "common.cuh"

extern "C" __global__ void moe_bias_f32(float* __restrict__ y, const float* __restrict__ bias,
                                        const int* __restrict__ experts, int pairs, int n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)pairs * n) return;
    y[i] += bias[(i64)experts[i / n] * n + i % n];
}
