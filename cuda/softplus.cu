// y = log(1 + exp(x)), written so that exp cannot overflow.
#include "common.cuh"

extern "C" __global__ void softplus_f32(const float* __restrict__ x, float* __restrict__ y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f) + log1pf(expf(-fabsf(x[i])));
}
