// y = GELU(x) elementwise, in the tanh approximation (gelu_tanh in common.cuh): BERT's feed-forward,
// which has no gate.
#include "common.cuh"

extern "C" __global__ void gelu_f32(const float* __restrict__ x, float* __restrict__ y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = gelu_tanh(x[i]);
}
