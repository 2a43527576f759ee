// The logits a grammar forbids set to -inf: row r's token i stays where bit i % 32 of its word
// bits[r * words + i / 32] is set (llguidance's token bitmask), so that a greedy row's argmax is
// taken on the device; tokens past the mask's words (the logits' padding) are forbidden too.
#include "common.cuh"

extern "C" __global__ void mask_logits_f32(const float* __restrict__ x, const u32* __restrict__ bits,
                                           float* __restrict__ y, int n, int words) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (i >= n) return;
    const i64 at = (i64)r * n + i;
    const bool allowed = i < 32 * words && ((bits[(i64)r * words + i / 32] >> (i % 32)) & 1u);
    y[at] = allowed ? x[at] : -F32_INF;
}
