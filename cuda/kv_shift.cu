// A context shift of one slot's cache rows (kv_cache.cuh): positions src..src+n-1 move to
// src-delta.., keys turned back by delta positions of RoPE. Pair i of the first `dims` features
// turns by -delta * freq_scale * base^(-2i/dims) / factors[i], a pure rotation (the attention
// factor was applied once when the key was stored); NeoX-style models pair i with i + dims/2,
// others (2i, 2i+1). Values, and keys of layers without RoPE (rope 0), move as they are.
//
// One thread per (position, KV head) row: the row is read whole into floats, turned, and stored
// in the cache's type (q8_0, q4_0 and iq4_nl requantized 32 at a time, rounding as kv_store does). A launch moves
// at most delta positions (the launcher's chunks), so no thread reads a row another one writes.
// Angles are computed in double, as rope.cu does.
#include "kv_cache.cuh"

constexpr int MAX_HEAD_DIM = 256;  // MAX_HEAD_DIM in cuda_attention.py

template <class C, bool NEOX>
__device__ void kv_shift(u8* cache, int slot, int src, int n, int delta, int d, int rope, int dims, float base,
                         float freq_scale, const float* factors, kv_where where) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)n * where.n_kv) return;
    const int head = i % where.n_kv, p = src + (int)(i / where.n_kv);
    const u8* from = cache + where.row(slot, head, p) * C::row_bytes(d);
    u8* to = cache + where.row(slot, head, p - delta) * C::row_bytes(d);
    float x[MAX_HEAD_DIM];
    for (int e = 0; e < d; e += 4) {
        const float4 f = C::load4(from, e);
        x[e] = f.x, x[e + 1] = f.y, x[e + 2] = f.z, x[e + 3] = f.w;
    }
    for (int pair = 0; rope && pair < dims / 2; pair++) {
        const int a = NEOX ? pair : 2 * pair, b = NEOX ? pair + dims / 2 : 2 * pair + 1;
        const double angle =
            -(double)delta * ((double)freq_scale * pow((double)base, -(double)(2 * pair) / dims)) / factors[pair];
        const float c = (float)cos(angle), s = (float)sin(angle), xa = x[a], xb = x[b];
        x[a] = xa * c - xb * s;
        x[b] = xa * s + xb * c;
    }
    for (int e = 0; e < d; e += C::QK) C::store(to, e, x + e);
}

#define KV_SHIFT(type, style, neox)                                                                          \
    extern "C" __global__ void kv_shift_##type##_##style(                                                    \
        u8* __restrict__ cache, int slot, int src, int n, int delta, int n_kv, int d, int rope, int dims,    \
        float base, float freq_scale, const float* __restrict__ factors, const int* __restrict__ tables,   \
        int paged, int max_blocks, int block_size) {                                                        \
        kv_shift<kv_##type, neox>(cache, slot, src, n, delta, d, rope, dims, base, freq_scale, factors,       \
                                  kv_where{tables, paged, max_blocks, block_size, n_kv});                   \
    }

KV_SHIFT(f32, norm, false)
KV_SHIFT(f32, neox, true)
KV_SHIFT(f16, norm, false)
KV_SHIFT(f16, neox, true)
KV_SHIFT(q8_0, norm, false)
KV_SHIFT(q8_0, neox, true)
KV_SHIFT(q4_0, norm, false)
KV_SHIFT(q4_0, neox, true)
KV_SHIFT(iq4_nl, norm, false)
KV_SHIFT(iq4_nl, neox, true)
