// gpt-oss's clamped SwiGLU of its experts, elementwise: with g = min(gate, limit) and
// u = clamp(up, -limit, limit), y = g sigmoid(alpha g) (u + 1).
#include "common.cuh"

extern "C" __global__ void swiglu_oai_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                          float* __restrict__ y, int n, float alpha, float limit) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = fminf(gate[i], limit), u = fminf(fmaxf(up[i], -limit), limit);
    y[i] = g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
}
