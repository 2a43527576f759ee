// The softmax router of a mixture-of-experts layer: for each token t, the k experts of highest
// probability softmax(logits[t]) (ties to the lower index), and their probabilities, scaled to sum
// to 1 when normalize is set (Qwen2-MoE leaves them as they are): experts (T, k) int32, weights (T, k).
//
// One warp per token, as many tokens a block as it has warps: lane l holds experts l, l + 32, ... (at most 32
// each: n_expert <= 1024), and the maximum, the softmax's sum and each of the k picks are warp
// reductions. (A thread per token read the logits k times over, alone: with 128 experts and k = 8
// that was most of a decode step's time.)
#include "common.cuh"

extern "C" __global__ void moe_route_f32(const float* __restrict__ logits, int* __restrict__ experts,
                                         float* __restrict__ weights, int T, int n_expert, int k, int normalize) {
    const int lane = threadIdx.x % WARP_SIZE, t = (blockIdx.x * blockDim.x + threadIdx.x) / WARP_SIZE;
    if (t >= T) return;   // the whole warp: t is the warp's
    const float* l = logits + (i64)t * n_expert;
    float m = -F32_INF;
    for (int e = lane; e < n_expert; e += WARP_SIZE) m = fmaxf(m, l[e]);
    m = warp_max(m);
    float total = 0.0f;
    for (int e = lane; e < n_expert; e += WARP_SIZE) total += expf(l[e] - m);
    total = warp_sum(total);
    u32 taken = 0;   // bit i: this lane's expert lane + 32 i is chosen
    float kept = 0.0f;
    for (int j = 0; j < k; j++) {
        float best = -F32_INF;
        int at = -1;
        for (int i = 0, e = lane; e < n_expert; i++, e += WARP_SIZE)
            if (!((taken >> i) & 1u) && (at < 0 || l[e] > best)) {
                best = l[e];
                at = e;
            }
        for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {   // the larger, or the lower index on a tie
            const float other = __shfl_xor_sync(FULL_MASK, best, offset);
            const int other_at = __shfl_xor_sync(FULL_MASK, at, offset);
            if (other_at >= 0 && (at < 0 || other > best || (other == best && other_at < at))) {
                best = other;
                at = other_at;
            }
        }
        if (at % WARP_SIZE == lane) taken |= 1u << (at / WARP_SIZE);
        const float p = expf(best - m) / total;
        kept += p;
        if (lane == 0) {
            experts[(i64)t * k + j] = at;
            weights[(i64)t * k + j] = p;
        }
    }
    if (normalize && lane == 0)
        for (int j = 0; j < k; j++) weights[(i64)t * k + j] /= kept;
}
