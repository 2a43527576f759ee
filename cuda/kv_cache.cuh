// How a KV-cache row (one position of one KV head: d elements) is stored, for each cache type,
// and where a slot's position is (kv_where).
//
// The cache of a layer is (n_slots, n_kv, n_ctx, row bytes), a region per sequence (cache slot),
// or, paged, (n_blocks, n_kv, block_size, row bytes), a slot's positions in the blocks its row of
// the block tables lists.
// f16 halves the memory and the attention traffic of f32; q8_0 (d/32 blocks of block_q8_0)
// roughly halves f16's. q8_0 rounds exactly as the NumPy backend's _cache_round, so both backends
// hold identical values.
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
