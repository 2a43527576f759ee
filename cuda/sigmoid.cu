// y = 1 / (1 + exp(-x)).
#include "common.cuh"

extern "C" __global__ void sigmoid_f32(const float* __restrict__ x, float* __restrict__ y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 1.0f / (1.0f + expf(-x[i]));
}
