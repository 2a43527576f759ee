// Causal depthwise convolution of Gated DeltaNet layers over runs of a batch: run r is the T tokens
// [r T, (r + 1) T) of x (R T, C), all of cache slot s = slots[r T], continuing the K-1 inputs held in
// state[s] (K-1, C); out[t, c] = sum_j w[c, j] * xs[t + j, c] over xs = [state[s]; run's x], and
// state[s] becomes the last K-1 rows of xs. Decode is R runs of one token; a prompt chunk is one
// run. The slot is read from device memory, so a captured decode step replays for other rows.
//
// Grid (C / 128, R): one thread per (run, channel), which owns its column of the slot's state.
#include "common.cuh"

extern "C" __global__ void ssm_conv_f32(const float* __restrict__ x, float* __restrict__ state,
                                        const float* __restrict__ w, float* __restrict__ out,
                                        const int* __restrict__ slots, int T, int C, int K) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, run = blockIdx.y;
    if (c >= C) return;
    const i64 t0 = (i64)run * T;
    const float* xr = x + t0 * C;
    float* s = state + (i64)slots[t0] * (K - 1) * C;
    const float* wc = w + (i64)c * K;
    // Row r of xs, for r < K - 1 + T.
    auto xs = [&](int r) { return r < K - 1 ? s[(i64)r * C + c] : xr[(i64)(r - (K - 1)) * C + c]; };
    for (int t = 0; t < T; t++) {
        float sum = 0.0f;
        for (int j = 0; j < K; j++) sum += wc[j] * xs(t + j);
        out[(t0 + t) * C + c] = sum;
    }
    for (int r = 0; r < K - 1; r++) s[(i64)r * C + c] = xs(T + r);  // reads only rows >= r: in place is safe
}
