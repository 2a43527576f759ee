// The index of the largest element of each row of x (R, n) (the first, on ties, as NumPy's argmax),
// one thread block per row, so that greedy sampling of R sequences moves R ints to the host.
#include "common.cuh"

// The better of two candidates: the larger value, then the smaller index.
__device__ __forceinline__ void keep_best(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

extern "C" __global__ void argmax_rows_f32(const float* __restrict__ x, int n, int* __restrict__ out) {
    __shared__ float best_v[WARP_SIZE];
    __shared__ int best_i[WARP_SIZE];
    float v = -F32_INF;
    int idx = n;
    x += (i64)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) keep_best(v, idx, x[i], i);
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1)
        keep_best(v, idx, __shfl_xor_sync(FULL_MASK, v, offset), __shfl_xor_sync(FULL_MASK, idx, offset));
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    if (lane == 0) {
        best_v[warp] = v;
        best_i[warp] = idx;
    }
    __syncthreads();
    if (warp != 0) return;
    v = lane < (int)(blockDim.x / WARP_SIZE) ? best_v[lane] : -F32_INF;
    idx = lane < (int)(blockDim.x / WARP_SIZE) ? best_i[lane] : n;
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1)
        keep_best(v, idx, __shfl_xor_sync(FULL_MASK, v, offset), __shfl_xor_sync(FULL_MASK, idx, offset));
    if (lane == 0) out[blockIdx.x] = idx < n ? idx : 0;
}
