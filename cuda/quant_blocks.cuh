// GGUF tensor types: the byte layout of each block (as in ggml-common.h) and how a thread decodes
// its share of one.
//
// Each type splits a block into PARTS parts; a part decodes to GROUPS runs of 4 consecutive
// elements, run g starting at element group_start(part, g) of the block. Neighbouring threads take
// neighbouring parts, so a warp reads a row's bytes contiguously. Plain types (f32, f16, bf16) are
// read as "blocks" of 4 elements, so their rows must hold a multiple of 4.
#pragma once
#include "common.cuh"

struct block_q8_0 {  // 32 elements: d * q
    u16 d;
    i8 qs[32];
};
static_assert(sizeof(block_q8_0) == 34, "q8_0 block size");

struct block_q4_0 {  // 32 elements: d * (q - 8); element j < 16 in the low nibble of qs[j], j + 16 in its high nibble
    u16 d;
    u8 qs[16];
};
static_assert(sizeof(block_q4_0) == 18, "q4_0 block size");

struct block_q4_1 {  // 32 elements: d * q + m, nibbles as q4_0
    u16 d, m;
    u8 qs[16];
};
static_assert(sizeof(block_q4_1) == 20, "q4_1 block size");

struct block_q5_0 {  // 32 elements: d * (q - 16); bit j of the little-endian qh is bit 4 of element j
    u16 d;
    u8 qh[4];
    u8 qs[16];
};
static_assert(sizeof(block_q5_0) == 22, "q5_0 block size");

struct block_q5_1 {  // 32 elements: d * q + m, bits as q5_0
    u16 d, m;
    u8 qh[4];
    u8 qs[16];
};
static_assert(sizeof(block_q5_1) == 24, "q5_1 block size");

// 256 elements in 8 sub-blocks of 32: d * scale[s] * q - dmin * min[s], with 6-bit scales and mins
// packed in 12 bytes. qs byte group g (32 bytes) holds sub-block 2g in its low nibbles and 2g + 1
// in its high nibbles.
struct block_q4_K {
    u16 d, dmin;
    u8 scales[12];
    u8 qs[128];
};
static_assert(sizeof(block_q4_K) == 144, "q4_K block size");

struct block_q5_K {  // as q4_K, and bit s of qh[i] is bit 4 of element i of sub-block s
    u16 d, dmin;
    u8 scales[12];
    u8 qh[32];
    u8 qs[128];
};
static_assert(sizeof(block_q5_K) == 176, "q5_K block size");

// 256 elements in two halves of 128: d * scales[e / 16] * (q - 32). In half h, element l + 32k
// (l < 32, quarter k) takes its low 4 bits from ql[64h + l + 32(k & 1)] (low nibble for k < 2,
// high nibble otherwise) and its top 2 bits from bits 2k..2k+1 of qh[32h + l].
struct block_q6_K {
    u8 ql[128];
    u8 qh[64];
    i8 scales[16];
    u16 d;
};
static_assert(sizeof(block_q6_K) == 210, "q6_K block size");

// Plain types, read in blocks of 4 elements.
struct block_f32 {
    float v[4];
};
static_assert(sizeof(block_f32) == 16, "f32 block size");

struct block_16bit {  // f16 or bf16
    u16 v[4];
};
static_assert(sizeof(block_16bit) == 8, "16-bit block size");

// Byte i (0-3) of a little-endian word.
__device__ __forceinline__ u32 byte_of(u32 w, int i) { return (w >> (8 * i)) & 0xFF; }

struct f32 {
    typedef block_f32 block;
    static constexpr int QK = 4, PARTS = 1, GROUPS = 1;
    __device__ static int group_start(int, int) { return 0; }
    __device__ static void decode(const block* b, int, float v[4]) {
        const float4 q = load_f4(b->v);
        v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
    }
};

struct f16 {
    typedef block_16bit block;
    static constexpr int QK = 4, PARTS = 1, GROUPS = 1;
    __device__ static int group_start(int, int) { return 0; }
    __device__ static void decode(const block* b, int, float v[4]) {
        const uint2 q = load_u2(b->v);
        v[0] = f16_to_f32(q.x & 0xFFFF); v[1] = f16_to_f32(q.x >> 16);
        v[2] = f16_to_f32(q.y & 0xFFFF); v[3] = f16_to_f32(q.y >> 16);
    }
};

struct bf16 {
    typedef block_16bit block;
    static constexpr int QK = 4, PARTS = 1, GROUPS = 1;
    __device__ static int group_start(int, int) { return 0; }
    __device__ static void decode(const block* b, int, float v[4]) {
        const uint2 q = load_u2(b->v);
        v[0] = bf16_to_f32(q.x & 0xFFFF); v[1] = bf16_to_f32(q.x >> 16);
        v[2] = bf16_to_f32(q.y & 0xFFFF); v[3] = bf16_to_f32(q.y >> 16);
    }
};

struct q8_0 {  // part p: elements 8p..8p+7
    typedef block_q8_0 block;
    static constexpr int QK = 32, PARTS = 4, GROUPS = 2;
    __device__ static int group_start(int part, int g) { return 8 * part + 4 * g; }
    __device__ static void decode(const block* b, int part, float v[8]) {
        const float d = f16_to_f32(b->d);
#pragma unroll
        for (int g = 0; g < 2; g++) {
            const u32 w = load_u32_a2(b->qs + 8 * part + 4 * g);
#pragma unroll
            for (int i = 0; i < 4; i++) v[4 * g + i] = d * uint_to_f32(byte_of(w, i) ^ 0x80, 128.0f);
        }
    }
};

struct q4_0 {  // part p: bytes 4p..4p+3 of qs, so elements 4p.. (low nibbles) and 16 + 4p.. (high)
    typedef block_q4_0 block;
    static constexpr int QK = 32, PARTS = 4, GROUPS = 2;
    __device__ static int group_start(int part, int g) { return 4 * part + 16 * g; }
    __device__ static void decode(const block* b, int part, float v[8]) {
        const float d = f16_to_f32(b->d);
        const u32 w = load_u32_a2(b->qs + 4 * part);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[i] = d * uint_to_f32((w >> (8 * i)) & 0xF, 8.0f);
            v[4 + i] = d * uint_to_f32((w >> (8 * i + 4)) & 0xF, 8.0f);
        }
    }
};

struct q4_1 {
    typedef block_q4_1 block;
    static constexpr int QK = 32, PARTS = 4, GROUPS = 2;
    __device__ static int group_start(int part, int g) { return 4 * part + 16 * g; }
    __device__ static void decode(const block* b, int part, float v[8]) {
        const float d = f16_to_f32(b->d), m = f16_to_f32(b->m);
        const u32 w = load_u32(b->qs + 4 * part);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[i] = d * uint_to_f32((w >> (8 * i)) & 0xF) + m;
            v[4 + i] = d * uint_to_f32((w >> (8 * i + 4)) & 0xF) + m;
        }
    }
};

struct q5_0 {
    typedef block_q5_0 block;
    static constexpr int QK = 32, PARTS = 4, GROUPS = 2;
    __device__ static int group_start(int part, int g) { return 4 * part + 16 * g; }
    __device__ static void decode(const block* b, int part, float v[8]) {
        const float d = f16_to_f32(b->d);
        const u32 qh = load_u32_a2(b->qh), w = load_u32_a2(b->qs + 4 * part);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int j = 4 * part + i;
            v[i] = d * uint_to_f32(((w >> (8 * i)) & 0xF) | (((qh >> j) & 1) << 4), 16.0f);
            v[4 + i] = d * uint_to_f32(((w >> (8 * i + 4)) & 0xF) | (((qh >> (j + 16)) & 1) << 4), 16.0f);
        }
    }
};

struct q5_1 {
    typedef block_q5_1 block;
    static constexpr int QK = 32, PARTS = 4, GROUPS = 2;
    __device__ static int group_start(int part, int g) { return 4 * part + 16 * g; }
    __device__ static void decode(const block* b, int part, float v[8]) {
        const float d = f16_to_f32(b->d), m = f16_to_f32(b->m);
        const u32 qh = load_u32(b->qh), w = load_u32(b->qs + 4 * part);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int j = 4 * part + i;
            v[i] = d * uint_to_f32(((w >> (8 * i)) & 0xF) | (((qh >> j) & 1) << 4)) + m;
            v[4 + i] = d * uint_to_f32(((w >> (8 * i + 4)) & 0xF) | (((qh >> (j + 16)) & 1) << 4)) + m;
        }
    }
};

// Scale and min of sub-block j of a q4_K/q5_K block.
__device__ __forceinline__ void k_scale_min(const u8* s, int j, float& sc, float& mn) {
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Part p of a q4_K/q5_K block: bytes h..h+15 (h = 16 * (p % 2)) of qs byte group g = p / 2, so
// elements h.. of sub-blocks 2g (low nibbles) and 2g + 1 (high nibbles); groups 0-3 run through
// the first and 4-7 through the second.
__device__ __forceinline__ int k_group_start(int part, int g) {
    return 64 * (part / 2) + 32 * (g / 4) + 16 * (part % 2) + 4 * (g % 4);
}

struct q4_K {
    typedef block_q4_K block;
    static constexpr int QK = 256, PARTS = 8, GROUPS = 8;
    __device__ static int group_start(int part, int g) { return k_group_start(part, g); }
    __device__ static void decode(const block* b, int part, float v[32]) {
        const int g = part / 2;
        const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
        float sc0, mn0, sc1, mn1;
        k_scale_min(b->scales, 2 * g, sc0, mn0);
        k_scale_min(b->scales, 2 * g + 1, sc1, mn1);
        const float a0 = d * sc0, c0 = dmin * mn0, a1 = d * sc1, c1 = dmin * mn1;
        const uint4 q = load_u4(b->qs + 32 * g + 16 * (part % 2));
        const u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const u32 byte = byte_of(w[i / 4], i % 4);
            v[i] = a0 * uint_to_f32(byte & 0xF) - c0;
            v[16 + i] = a1 * uint_to_f32(byte >> 4) - c1;
        }
    }
};

struct q5_K {
    typedef block_q5_K block;
    static constexpr int QK = 256, PARTS = 8, GROUPS = 8;
    __device__ static int group_start(int part, int g) { return k_group_start(part, g); }
    __device__ static void decode(const block* b, int part, float v[32]) {
        const int g = part / 2, h = 16 * (part % 2);
        const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
        float sc0, mn0, sc1, mn1;
        k_scale_min(b->scales, 2 * g, sc0, mn0);
        k_scale_min(b->scales, 2 * g + 1, sc1, mn1);
        const float a0 = d * sc0, c0 = dmin * mn0, a1 = d * sc1, c1 = dmin * mn1;
        const uint4 q = load_u4(b->qs + 32 * g + h), hi = load_u4(b->qh + h);
        const u32 w[4] = {q.x, q.y, q.z, q.w}, wh[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const u32 byte = byte_of(w[i / 4], i % 4), bits = byte_of(wh[i / 4], i % 4) >> (2 * g);
            v[i] = a0 * uint_to_f32((byte & 0xF) | ((bits & 1) << 4)) - c0;
            v[16 + i] = a1 * uint_to_f32((byte >> 4) | ((bits & 2) << 3)) - c1;
        }
    }
};

// Part p: half h = p / 8 and l = 4 * (p % 8)..+3, one group per quarter k (elements 128h + 32k + l..).
struct q6_K {
    typedef block_q6_K block;
    static constexpr int QK = 256, PARTS = 16, GROUPS = 4;
    __device__ static int group_start(int part, int g) { return 128 * (part / 8) + 32 * g + 4 * (part % 8); }
    __device__ static void decode(const block* b, int part, float v[16]) {
        const int h = part / 8, l = 4 * (part % 8);
        const float d = f16_to_f32(b->d);
        const u32 lo = load_u32_a2(b->ql + 64 * h + l), lo2 = load_u32_a2(b->ql + 64 * h + 32 + l);
        const u32 top = load_u32_a2(b->qh + 32 * h + l);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float a = d * b->scales[8 * h + 2 * k + l / 16];
            const u32 nibbles = k % 2 ? lo2 : lo;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const u32 q = ((byte_of(nibbles, i) >> (4 * (k / 2))) & 0xF) | (((byte_of(top, i) >> (2 * k)) & 3) << 4);
                v[4 * k + i] = a * uint_to_f32(q, 32.0f);
            }
        }
    }
};
