// RoPE on the way into the KV cache: one launch turns a batch's queries q (T, H, dk) into q_out and
// stores its keys k (T, n_kv, dk), turned the same way, and its values v (T, n_kv, dv) into the
// caches (kv_cache.cuh), token t at position pos[t] of slot slots[t] (through the block tables in a
// paged cache). It is one op, the attention input's preparation: rope.cu turning q and k and two
// kv_store.cu launches did the same in four, and the turned keys exist only to be stored.
//
// Every pair of cache types (kv_cache.cuh). One thread per unit: a query feature, a run of C::QK key features (rope.cuh's turn computed per
// feature), or a run of value features; queries first, then keys, then values.
#include "kv_cache.cuh"
#include "rope.cuh"

template <bool NEOX, class CK, class CV>
__device__ void rope_store(const float* q, const float* k, const float* v, float* q_out, u8* k_cache, u8* v_cache,
                           const int* slots, const int* pos, const float* factors, int T, int H, int dk, int dv,
                           int dims, float base, float freq_scale, float attn_factor, kv_where where) {
    const i64 n_q = (i64)T * H * dk, n_k = (i64)T * where.n_kv * (dk / CK::QK), n_v = (i64)T * where.n_kv * (dv / CV::QK);
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_q) {
        const int e = i % dk, t = i / ((i64)H * dk);
        q_out[i] = rope_feature<NEOX>(q + (i - e), e, pos[t], factors, dims, base, freq_scale, attn_factor);
        return;
    }
    i -= n_q;
    if (i < n_k) {
        const int chunks = dk / CK::QK, e = (i % chunks) * CK::QK, head = (i / chunks) % where.n_kv;
        const int t = i / ((i64)chunks * where.n_kv);
        const float* x = k + ((i64)t * where.n_kv + head) * dk;
        float turned[CK::QK];
        for (int j = 0; j < CK::QK; j++)
            turned[j] = rope_feature<NEOX>(x, e + j, pos[t], factors, dims, base, freq_scale, attn_factor);
        CK::store(k_cache + where.row(slots[t], head, pos[t]) * CK::row_bytes(dk), e, turned);
        return;
    }
    i -= n_k;
    if (i < n_v) {
        const int chunks = dv / CV::QK, e = (i % chunks) * CV::QK, head = (i / chunks) % where.n_kv;
        const int t = i / ((i64)chunks * where.n_kv);
        CV::store(v_cache + where.row(slots[t], head, pos[t]) * CV::row_bytes(dv), e,
                  v + ((i64)t * where.n_kv + head) * dv + e);
    }
}

#define ROPE_STORE(rot, neox, tk, tv)                                                                          \
    extern "C" __global__ void rope_store_##rot##_##tk##_##tv(                                                 \
        const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,                 \
        float* __restrict__ q_out, u8* __restrict__ k_cache, u8* __restrict__ v_cache,                         \
        const int* __restrict__ slots, const int* __restrict__ pos, const float* __restrict__ factors, int T,  \
        int H, int n_kv, int dk, int dv, int dims, float base, float freq_scale, float attn_factor,            \
        const int* __restrict__ tables, int paged, int max_blocks, int block_size) {                           \
        rope_store<neox, kv_##tk, kv_##tv>(q, k, v, q_out, k_cache, v_cache, slots, pos, factors, T, H, dk, dv, \
                                          dims, base, freq_scale, attn_factor,                                 \
                                          kv_where{tables, paged, max_blocks, block_size, n_kv});              \
    }

#define ROPE_STORE_V(rot, neox, tk) \
    ROPE_STORE(rot, neox, tk, f32)  \
    ROPE_STORE(rot, neox, tk, f16)  \
    ROPE_STORE(rot, neox, tk, q8_0) \
    ROPE_STORE(rot, neox, tk, q4_0) \
    ROPE_STORE(rot, neox, tk, iq4_nl)

#define ROPE_STORE_KV(rot, neox)      \
    ROPE_STORE_V(rot, neox, f32)      \
    ROPE_STORE_V(rot, neox, f16)      \
    ROPE_STORE_V(rot, neox, q8_0)     \
    ROPE_STORE_V(rot, neox, q4_0)     \
    ROPE_STORE_V(rot, neox, iq4_nl)

ROPE_STORE_KV(norm, false)
ROPE_STORE_KV(neox, true)
