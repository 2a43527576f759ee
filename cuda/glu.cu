// Gated linear units of the feed-forward block: y = act(gate) * up, elementwise.
#include "common.cuh"

extern "C" __global__ void swiglu_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                      float* __restrict__ y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    y[i] = g / (1.0f + expf(-g)) * up[i];
}

// GELU in its tanh approximation, as Gemma was trained with.
extern "C" __global__ void geglu_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                     float* __restrict__ y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    y[i] = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * up[i];
}
