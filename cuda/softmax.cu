// Softmax of each row of x (nrows, ncols) scaled by `scale`, over its own span of columns: row r
// keeps columns [max(0, len - window), len) with len = lengths[r] (all of [0, len) when window
// is 0) and the rest become 0. Masked attention scores are rows with causal lengths; softcap > 0
// bounds each scaled score s to softcap tanh(s / softcap) first (Gemma 2). With rows_per_sink > 0,
// sinks[r / rows_per_sink] joins row r's denominator as one more logit, not scaled (gpt-oss's
// attention sinks: the row then sums to less than 1).
//
// One thread block per row; three passes over the row (max, sum, write), which stays in L1/L2.
#include "common.cuh"

extern "C" __global__ void softmax_lengths_f32(const float* __restrict__ x, float* __restrict__ y,
                                               const int* __restrict__ lengths, int ncols, int window,
                                               float scale, float softcap, const float* __restrict__ sinks,
                                               int rows_per_sink) {
    const float* xr = x + (i64)blockIdx.x * ncols;
    float* yr = y + (i64)blockIdx.x * ncols;
    const int end = min(lengths[blockIdx.x], ncols), start = window > 0 ? max(0, end - window) : 0;
    float m = -F32_INF;
    for (int i = start + threadIdx.x; i < end; i += blockDim.x) m = fmaxf(m, soft_capped(xr[i] * scale, softcap));
    const float sink = rows_per_sink > 0 ? sinks[blockIdx.x / rows_per_sink] : -F32_INF;
    m = fmaxf(block_max(m), sink);
    float sum = 0.0f;
    for (int i = start + threadIdx.x; i < end; i += blockDim.x) sum += expf(soft_capped(xr[i] * scale, softcap) - m);
    const float inv = 1.0f / (block_sum(sum) + (rows_per_sink > 0 ? expf(sink - m) : 0.0f));
    for (int i = threadIdx.x; i < ncols; i += blockDim.x)
        yr[i] = i >= start && i < end ? expf(soft_capped(xr[i] * scale, softcap) - m) * inv : 0.0f;
}
