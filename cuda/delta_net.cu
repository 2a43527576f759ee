// The gated delta rule of Gated DeltaNet over T tokens. Value head h (reading key head h % Hk)
// keeps a state S (dv, dk); per token, with decay exp(g) and strength beta:
//     S <- exp(g) S;   S <- S + beta (v - S k) kᵀ;   out = S q.
// Row i of S only ever needs v[i] and the shared k, q: one warp per (head, row) runs the tokens in
// order with its row in registers (lane l holds columns l, l + 32, ...), which is exactly the
// sequential recurrence.
#include "common.cuh"

#define DELTA_MAX_DK 256

extern "C" __global__ void delta_net_f32(const float* __restrict__ q, const float* __restrict__ k,
                                         const float* __restrict__ v, const float* __restrict__ g,
                                         const float* __restrict__ beta, float* __restrict__ state,
                                         float* __restrict__ out, int T, int Hk, int Hv, int dk, int dv) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;  // h * dv + i
    if (row >= Hv * dv) return;
    const int lane = threadIdx.x % WARP_SIZE, h = row / dv, i = row % dv, hk = h % Hk;
    float* s_row = state + (i64)row * dk;
    float s[DELTA_MAX_DK / WARP_SIZE];
#pragma unroll
    for (int r = 0; r < DELTA_MAX_DK / WARP_SIZE; r++) {
        const int j = lane + WARP_SIZE * r;
        s[r] = j < dk ? s_row[j] : 0.0f;
    }
    for (int t = 0; t < T; t++) {
        const float* kt = k + ((i64)t * Hk + hk) * dk;
        const float* qt = q + ((i64)t * Hk + hk) * dk;
        const float decay = expf(g[(i64)t * Hv + h]), b = beta[(i64)t * Hv + h];
        float sk = 0.0f;
#pragma unroll
        for (int r = 0; r < DELTA_MAX_DK / WARP_SIZE; r++) {
            const int j = lane + WARP_SIZE * r;
            s[r] *= decay;
            if (j < dk) sk += s[r] * kt[j];
        }
        const float u = b * (v[((i64)t * Hv + h) * dv + i] - warp_sum(sk));
        float sq = 0.0f;
#pragma unroll
        for (int r = 0; r < DELTA_MAX_DK / WARP_SIZE; r++) {
            const int j = lane + WARP_SIZE * r;
            if (j < dk) {
                s[r] += u * kt[j];
                sq += s[r] * qt[j];
            }
        }
        sq = warp_sum(sq);
        if (lane == 0) out[((i64)t * Hv + h) * dv + i] = sq;
    }
#pragma unroll
    for (int r = 0; r < DELTA_MAX_DK / WARP_SIZE; r++) {
        const int j = lane + WARP_SIZE * r;
        if (j < dk) s_row[j] = s[r];
    }
}
