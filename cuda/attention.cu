// Causal attention of a batch's queries over the KV cache, fused: scores, online softmax and the
// weighted sum of values in one pass that reads each cached row once, in its stored type. Decode
// rows and short runs use this where the cache holds few positions a slot (attention_split.cu
// splits their keys over many blocks in a larger one: cuda_attention.split_chunks); long prompt runs take the GEMM +
// softmax_lengths path, where tensor-core matrix products outrun it.
//
// Grid (n_head, T), ATTENTION_WARPS warps per block. Query t, at position pos[t] of cache slot
// slots[t] (reached through the block tables in a paged cache, kv_where), sees that slot's keys in [max(0, pos[t] + 1 - window), pos[t] + 1) (window 0: all of
// them); its scores s = scale q·k become softcap tanh(s / softcap) unless softcap is 0 (Gemma 2).
// With has_sinks, head h's sinks[h] joins the softmax as one more logit whose value row is zero
// (gpt-oss): the weights of the keys then sum to less than 1.
// Every query has its own span, so the decode rows of many sequences go in one launch; slots and
// positions are read from device memory, so a captured decode step replays for other rows. Each
// warp takes tiles of 32 keys in turn, one key per lane: the lane computes its key's score against
// the query (held in shared memory), the warp updates its running max and sum, and then the lanes,
// each owning runs of 4 output features, accumulate the 32 weighted value rows. The warps' partial
// results are merged at the end.
//
// With quantize (dv a multiple of 32), the output is also written as the 8-bit activations of the
// integer products (q8_run.cuh, as quantize_q8.cu over out seen as (T, n_head * dv)): the output
// projection's input, made where it is written, one launch fewer. Each run of 32 features lies
// within one head, so within one block: the warp that writes it quantizes it.
#include "kv_cache.cuh"
#include "q8_run.cuh"

#define ATTENTION_WARPS 4
#define MAX_HEAD_DIM 256
#define RUNS_PER_LANE (MAX_HEAD_DIM / 4 / WARP_SIZE)
static_assert(MAX_HEAD_DIM % (4 * WARP_SIZE) == 0, "each lane owns whole runs of 4 output features");

template <class K, class V>
__device__ void attention(const float* q, const u8* k_cache, const u8* v_cache, float* out, const int* slots,
                          const int* pos, int n_head, int dk, int dv, float scale, int window,
                          float softcap, const float* sinks, int has_sinks, i8* xq, float2* xs, int quantize,
                          kv_where where) {
    __shared__ float q_s[MAX_HEAD_DIM];
    __shared__ float m_s[ATTENTION_WARPS], l_s[ATTENTION_WARPS];
    __shared__ float acc_s[ATTENTION_WARPS][MAX_HEAD_DIM];
    const int h = blockIdx.x, t = blockIdx.y, kv = h / (n_head / where.n_kv), slot = slots[t];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const float* qr = q + ((i64)t * n_head + h) * dk;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) q_s[i] = qr[i];
    __syncthreads();

    const int end = pos[t] + 1, start = window > 0 ? max(0, end - window) : 0;
    const i64 k_row = K::row_bytes(dk), v_row = V::row_bytes(dv);

    float m = -F32_INF, l = 0.0f;
    float acc[RUNS_PER_LANE][4] = {};
    for (int k0 = start + warp * WARP_SIZE; k0 < end; k0 += ATTENTION_WARPS * WARP_SIZE) {
        const int key = k0 + lane;
        float s = -F32_INF;
        if (key < end) {
            float dot = 0.0f;
            for (int e = 0; e < dk; e += 4) {
                const float4 kv4 = K::load4(k_cache + where.row(slot, kv, key) * k_row, e);
                dot += q_s[e] * kv4.x + q_s[e + 1] * kv4.y + q_s[e + 2] * kv4.z + q_s[e + 3] * kv4.w;
            }
            s = soft_capped(dot * scale, softcap);
        }
        const float m_new = fmaxf(m, warp_max(s));  // finite: this tile's first key is in range
        const float p = expf(s - m_new), correction = expf(m - m_new);
        l = l * correction + warp_sum(p);
        m = m_new;
#pragma unroll
        for (int r = 0; r < RUNS_PER_LANE; r++)
            for (int c = 0; c < 4; c++) acc[r][c] *= correction;
        const int n_keys = min(WARP_SIZE, end - k0);
        for (int j = 0; j < n_keys; j++) {
            const float pj = __shfl_sync(FULL_MASK, p, j);
            const u8* row = v_cache + where.row(slot, kv, k0 + j) * v_row;
#pragma unroll
            for (int r = 0; r < RUNS_PER_LANE; r++) {
                const int e = 4 * (lane + WARP_SIZE * r);
                if (e < dv) {
                    const float4 v4 = V::load4(row, e);
                    acc[r][0] += pj * v4.x; acc[r][1] += pj * v4.y; acc[r][2] += pj * v4.z; acc[r][3] += pj * v4.w;
                }
            }
        }
    }

    if (lane == 0) {
        m_s[warp] = m;
        l_s[warp] = l;
    }
#pragma unroll
    for (int r = 0; r < RUNS_PER_LANE; r++) {
        const int e = 4 * (lane + WARP_SIZE * r);
        if (e < dv)
            for (int c = 0; c < 4; c++) acc_s[warp][e + c] = acc[r][c];
    }
    __syncthreads();
    const float sink = has_sinks ? sinks[h] : -F32_INF;
    float m_all = sink;
    for (int w = 0; w < ATTENTION_WARPS; w++) m_all = fmaxf(m_all, m_s[w]);
    float l_all = has_sinks ? expf(sink - m_all) : 0.0f, weight[ATTENTION_WARPS];
    for (int w = 0; w < ATTENTION_WARPS; w++) {  // a warp that saw no keys has l = 0 and weight 0
        weight[w] = l_s[w] > 0.0f ? expf(m_s[w] - m_all) : 0.0f;
        l_all += l_s[w] * weight[w];
    }
    const i64 first = ((i64)t * n_head + h) * dv;
    for (int i = threadIdx.x; i < dv; i += blockDim.x) {  // whole warps when quantizing: dv % 32 == 0
        float sum = 0.0f;
        for (int w = 0; w < ATTENTION_WARPS; w++) sum += acc_s[w][i] * weight[w];
        const float o = sum / l_all;
        out[first + i] = o;
        if (quantize) quantize_run(o, (first + i) / WARP_SIZE, xq, xs);
    }
}

#define ATTENTION(tk, tv)                                                                                     \
    extern "C" __global__ void __launch_bounds__(ATTENTION_WARPS * WARP_SIZE) attention_##tk##_##tv(          \
        const float* __restrict__ q, const u8* __restrict__ k_cache, const u8* __restrict__ v_cache,          \
        float* __restrict__ out, const int* __restrict__ slots, const int* __restrict__ pos, int n_head,      \
        int n_kv, int dk, int dv, float scale, int window, float softcap, const float* __restrict__ sinks,     \
        int has_sinks, i8* __restrict__ xq, float2* __restrict__ xs, int quantize,                             \
        const int* __restrict__ tables, int paged, int max_blocks, int block_size) {                          \
        attention<kv_##tk, kv_##tv>(q, k_cache, v_cache, out, slots, pos, n_head, dk, dv, scale, window,      \
                                    softcap, sinks, has_sinks, xq, xs, quantize,                              \
                                    kv_where{tables, paged, max_blocks, block_size, n_kv});                   \
    }

ATTENTION(f32, f32)
ATTENTION(f32, f16)
ATTENTION(f32, q8_0)
ATTENTION(f32, q4_0)
ATTENTION(f32, iq4_nl)
ATTENTION(f16, f32)
ATTENTION(f16, f16)
ATTENTION(f16, q8_0)
ATTENTION(f16, q4_0)
ATTENTION(f16, iq4_nl)
ATTENTION(q8_0, f32)
ATTENTION(q8_0, f16)
ATTENTION(q8_0, q8_0)
ATTENTION(q8_0, q4_0)
ATTENTION(q8_0, iq4_nl)
ATTENTION(q4_0, f32)
ATTENTION(q4_0, f16)
ATTENTION(q4_0, q8_0)
ATTENTION(q4_0, q4_0)
ATTENTION(q4_0, iq4_nl)
ATTENTION(iq4_nl, f32)
ATTENTION(iq4_nl, f16)
ATTENTION(iq4_nl, q8_0)
ATTENTION(iq4_nl, q4_0)
ATTENTION(iq4_nl, iq4_nl)
