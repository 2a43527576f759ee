// The gated delta rule of Gated DeltaNet over runs of a batch: run r is the T tokens [r T, (r + 1) T),
// all of cache slot s = slots[r T]. Value head h (reading key head h % Hk) of slot s keeps a state
// S (dv, dk) in state[s]; per token, with decay exp(g) and strength beta:
//     S <- exp(g) S;   S <- S + beta (v - S k) kᵀ;   out = S q.
// Decode is R runs of one token; a prompt chunk is one run. The slot is read from device memory, so
// a captured decode step replays for other rows.
//
// Row i of S only ever needs v[i] and the shared k, q: one warp per (run, head, row) runs the tokens
// in order with its row in registers (lane l holds columns l, l + 32, ...), which is exactly the
// sequential recurrence. Grid (Hv dv / warps per block, R).
#include "common.cuh"

#define DELTA_MAX_DK 256
static_assert(DELTA_MAX_DK % WARP_SIZE == 0, "a state row is whole registers of every lane");

extern "C" __global__ void delta_net_f32(const float* __restrict__ q, const float* __restrict__ k,
                                         const float* __restrict__ v, const float* __restrict__ g,
                                         const float* __restrict__ beta, float* __restrict__ state,
                                         float* __restrict__ out, const int* __restrict__ slots, int T, int Hk,
                                         int Hv, int dk, int dv) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;  // h * dv + i
    if (row >= Hv * dv) return;
    const int lane = threadIdx.x % WARP_SIZE, h = row / dv, i = row % dv, hk = h % Hk;
    const i64 t0 = (i64)blockIdx.y * T;
    float* s_row = state + ((i64)slots[t0] * Hv * dv + row) * dk;
    float s[DELTA_MAX_DK / WARP_SIZE];
#pragma unroll
    for (int r = 0; r < DELTA_MAX_DK / WARP_SIZE; r++) {
        const int j = lane + WARP_SIZE * r;
        s[r] = j < dk ? s_row[j] : 0.0f;
    }
    for (i64 t = t0; t < t0 + T; t++) {
        const float* kt = k + (t * Hk + hk) * dk;
        const float* qt = q + (t * Hk + hk) * dk;
        const float decay = expf(g[t * Hv + h]), b = beta[t * Hv + h];
        float sk = 0.0f;
#pragma unroll
        for (int r = 0; r < DELTA_MAX_DK / WARP_SIZE; r++) {
            const int j = lane + WARP_SIZE * r;
            s[r] *= decay;
            if (j < dk) sk += s[r] * kt[j];
        }
        const float u = b * (v[(t * Hv + h) * dv + i] - warp_sum(sk));
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
        if (lane == 0) out[(t * Hv + h) * dv + i] = sq;
    }
#pragma unroll
    for (int r = 0; r < DELTA_MAX_DK / WARP_SIZE; r++) {
        const int j = lane + WARP_SIZE * r;
        if (j < dk) s_row[j] = s[r];
    }
}
