// y = cap * tanh(x / cap): x bounded to (-cap, cap) smoothly, as Gemma 2 caps its final logits.
#include "common.cuh"

extern "C" __global__ void softcap_f32(const float* __restrict__ x, float* __restrict__ y, int n, float cap) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = soft_capped(x[i], cap);
}
