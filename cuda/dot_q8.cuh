// Dot products of a part of a weight block with activations quantized to 8 bits (quantize_q8.cu):
// integer sums of 4 products at a time (dp4a), scaled once per sub-block, as llama.cpp's mmvq.
//
// Activations come as int8 values xq and, per 32 of them, float2 (d, d * sum of the 32): element
// i is approximately d * xq[i]. Each type's dot(b, part, xq, xs) takes the block's xq and xs and
// returns the float sum of the part; parts split a block as PARTS, neighbouring lanes taking
// neighbouring parts. Terms of a whole 32-element block (a q4_1 min, a q4_K sub-block's min) are
// added by the lane of the block's first part only.
#pragma once
#include "common.cuh"
#include "quant_blocks.cuh"

#define LOW_NIBBLES 0x0F0F0F0Fu
#define ONES 0x01010101

// Sum of the 4 bytes of a, signed, times those of b, signed, plus c.
__device__ __forceinline__ int dot4(u32 a, u32 b, int c) { return __dp4a((int)a, (int)b, c); }

struct q8_0_q8 {  // part p: elements 8p..8p+7
    typedef block_q8_0 block;
    static constexpr int QK = 32, PARTS = 4;
    __device__ static float dot(const block* b, int part, const i8* xq, const float2* xs) {
        const uint2 a = load_u2(xq + 8 * part);
        const int sum = dot4(load_u32_a2(b->qs + 8 * part + 4), a.y, dot4(load_u32_a2(b->qs + 8 * part), a.x, 0));
        return f16_to_f32(b->d) * xs[0].x * (float)sum;
    }
};

// The two nibble runs of part p of a q4_0/q4_1 block (elements 4p.. and 16 + 4p..) against their
// activations: the sum of the unsigned nibbles' products and that of the activations.
__device__ __forceinline__ void q4_sums(u32 w, const i8* xq, int part, int& sum, int& xsum) {
    const u32 lo = load_u32(xq + 4 * part), hi = load_u32(xq + 16 + 4 * part);
    sum = dot4(w & LOW_NIBBLES, lo, dot4((w >> 4) & LOW_NIBBLES, hi, 0));
    xsum = dot4(ONES, lo, dot4(ONES, hi, 0));
}

struct q4_0_q8 {  // parts as q4_0's decode: d * (q - 8)
    typedef block_q4_0 block;
    static constexpr int QK = 32, PARTS = 4;
    __device__ static float dot(const block* b, int part, const i8* xq, const float2* xs) {
        int sum, xsum;
        q4_sums(load_u32_a2(b->qs + 4 * part), xq, part, sum, xsum);
        return f16_to_f32(b->d) * xs[0].x * (float)(sum - 8 * xsum);
    }
};

struct q4_1_q8 {  // d * q + m: the min times the block's activation sum, once
    typedef block_q4_1 block;
    static constexpr int QK = 32, PARTS = 4;
    __device__ static float dot(const block* b, int part, const i8* xq, const float2* xs) {
        int sum, xsum;
        q4_sums(load_u32(b->qs + 4 * part), xq, part, sum, xsum);
        const float dot = f16_to_f32(b->d) * xs[0].x * (float)sum;
        return part == 0 ? dot + f16_to_f32(b->m) * xs[0].y : dot;
    }
};

// Part p as q4_K's decode: bytes h..h+15 (h = 16 * (p % 2)) of qs group g = p / 2, elements h.. of
// sub-blocks 2g (low nibbles) and 2g + 1 (high nibbles).
struct q4_K_q8 {
    typedef block_q4_K block;
    static constexpr int QK = 256, PARTS = 8;
    __device__ static float dot(const block* b, int part, const i8* xq, const float2* xs) {
        const int g = part / 2, h = 16 * (part % 2);
        const uint4 q = load_u4(b->qs + 32 * g + h);
        const uint4 lo = load_u4(xq + 64 * g + h), hi = load_u4(xq + 64 * g + 32 + h);
        const u32 w[4] = {q.x, q.y, q.z, q.w}, xl[4] = {lo.x, lo.y, lo.z, lo.w}, xh[4] = {hi.x, hi.y, hi.z, hi.w};
        int sum0 = 0, sum1 = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            sum0 = dot4(w[i] & LOW_NIBBLES, xl[i], sum0);
            sum1 = dot4((w[i] >> 4) & LOW_NIBBLES, xh[i], sum1);
        }
        float sc0, mn0, sc1, mn1;
        k_scale_min(b->scales, 2 * g, sc0, mn0);
        k_scale_min(b->scales, 2 * g + 1, sc1, mn1);
        const float2 s0 = xs[2 * g], s1 = xs[2 * g + 1];
        const float dot = f16_to_f32(b->d) * (sc0 * s0.x * (float)sum0 + sc1 * s1.x * (float)sum1);
        return h == 0 ? dot - f16_to_f32(b->dmin) * (mn0 * s0.y + mn1 * s1.y) : dot;
    }
};

// Part p: half h = p / 4 and l = 8 * (p % 4)..+7 of each quarter k (elements 128h + 32k + l..),
// all in sub-block 8h + 2k + l / 16 and in the activations' block 4h + k. d * scale * (q - 32).
struct q6_K_q8 {
    typedef block_q6_K block;
    static constexpr int QK = 256, PARTS = 8;
    __device__ static float dot(const block* b, int part, const i8* xq, const float2* xs) {
        const int h = part / 4, l = 8 * (part % 4);
        const u32 lo[2] = {load_u32_a2(b->ql + 64 * h + l), load_u32_a2(b->ql + 64 * h + l + 4)};
        const u32 lo2[2] = {load_u32_a2(b->ql + 64 * h + 32 + l), load_u32_a2(b->ql + 64 * h + 32 + l + 4)};
        const u32 top[2] = {load_u32_a2(b->qh + 32 * h + l), load_u32_a2(b->qh + 32 * h + l + 4)};
        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint2 a = load_u2(xq + 128 * h + 32 * k + l);
            const u32 x[2] = {a.x, a.y};
            int sum = 0, xsum = 0;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const u32 q = (((k % 2 ? lo2[i] : lo[i]) >> (4 * (k / 2))) & LOW_NIBBLES) | (((top[i] >> (2 * k)) & 0x03030303u) << 4);
                sum = dot4(q, x[i], sum);
                xsum = dot4(ONES, x[i], xsum);
            }
            dot += (float)b->scales[8 * h + 2 * k + l / 16] * xs[4 * h + k].x * (float)(sum - 32 * xsum);
        }
        return f16_to_f32(b->d) * dot;
    }
};
