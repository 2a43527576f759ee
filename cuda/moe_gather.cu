// The rows of a batch in the grouping moe_sort made: xg (P, n)[i] = x[order[i] / k] when every
// choice of a token reads the same input (x (T, n)), x[order[i]] when each pair has its own
// (x (P, n)); float32, or float16 (rounded to nearest even) for the grouped GEMMs.
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
