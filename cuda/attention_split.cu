// Decode attention split along the keys (flash-decoding), first half: each block takes one chunk
// of one query's keys for all heads of one KV group, and writes each head's partial softmax over
// that chunk; attention_combine.cu merges the chunks. attention.cu gives a block to each (query,
// head), which leaves most of a large GPU idle at depth (a 1B model's decode step is 32 blocks,
// each walking every key) and reads each cached row once per head of its group; here a decode
// step is (n_kv, n_chunks) blocks and a row is read once per group.
//
// Grid (n_kv, n_chunks, T), SPLIT_WARPS warps per block. Query t, at position pos[t] of slot
// slots[t] (kv_where), sees the keys [start, end) = [max(0, pos[t] + 1 - window), pos[t] + 1)
// (window 0: from 0), scores s = scale q·k soft-capped as in attention.cu. Those keys are cut into
// n_chunks chunks of `per` keys, per the larger of min_keys and the span over n_chunks (a multiple
// of 32): chunk c holds [start + c per, start + (c + 1) per) ∩ [start, end). The cut depends on the
// query's own span, read on the device, so a captured decode step splits each row's keys evenly at
// any depth; a chunk past the span writes l = 0, which the combine skips.
//
// For head h of the group and chunk c the block writes ml = (m, l), the largest score m and
// l = sum exp(s - m), and acc = sum exp(s - m) v (dv floats): ((t * n_head + h) * n_chunks + c).
// Inside a block the work is attention.cu's: warps take tiles of 32 keys, a key a lane; the lane
// scores its key against every head of the group (the key row read once), and the lanes, each
// owning runs of 4 value features, accumulate the 32 weighted value rows for every head.
#include "kv_cache.cuh"

#define SPLIT_WARPS 4
#define MAX_HEAD_DIM 256
#define MAX_GROUP 8
#define RUNS_PER_LANE (MAX_HEAD_DIM / 4 / WARP_SIZE)
static_assert(MAX_HEAD_DIM % (4 * WARP_SIZE) == 0, "each lane owns whole runs of 4 output features");

template <class K, class V>
__device__ void attention_split(const float* q, const u8* k_cache, const u8* v_cache, float2* part_ml, float* part_acc,
                                const int* slots, const int* pos, int n_head, int dk, int dv, float scale, int window,
                                float softcap, int min_keys, kv_where where) {
    __shared__ float q_s[MAX_GROUP][MAX_HEAD_DIM];
    __shared__ float m_s[SPLIT_WARPS], l_s[SPLIT_WARPS];
    __shared__ float acc_s[SPLIT_WARPS][MAX_HEAD_DIM];
    const int kv = blockIdx.x, c = blockIdx.y, n_chunks = gridDim.y, t = blockIdx.z, slot = slots[t];
    const int group = n_head / where.n_kv, h0 = kv * group;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;

    const int end = pos[t] + 1, start = window > 0 ? max(0, end - window) : 0;
    const int per = max(min_keys, (end - start + n_chunks * WARP_SIZE - 1) / (n_chunks * WARP_SIZE) * WARP_SIZE);
    const int first = start + c * per, last = min(end, first + per);
    const i64 part0 = ((i64)t * n_head + h0) * n_chunks + c;  // head h0 + g's partial: part0 + g * n_chunks
    if (first >= end) {  // the whole block leaves together
        if ((int)threadIdx.x < group) part_ml[part0 + threadIdx.x * n_chunks] = float2{-F32_INF, 0.0f};
        return;
    }
    for (int i = threadIdx.x; i < group * dk; i += blockDim.x) q_s[i / dk][i % dk] = q[((i64)t * n_head + h0) * dk + i];
    __syncthreads();

    const i64 k_row = K::row_bytes(dk), v_row = V::row_bytes(dv);
    float m[MAX_GROUP], l[MAX_GROUP], acc[MAX_GROUP][RUNS_PER_LANE][4] = {};
#pragma unroll
    for (int g = 0; g < MAX_GROUP; g++) m[g] = -F32_INF, l[g] = 0.0f;
    for (int k0 = first + warp * WARP_SIZE; k0 < last; k0 += SPLIT_WARPS * WARP_SIZE) {
        const int key = k0 + lane;
        float s[MAX_GROUP];
#pragma unroll
        for (int g = 0; g < MAX_GROUP; g++) s[g] = 0.0f;
        if (key < last) {
            const u8* row = k_cache + where.row(slot, kv, key) * k_row;
            for (int e = 0; e < dk; e += 4) {
                const float4 k4 = K::load4(row, e);
#pragma unroll
                for (int g = 0; g < MAX_GROUP; g++)
                    if (g < group) s[g] += q_s[g][e] * k4.x + q_s[g][e + 1] * k4.y + q_s[g][e + 2] * k4.z + q_s[g][e + 3] * k4.w;
            }
        }
        float p[MAX_GROUP] = {};
#pragma unroll
        for (int g = 0; g < MAX_GROUP; g++) {
            if (g >= group) break;
            const float score = key < last ? soft_capped(s[g] * scale, softcap) : -F32_INF;
            const float m_new = fmaxf(m[g], warp_max(score));  // finite: this tile's first key is in range
            const float correction = expf(m[g] - m_new);
            p[g] = expf(score - m_new);
            l[g] = l[g] * correction + warp_sum(p[g]);
            m[g] = m_new;
#pragma unroll
            for (int r = 0; r < RUNS_PER_LANE; r++)
                for (int i = 0; i < 4; i++) acc[g][r][i] *= correction;
        }
        const int n_keys = min(WARP_SIZE, last - k0);
        for (int j = 0; j < n_keys; j++) {
            const u8* row = v_cache + where.row(slot, kv, k0 + j) * v_row;
#pragma unroll
            for (int r = 0; r < RUNS_PER_LANE; r++) {
                const int e = 4 * (lane + WARP_SIZE * r);
                const float4 v4 = e < dv ? V::load4(row, e) : float4{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int g = 0; g < MAX_GROUP; g++) {
                    if (g >= group) break;
                    const float pj = __shfl_sync(FULL_MASK, p[g], j);
                    acc[g][r][0] += pj * v4.x; acc[g][r][1] += pj * v4.y; acc[g][r][2] += pj * v4.z; acc[g][r][3] += pj * v4.w;
                }
            }
        }
    }

    // The warps' partials merged, head by head through the same shared rows.
#pragma unroll
    for (int g = 0; g < MAX_GROUP; g++) {
        if (g >= group) break;
        if (lane == 0) {
            m_s[warp] = m[g];
            l_s[warp] = l[g];
        }
#pragma unroll
        for (int r = 0; r < RUNS_PER_LANE; r++) {
            const int e = 4 * (lane + WARP_SIZE * r);
            if (e < dv)
                for (int i = 0; i < 4; i++) acc_s[warp][e + i] = acc[g][r][i];
        }
        __syncthreads();
        float m_all = -F32_INF, l_all = 0.0f, weight[SPLIT_WARPS];
        for (int w = 0; w < SPLIT_WARPS; w++) m_all = fmaxf(m_all, m_s[w]);  // finite: warp 0 saw `first`
        for (int w = 0; w < SPLIT_WARPS; w++) {  // a warp that saw no keys has l = 0 and weight 0
            weight[w] = l_s[w] > 0.0f ? expf(m_s[w] - m_all) : 0.0f;
            l_all += l_s[w] * weight[w];
        }
        const i64 part = part0 + (i64)g * n_chunks;
        if (threadIdx.x == 0) part_ml[part] = float2{m_all, l_all};
        for (int i = threadIdx.x; i < dv; i += blockDim.x) {
            float sum = 0.0f;
            for (int w = 0; w < SPLIT_WARPS; w++) sum += acc_s[w][i] * weight[w];
            part_acc[part * dv + i] = sum;
        }
        __syncthreads();  // before the next head's rows overwrite these
    }
}

#define ATTENTION_SPLIT(tk, tv)                                                                               \
    extern "C" __global__ void __launch_bounds__(SPLIT_WARPS * WARP_SIZE) attention_split_##tk##_##tv(        \
        const float* __restrict__ q, const u8* __restrict__ k_cache, const u8* __restrict__ v_cache,          \
        float2* __restrict__ part_ml, float* __restrict__ part_acc, const int* __restrict__ slots,            \
        const int* __restrict__ pos, int n_head, int n_kv, int dk, int dv, float scale, int window,            \
        float softcap, int min_keys, const int* __restrict__ tables, int paged, int max_blocks,                \
        int block_size) {                                                                                     \
        attention_split<kv_##tk, kv_##tv>(q, k_cache, v_cache, part_ml, part_acc, slots, pos, n_head, dk, dv,  \
                                          scale, window, softcap, min_keys,                                   \
                                          kv_where{tables, paged, max_blocks, block_size, n_kv});             \
    }

ATTENTION_SPLIT(f32, f32)
ATTENTION_SPLIT(f32, f16)
ATTENTION_SPLIT(f32, q8_0)
ATTENTION_SPLIT(f32, q4_0)
ATTENTION_SPLIT(f32, iq4_nl)
ATTENTION_SPLIT(f16, f32)
ATTENTION_SPLIT(f16, f16)
ATTENTION_SPLIT(f16, q8_0)
ATTENTION_SPLIT(f16, q4_0)
ATTENTION_SPLIT(f16, iq4_nl)
ATTENTION_SPLIT(q8_0, f32)
ATTENTION_SPLIT(q8_0, f16)
ATTENTION_SPLIT(q8_0, q8_0)
ATTENTION_SPLIT(q8_0, q4_0)
ATTENTION_SPLIT(q8_0, iq4_nl)
ATTENTION_SPLIT(q4_0, f32)
ATTENTION_SPLIT(q4_0, f16)
ATTENTION_SPLIT(q4_0, q8_0)
ATTENTION_SPLIT(q4_0, q4_0)
ATTENTION_SPLIT(q4_0, iq4_nl)
ATTENTION_SPLIT(iq4_nl, f32)
ATTENTION_SPLIT(iq4_nl, f16)
ATTENTION_SPLIT(iq4_nl, q8_0)
ATTENTION_SPLIT(iq4_nl, q4_0)
ATTENTION_SPLIT(iq4_nl, iq4_nl)
