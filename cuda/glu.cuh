// One gated linear unit's value, act(gate) * up with act SiLU or GELU (gelu_tanh): one home for
// its float operations, so that the products that apply it in their epilogue (matvec_glu.cu) give
// glu.cu's bits.
#pragma once
#include "common.cuh"

__device__ __forceinline__ float glu_value(float gate, float up, bool gelu) {
    const float a = gelu ? gelu_tanh(gate) : gate / (1.0f + expf(-gate));
    return a * up;
}
