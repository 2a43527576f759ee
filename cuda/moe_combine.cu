// The outputs of each token's k experts, weighted and summed: out (T, n)[t] = sum_j weights[t, j] y[t, j]
// for y (T, k, n) and weights (T, k).
#include "common.cuh"

extern "C" __global__ void moe_combine_f32(const float* __restrict__ y, const float* __restrict__ weights,
                                           float* __restrict__ out, int T, int k, int n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)T * n) return;
    const i64 t = i / n, c = i % n;
    float sum = 0.0f;
    for (int j = 0; j < k; j++) sum += weights[t * k + j] * y[(t * k + j) * n + c];
    out[i] = sum;
}
