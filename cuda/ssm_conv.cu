// Causal depthwise convolution of Gated DeltaNet layers: x (T, C) continues the K-1 inputs held in
// state (K-1, C); out[t, c] = sum_j w[c, j] * xs[t + j, c] over xs = [state; x], and state becomes
// the last K-1 rows of xs. One thread per channel, which owns its column of the state.
#include "common.cuh"

extern "C" __global__ void ssm_conv_f32(const float* __restrict__ x, float* __restrict__ state,
                                        const float* __restrict__ w, float* __restrict__ out, int T, int C, int K) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const float* wc = w + (i64)c * K;
    // Row r of xs, for r < K - 1 + T.
    auto xs = [&](int r) { return r < K - 1 ? state[(i64)r * C + c] : x[(i64)(r - (K - 1)) * C + c]; };
    for (int t = 0; t < T; t++) {
        float sum = 0.0f;
        for (int j = 0; j < K; j++) sum += wc[j] * xs(t + j);
        out[(i64)t * C + c] = sum;
    }
    for (int r = 0; r < K - 1; r++) state[(i64)r * C + c] = xs(T + r);  // reads only rows >= r: in place is safe
}
