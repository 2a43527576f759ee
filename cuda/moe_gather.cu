// The rows of a batch in the grouping moe_sort made: xg (P, n)[i] = x[order[i] / k] when every
// choice of a token reads the same input (x (T, n)), x[order[i]] when each pair has its own
// (x (P, n)); float32, or float16 (rounded to nearest even) for the grouped GEMMs; or x's 8-bit
// form (quantize_q8: values (rows, n) and a step and sum (rows, n / 32) a run) for the grouped
// int8 tensor-core products, quantized before the gather so a token's row is quantized once, not
// once per choice, and the gather moves a byte an element instead of four.
#include "common.cuh"

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(u16* p, float v) { *p = f32_to_f16(v); }

template <class T>
__device__ void moe_gather(const float* x, const int* order, T* xg, int pairs, int n, int k, int x_per_pair) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)pairs * n) return;
    const int pair = order[i / n];
    store(xg + i, x[(i64)(x_per_pair ? pair : pair / k) * n + i % n]);
}

extern "C" __global__ void moe_gather_f32(const float* __restrict__ x, const int* __restrict__ order,
                                          float* __restrict__ xg, int pairs, int n, int k, int x_per_pair) {
    moe_gather<float>(x, order, xg, pairs, n, k, x_per_pair);
}

extern "C" __global__ void moe_gather_f16(const float* __restrict__ x, const int* __restrict__ order,
                                          u16* __restrict__ xg, int pairs, int n, int k, int x_per_pair) {
    moe_gather<u16>(x, order, xg, pairs, n, k, x_per_pair);
}

// One thread a word of 4 values of a grouped row; the row's first n / 32 threads also take a run's scales.
extern "C" __global__ void moe_gather_q8(const u32* __restrict__ xq, const float2* __restrict__ xs,
                                         const int* __restrict__ order, u32* __restrict__ xgq,
                                         float2* __restrict__ xgs, int pairs, int n, int k, int x_per_pair) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x, words = n / 4, runs = n / 32;
    if (i >= (i64)pairs * words) return;
    const i64 row = i / words, w = i % words, pair = order[row], src = x_per_pair ? pair : pair / k;
    xgq[i] = xq[src * words + w];
    if (w < runs) xgs[row * runs + w] = xs[src * runs + w];
}
