// y = a + b, with b (nb elements) repeated along a (n elements): a residual, or a bias per row.
#include "common.cuh"

extern "C" __global__ void add_f32(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y,
                                   int n, int nb) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i % nb];
}
