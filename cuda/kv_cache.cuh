// How a KV-cache row (one position of one KV head: d elements) is stored, for each cache type,
// and where a slot's position is (kv_where).
//
// The cache of a layer is (n_slots, n_kv, n_ctx, row bytes), a region per sequence (cache slot),
// or, paged, (n_blocks, n_kv, block_size, row bytes), a slot's positions in the blocks its row of
// the block tables lists.
// f16 halves the memory and the attention traffic of f32; q8_0 (d/32 blocks of block_q8_0)
// roughly halves f16's, and q4_0 and iq4_nl (blocks of 18 bytes) roughly halve q8_0's. q8_0 rounds
// exactly as the NumPy backend's _cache_round, and the 4-bit types as its kv_quant, so both backends
// hold the same values.
#pragma once
#include "common.cuh"
#include "quant_blocks.cuh"

struct kv_f32 {
    static constexpr int QK = 1;  // elements one store() writes
    __device__ static i64 row_bytes(int d) { return 4 * (i64)d; }
    __device__ static void store(u8* row, int e, const float* x) { ((float*)row)[e] = x[0]; }
    __device__ static float4 load4(const u8* row, int e) { return load_f4((const float*)row + e); }
};

struct kv_f16 {
    static constexpr int QK = 1;
    __device__ static i64 row_bytes(int d) { return 2 * (i64)d; }
    __device__ static void store(u8* row, int e, const float* x) { ((u16*)row)[e] = f32_to_f16(x[0]); }
    __device__ static float4 load4(const u8* row, int e) {
        const uint2 h = load_u2((const u16*)row + e);
        return float4{f16_to_f32(h.x & 0xFFFF), f16_to_f32(h.x >> 16), f16_to_f32(h.y & 0xFFFF), f16_to_f32(h.y >> 16)};
    }
};

struct kv_q8_0 {
    static constexpr int QK = 32;
    __device__ static i64 row_bytes(int d) { return (i64)(d / 32) * sizeof(block_q8_0); }
    // Elements e..e+31 (e a multiple of 32): d = max|x| / 127, q = x / d rounded half away from zero.
    __device__ static void store(u8* row, int e, const float* x) {
        block_q8_0* b = (block_q8_0*)row + e / 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int i = 0; i < 32; i++) {
            const float s = x[i] * id;
            b->qs[i] = (i8)copysignf(floorf(fabsf(s) + 0.5f), s);
        }
        b->d = f32_to_f16(d);
    }
    __device__ static float4 load4(const u8* row, int e) {  // e a multiple of 4
        const block_q8_0* b = (const block_q8_0*)row + e / 32;
        const float d = f16_to_f32(b->d);
        const u32 w = load_u32_a2(b->qs + e % 32);
        return float4{d * uint_to_f32(byte_of(w, 0) ^ 0x80, 128.0f), d * uint_to_f32(byte_of(w, 1) ^ 0x80, 128.0f),
                      d * uint_to_f32(byte_of(w, 2) ^ 0x80, 128.0f), d * uint_to_f32(byte_of(w, 3) ^ 0x80, 128.0f)};
    }
};

// Elements e..e+3 (e a multiple of 4) of a row of 18-byte blocks whose qs hold element j of a
// block in the low nibble of qs[j] and j + 16 in the high one (q4_0, iq4_nl): the 4 nibbles.
__device__ __forceinline__ u32 nibbles4(const block_q4_0* b, int e) {
    const int j = e % 32;
    const u32 w = load_u32_a2(b->qs + j % 16);
    return j < 16 ? w & 0x0F0F0F0Fu : (w >> 4) & 0x0F0F0F0Fu;
}

// Elements e..e+31 as 32 nibbles into b, element j's in the low half of qs[j], j + 16's in the high.
__device__ __forceinline__ void pack_nibbles(block_q4_0* b, const u8* q) {
    for (int j = 0; j < 16; j++) b->qs[j] = (u8)(q[j] | (q[j + 16] << 4));
}

// The signed element of largest magnitude of 32 (the first on a tie), as ggml's reference quantizers pick it.
__device__ __forceinline__ float signed_max32(const float* x) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < 32; i++)
        if (amax < fabsf(x[i])) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    return max;
}

struct kv_q4_0 {
    static constexpr int QK = 32;
    __device__ static i64 row_bytes(int d) { return (i64)(d / 32) * sizeof(block_q4_0); }
    // As quantize_row_q4_0_ref: d = (signed max) / -8, q = min(15, trunc(x / d + 8.5)).
    __device__ static void store(u8* row, int e, const float* x) {
        block_q4_0* b = (block_q4_0*)row + e / 32;
        const float d = signed_max32(x) / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        u8 q[32];
        // Truncated (x / d + 8.5 >= 0.5); product and sum rounded apart, as the reference does: an FMA
        // would round once and move elements on a level's edge.
        for (int i = 0; i < 32; i++) q[i] = (u8)min(15, (int)__fadd_rn(__fmul_rn(x[i], id), 8.5f));
        pack_nibbles(b, q);
        b->d = f32_to_f16(d);
    }
    __device__ static float4 load4(const u8* row, int e) {
        const block_q4_0* b = (const block_q4_0*)row + e / 32;
        const float d = f16_to_f32(b->d);
        const u32 n = nibbles4(b, e);
        return float4{d * uint_to_f32(byte_of(n, 0), 8.0f), d * uint_to_f32(byte_of(n, 1), 8.0f),
                      d * uint_to_f32(byte_of(n, 2), 8.0f), d * uint_to_f32(byte_of(n, 3), 8.0f)};
    }
};

// Index of the IQ4_NL level nearest v, the upper one on a tie (ggml's best_index_int8).
__device__ __forceinline__ u32 iq4_nearest(float v) {
    u32 lo = 0, hi = 15;
    if (v <= uint_to_f32(iq4_biased(0), 128.0f)) return 0;
    if (v >= uint_to_f32(iq4_biased(15), 128.0f)) return 15;
    while (hi - lo > 1) {
        const u32 mid = (lo + hi) / 2;
        if (v < uint_to_f32(iq4_biased(mid), 128.0f)) hi = mid; else lo = mid;
    }
    return v - uint_to_f32(iq4_biased(hi - 1), 128.0f) < uint_to_f32(iq4_biased(hi), 128.0f) - v ? hi - 1 : hi;
}

struct kv_iq4_nl {
    static constexpr int QK = 32;
    __device__ static i64 row_bytes(int d) { return (i64)(d / 32) * sizeof(block_iq4_nl); }
    // As quantize_row_iq4_nl_ref: levels nearest x / d0 for d0 = (signed max) / -127, then the
    // scale d = sum(w q x) / sum(w q q), w = x^2, that fits them best (summed in element order).
    // A block below ggml's GROUP_MAX_EPS is zeros.
    __device__ static void store(u8* row, int e, const float* x) {
        block_iq4_nl* b = (block_iq4_nl*)row + e / 32;
        const float top = signed_max32(x);
        u8 q[32] = {};
        float d = 0.0f;
        if (fabsf(top) >= 1e-15f) {
            const float id = 1.0f / (top / -127.0f);
            float sum_qx = 0.0f, sum_q2 = 0.0f;
            for (int i = 0; i < 32; i++) {
                q[i] = (u8)iq4_nearest(id * x[i]);
                const float level = uint_to_f32(iq4_biased(q[i]), 128.0f), wq = x[i] * x[i] * level;
                sum_qx = __fadd_rn(sum_qx, __fmul_rn(wq, x[i]));   // not FMAs: the reference's rounding,
                sum_q2 = __fadd_rn(sum_q2, __fmul_rn(wq, level));  // which the f16 scale inherits
            }
            d = sum_q2 > 0.0f ? sum_qx / sum_q2 : 0.0f;
        }
        pack_nibbles((block_q4_0*)b, q);
        b->d = f32_to_f16(d);
    }
    __device__ static float4 load4(const u8* row, int e) {
        const block_iq4_nl* b = (const block_iq4_nl*)row + e / 32;
        const float d = f16_to_f32(b->d);
        const u32 n = nibbles4((const block_q4_0*)b, e);
        return float4{d * uint_to_f32(iq4_biased(byte_of(n, 0)), 128.0f), d * uint_to_f32(iq4_biased(byte_of(n, 1)), 128.0f),
                      d * uint_to_f32(iq4_biased(byte_of(n, 2)), 128.0f), d * uint_to_f32(iq4_biased(byte_of(n, 3)), 128.0f)};
    }
};

// Row index of position p of KV head kv of a slot. Unpaged, a slot is one block of n_ctx positions
// (block_size = n_ctx) and the tables are not read; paged, block j of the slot is
// tables[slot * max_blocks + j].
struct kv_where {
    const int* tables;
    int paged, max_blocks, block_size, n_kv;
    __device__ i64 row(int slot, int kv, int p) const {
        if (!paged) return ((i64)slot * n_kv + kv) * block_size + p;  // no division on the unpaged path
        return ((i64)tables[(i64)slot * max_blocks + p / block_size] * n_kv + kv) * block_size + p % block_size;
    }
};
