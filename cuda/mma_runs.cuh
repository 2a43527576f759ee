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

// Sub-block r (of 8) of a q4_K block: d * sc * q - dmin * mn, q in the low (r even) or high
// nibbles of qs[32 (r / 2)..+31].
struct q4_K_mma {
    typedef block_q4_K block;
    static constexpr int QK = 256;
    static constexpr bool HALVES = false;
    __device__ static float2 run(const block* b, int r, u32 v[8]) {
        const int shift = 4 * (r % 2);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint4 q = load_u4(b->qs + 32 * (r / 2) + 16 * h);
            v[4 * h] = (q.x >> shift) & MMA_LOW_NIBBLES;
            v[4 * h + 1] = (q.y >> shift) & MMA_LOW_NIBBLES;
            v[4 * h + 2] = (q.z >> shift) & MMA_LOW_NIBBLES;
            v[4 * h + 3] = (q.w >> shift) & MMA_LOW_NIBBLES;
        }
        float sc, mn;
        k_scale_min(b->scales, r, sc, mn);
        return q8_0_mma::make_scales(f16_to_f32(b->d) * sc, -f16_to_f32(b->dmin) * mn);
    }
};

// Run r = 4h + k of a q6_K block, elements 128h + 32k + l (l < 32): low 4 bits in the low (k < 2)
// or high nibble of ql[64h + 32 (k % 2) + l], top 2 bits as bits 2k, 2k + 1 of qh[32h + l];
// d * scales[8h + 2k + l / 16] * (q - 32), two scales a run.
struct q6_K_mma {
    typedef block_q6_K block;
    static constexpr int QK = 256;
    static constexpr bool HALVES = true;
    __device__ static float2 run(const block* b, int r, u32 v[8]) {
        const int h = r / 4, k = r % 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u32 lo = (load_u32_a2(b->ql + 64 * h + 32 * (k % 2) + 4 * i) >> (4 * (k / 2))) & MMA_LOW_NIBBLES;
            const u32 top = (load_u32_a2(b->qh + 32 * h + 4 * i) >> (2 * k)) & 0x03030303u;
            v[i] = bytes_less(lo | (top << 4), 0x20202020u);
        }
        const float d = f16_to_f32(b->d);
        return q8_0_mma::make_scales(d * (float)b->scales[8 * h + 2 * k], d * (float)b->scales[8 * h + 2 * k + 1]);
    }
};
