// Gated linear units of the feed-forward block: y = act(gate) * up, elementwise, act SiLU or GELU
// (gelu_tanh in common.cuh). The _q8 kernels also quantize y for the down product that takes it
// next (q8_run.cuh; n a multiple of 32).
#include "glu.cuh"
#include "q8_run.cuh"

template <bool gelu>
__device__ __forceinline__ void glu(const float* __restrict__ gate, const float* __restrict__ up, float* __restrict__ y,
                                    int n, i8* __restrict__ xq, float2* __restrict__ xs) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;  // whole warps where xq is given
    const float v = glu_value(gate[i], up[i], gelu);
    y[i] = v;
    if (xq != nullptr) quantize_run(v, i / WARP_SIZE, xq, xs);
}

extern "C" __global__ void swiglu_f32(const float* gate, const float* up, float* y, int n) {
    glu<false>(gate, up, y, n, nullptr, nullptr);
}

extern "C" __global__ void geglu_f32(const float* gate, const float* up, float* y, int n) {
    glu<true>(gate, up, y, n, nullptr, nullptr);
}

extern "C" __global__ void swiglu_q8(const float* gate, const float* up, float* y, int n, i8* xq, float2* xs) {
    glu<false>(gate, up, y, n, xq, xs);
}

extern "C" __global__ void geglu_q8(const float* gate, const float* up, float* y, int n, i8* xq, float2* xs) {
    glu<true>(gate, up, y, n, xq, xs);
}
