// Runs of 32 weights as the int8 tensor-core products take them (matmul_q8_mma.cu): each type's
// run(b, r, v) writes run r of block b as 32 int8 values v (4 a register, lowest byte first) and
// returns its scales s, so that with activations quantized per run of 32 (q8_run.cuh: step dx and
// dx * sum of the values) the run's product is s.x * dx * (v · xq) + s.y * (dx * sum of xq). Types
// whose runs hold two scales (HALVES) return them as (scale of elements 0-15, of 16-31), no min.
#pragma once
#include "common.cuh"
#include "quant_blocks.cuh"

#define MMA_LOW_NIBBLES 0x0F0F0F0Fu

// The 4 unsigned bytes of v (each < 128) less `bias` each, as signed bytes, without a borrow
// crossing into the next byte.
__device__ __forceinline__ u32 bytes_less(u32 v, u32 bias) { return ((v | 0x80808080u) - bias) ^ 0x80808080u; }

struct q8_0_mma {  // d * q
    typedef block_q8_0 block;
    static constexpr int QK = 32;
    static constexpr bool HALVES = false;
    __device__ static float2 run(const block* b, int, u32 v[8]) {
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = load_u32_a2(b->qs + 4 * i);
        return make_scales(f16_to_f32(b->d), 0.0f);
    }
    __device__ static float2 make_scales(float x, float y) {
        float2 s;
        s.x = x;
        s.y = y;
        return s;
    }
};

// Element j < 16 of a q4_0/q4_1 block in the low nibble of qs[j], j + 16 in the high one.
__device__ __forceinline__ void q4_run(const u8* qs, bool aligned4, u32 v[8]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const u32 q = aligned4 ? load_u32(qs + 4 * i) : load_u32_a2(qs + 4 * i);
        v[i] = q & MMA_LOW_NIBBLES;
        v[4 + i] = (q >> 4) & MMA_LOW_NIBBLES;
    }
}

struct q4_0_mma {  // d * (q - 8): the 8 as a min of -8 d
    typedef block_q4_0 block;
    static constexpr int QK = 32;
    static constexpr bool HALVES = false;
    __device__ static float2 run(const block* b, int, u32 v[8]) {
        q4_run(b->qs, false, v);
        const float d = f16_to_f32(b->d);
        return q8_0_mma::make_scales(d, -8.0f * d);
    }
};

struct q4_1_mma {  // d * q + m
    typedef block_q4_1 block;
    static constexpr int QK = 32;
    static constexpr bool HALVES = false;
    __device__ static float2 run(const block* b, int, u32 v[8]) {
        q4_run(b->qs, true, v);
        return q8_0_mma::make_scales(f16_to_f32(b->d), f16_to_f32(b->m));
    }
};

// Sub-block r (of 8) of a q4_K/q5_K block's low 4 bits: the low (r even) or high nibbles of
// qs[32 (r / 2)..+31].
__device__ __forceinline__ void k_nibbles(const u8* qs, int r, u32 v[8]) {
    const int shift = 4 * (r % 2);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint4 q = load_u4(qs + 32 * (r / 2) + 16 * h);
        v[4 * h] = (q.x >> shift) & MMA_LOW_NIBBLES;
        v[4 * h + 1] = (q.y >> shift) & MMA_LOW_NIBBLES;
        v[4 * h + 2] = (q.z >> shift) & MMA_LOW_NIBBLES;
        v[4 * h + 3] = (q.w >> shift) & MMA_LOW_NIBBLES;
    }
}

// Sub-block r's d * sc and -dmin * mn of a q4_K/q5_K block.
template <class B>
__device__ __forceinline__ float2 k_run_scales(const B* b, int r) {
    float sc, mn;
    k_scale_min(b->scales, r, sc, mn);
    return q8_0_mma::make_scales(f16_to_f32(b->d) * sc, -f16_to_f32(b->dmin) * mn);
}

// Sub-block r (of 8) of a q4_K block: d * sc * q - dmin * mn.
struct q4_K_mma {
    typedef block_q4_K block;
    static constexpr int QK = 256;
    static constexpr bool HALVES = false;
    __device__ static float2 run(const block* b, int r, u32 v[8]) {
        k_nibbles(b->qs, r, v);
        return k_run_scales(b, r);
    }
};

// A run of 32 elements whose low bits are (lo bytes >> lo_shift) & lo_mask and whose high bits
// are (hi bytes >> hi_shift) & hi_mask put at bit hi_pos, less bias a byte (q6_K, q3_K): 2-byte
// aligned bytes, 4 elements a word.
__device__ __forceinline__ void split_run(const u8* lo, int lo_shift, u32 lo_mask, const u8* hi, int hi_shift, u32 hi_mask,
                                          int hi_pos, u32 bias, u32 v[8]) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const u32 low = (load_u32_a2(lo + 4 * i) >> lo_shift) & lo_mask, high = (load_u32_a2(hi + 4 * i) >> hi_shift) & hi_mask;
        v[i] = bytes_less(low | (high << hi_pos), bias);
    }
}

// Run r = 4h + k of a q6_K block, elements 128h + 32k + l (l < 32): low 4 bits in the low (k < 2)
// or high nibble of ql[64h + 32 (k % 2) + l], top 2 bits as bits 2k, 2k + 1 of qh[32h + l];
// d * scales[8h + 2k + l / 16] * (q - 32), two scales a run.
struct q6_K_mma {
    typedef block_q6_K block;
    static constexpr int QK = 256;
    static constexpr bool HALVES = true;
    __device__ static float2 run(const block* b, int r, u32 v[8]) {
        const int h = r / 4, k = r % 4;
        split_run(b->ql + 64 * h + 32 * (k % 2), 4 * (k / 2), MMA_LOW_NIBBLES, b->qh + 32 * h, 2 * k, 0x03030303u, 4,
                  0x20202020u, v);
        const float d = f16_to_f32(b->d);
        return q8_0_mma::make_scales(d * (float)b->scales[8 * h + 2 * k], d * (float)b->scales[8 * h + 2 * k + 1]);
    }
};

// Bit 4 of each byte of a run's 4 elements from their 4 high bits (bits 0-3 of `bits`).
__device__ __forceinline__ u32 fifth_bits(u32 bits) {
    return ((bits & 1u) << 4) | ((bits & 2u) << 11) | ((bits & 4u) << 18) | ((bits & 8u) << 25);
}

// Element j of a q5_0/q5_1 block: q4_run's nibble with bit j of qh as bit 4.
__device__ __forceinline__ void q5_run(const u8* qs, u32 qh, bool aligned4, u32 v[8]) {
    q4_run(qs, aligned4, v);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[i] |= fifth_bits(qh >> (4 * i));
        v[4 + i] |= fifth_bits(qh >> (16 + 4 * i));
    }
}

struct q5_0_mma {  // d * (q - 16): the 16 as a min of -16 d
    typedef block_q5_0 block;
    static constexpr int QK = 32;
    static constexpr bool HALVES = false;
    __device__ static float2 run(const block* b, int, u32 v[8]) {
        q5_run(b->qs, load_u32_a2(b->qh), false, v);
        const float d = f16_to_f32(b->d);
        return q8_0_mma::make_scales(d, -16.0f * d);
    }
};

struct q5_1_mma {  // d * q + m
    typedef block_q5_1 block;
    static constexpr int QK = 32;
    static constexpr bool HALVES = false;
    __device__ static float2 run(const block* b, int, u32 v[8]) {
        q5_run(b->qs, load_u32(b->qh), true, v);
        return q8_0_mma::make_scales(f16_to_f32(b->d), f16_to_f32(b->m));
    }
};

// Sub-block r (of 8) of a q5_K block: q4_K's nibbles with bit r of qh[l] as bit 4 of element l.
struct q5_K_mma {
    typedef block_q5_K block;
    static constexpr int QK = 256;
    static constexpr bool HALVES = false;
    __device__ static float2 run(const block* b, int r, u32 v[8]) {
        k_nibbles(b->qs, r, v);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint4 hi = load_u4(b->qh + 16 * h);
            v[4 * h] |= ((hi.x >> r) & 0x01010101u) << 4;
            v[4 * h + 1] |= ((hi.y >> r) & 0x01010101u) << 4;
            v[4 * h + 2] |= ((hi.z >> r) & 0x01010101u) << 4;
            v[4 * h + 3] |= ((hi.w >> r) & 0x01010101u) << 4;
        }
        return k_run_scales(b, r);
    }
};

// Run r = 4h + k of a q3_K block, elements 128h + 32k + l (l < 32): bits 2k, 2k + 1 of
// qs[32h + l], less 4 unless bit r of hmask[l] is set; d * (scale - 32) * q with the 6-bit scales
// of sub-blocks 2r and 2r + 1, two scales a run.
struct q3_K_mma {
    typedef block_q3_K block;
    static constexpr int QK = 256;
    static constexpr bool HALVES = true;
    __device__ static float2 run(const block* b, int r, u32 v[8]) {
        const int h = r / 4, k = r % 4;
        split_run(b->qs + 32 * h, 2 * k, 0x03030303u, b->hmask, r, 0x01010101u, 2, 0x04040404u, v);
        const float d = f16_to_f32(b->d);
        return q8_0_mma::make_scales(d * (scale(b->scales, 2 * r) - 32.0f), d * (scale(b->scales, 2 * r + 1) - 32.0f));
    }
    // Sub-block s's 6-bit scale: low 4 bits in scales[s % 8] (bits 4 (s / 8)), top 2 in scales[8 + s % 4] (bits 2 (s / 4)).
    __device__ static float scale(const u8* scales, int s) {
        return (float)(((scales[s % 8] >> (4 * (s / 8))) & 0xF) | (((scales[8 + s % 4] >> (2 * (s / 4))) & 3) << 4));
    }
};

// MXFP4's values doubled (0, 1, 2, 3, 4, 6, 8, 12 and their negatives) as int8, by code n (0-15).
__device__ __forceinline__ u32 mxfp4_int8(u32 n) { return table16(0x0C08060403020100ull, 0xF4F8FAFCFDFEFF00ull, n); }

// A block of 32 as q4_0's nibbles, each code looked up to its doubled value; half of 2^(e - 127)
// the scale. 17-byte blocks leave every field 1-byte aligned: bytes read singly.
struct mxfp4_mma {
    typedef block_mxfp4 block;
    static constexpr int QK = 32;
    static constexpr bool HALVES = false;
    __device__ static float2 run(const block* b, int, u32 v[8]) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            u32 lo = 0, hi = 0;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const u32 q = b->qs[4 * i + j];
                lo |= mxfp4_int8(q & 0xF) << (8 * j);
                hi |= mxfp4_int8(q >> 4) << (8 * j);
            }
            v[i] = lo;
            v[4 + i] = hi;
        }
        return q8_0_mma::make_scales(e8m0_half(b->e), 0.0f);
    }
};
