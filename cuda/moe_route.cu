// The softmax router of a mixture-of-experts layer: for each token t, the k experts of highest
// probability softmax(logits[t]) (ties to the lower index), and their probabilities, scaled to sum
// to 1 when normalize is set (Qwen2-MoE leaves them as they are): experts (T, k) int32, weights (T, k).
//
// One thread per token: the experts of a layer number in the tens to hundreds, and k is small.
#include "common.cuh"

extern "C" __global__ void moe_route_f32(const float* __restrict__ logits, int* __restrict__ experts,
                                         float* __restrict__ weights, int T, int n_expert, int k, int normalize) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const float* l = logits + (i64)t * n_expert;
    int* chosen = experts + (i64)t * k;
    float* p = weights + (i64)t * k;
    float m = -F32_INF;
    for (int e = 0; e < n_expert; e++) m = fmaxf(m, l[e]);
    float total = 0.0f;
    for (int e = 0; e < n_expert; e++) total += expf(l[e] - m);
    float kept = 0.0f;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n_expert; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= chosen[i] == e;
            if (!taken && (best < 0 || l[e] > l[best])) best = e;
        }
        chosen[j] = best;
        p[j] = expf(l[best] - m) / total;
        kept += p[j];
    }
    if (normalize)
        for (int j = 0; j < k; j++) p[j] /= kept;
}
