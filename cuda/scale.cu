// y = x * s.
#include "common.cuh"

extern "C" __global__ void scale_f32(const float* __restrict__ x, float* __restrict__ y, int n, float s) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * s;
}
