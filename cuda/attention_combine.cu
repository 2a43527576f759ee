// Decode attention split along the keys (flash-decoding), second half: the chunks' partial
// softmaxes of attention_split.cu merged into each head's output.
//
// Grid (n_head, T), COMBINE_THREADS threads. Query t's head h has n_chunks partials, ml = (m, l)
// and acc (dv floats), at (t * n_head + h) * n_chunks + c; a chunk with l = 0 saw no keys. With M
// the largest m (and the head's sink, with has_sinks: gpt-oss's logit whose value row is zero),
// the output is sum_c acc_c exp(m_c - M) / (sum_c l_c exp(m_c - M) + exp(sink - M)).
//
// With quantize (dv a multiple of 32), the output is also written as the 8-bit activations of the
// integer products (q8_run.cuh), as attention.cu does: a run of 32 features is one warp's.
#include "q8_run.cuh"

#define COMBINE_THREADS 128
#define MAX_CHUNKS 256

extern "C" __global__ void __launch_bounds__(COMBINE_THREADS) attention_combine(
    const float2* __restrict__ part_ml, const float* __restrict__ part_acc, float* __restrict__ out, int n_head,
    int n_chunks, int dv, const float* __restrict__ sinks, int has_sinks, i8* __restrict__ xq,
    float2* __restrict__ xs, int quantize) {
    __shared__ float weight_s[MAX_CHUNKS];
    __shared__ float l_s;
    const int h = blockIdx.x, t = blockIdx.y;
    const i64 head = (i64)t * n_head + h, part0 = head * n_chunks;
    if (threadIdx.x < WARP_SIZE) {  // warp 0 weighs the chunks
        const float sink = has_sinks ? sinks[h] : -F32_INF;
        float m = sink;
        for (int c = threadIdx.x; c < n_chunks; c += WARP_SIZE)
            if (part_ml[part0 + c].y > 0.0f) m = fmaxf(m, part_ml[part0 + c].x);
        m = warp_max(m);  // finite: chunk 0 holds the query's first key
        float l = 0.0f;
        for (int c = threadIdx.x; c < n_chunks; c += WARP_SIZE) {
            const float2 ml = part_ml[part0 + c];
            const float w = ml.y > 0.0f ? expf(ml.x - m) : 0.0f;
            weight_s[c] = w;
            l += ml.y * w;
        }
        l = warp_sum(l);
        if (threadIdx.x == 0) l_s = has_sinks ? l + expf(sink - m) : l;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < dv; i += blockDim.x) {  // whole warps when quantizing: dv % 32 == 0
        float sum = 0.0f;
        for (int c = 0; c < n_chunks; c++)
            if (weight_s[c] > 0.0f) sum += part_acc[(part0 + c) * dv + i] * weight_s[c];
        const float o = sum / l_s;
        out[head * dv + i] = o;
        if (quantize) quantize_run(o, (head * dv + i) / WARP_SIZE, xq, xs);
    }
}
