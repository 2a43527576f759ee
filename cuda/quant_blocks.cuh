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

// 256 elements in 16 sub-blocks of 16: d * (scales[s] & 0xF) * q - dmin * (scales[s] >> 4), q 2 bits.
// In half h, element l + 32k (l < 32, quarter k) is bits 2k..2k+1 of qs[32h + l].
struct block_q2_K {
    u8 scales[16];
    u8 qs[64];
    u16 d, dmin;
};
static_assert(sizeof(block_q2_K) == 84, "q2_K block size");

// 256 elements in 16 sub-blocks of 16: d * (scale[s] - 32) * q, q = (2 bits as q2_K) - 4 unless bit
// m of hmask[l] is set for element 32m + l. The 6-bit scale s has its low 4 bits in scales[s % 8]
// (bits 4 * (s / 8)) and its top 2 in scales[8 + s % 4] (bits 2 * (s / 4)).
struct block_q3_K {
    u8 hmask[32];
    u8 qs[64];
    u8 scales[12];
    u16 d;
};
static_assert(sizeof(block_q3_K) == 110, "q3_K block size");

struct block_iq4_nl {  // 32 elements: d * iq4_value(q), nibbles as q4_0
    u16 d;
    u8 qs[16];
};
static_assert(sizeof(block_iq4_nl) == 18, "iq4_nl block size");

// 256 elements in 8 sub-blocks of 32: d * (scale[j] - 32) * iq4_value(q). The 6-bit scale j has
// its low 4 bits in scales_l[j / 2] (bits 4 * (j % 2)) and its top 2 in bits 2j of scales_h; qs
// bytes 16j.. hold sub-block j's nibbles as q4_0.
struct block_iq4_xs {
    u16 d, scales_h;
    u8 scales_l[4];
    u8 qs[128];
};
static_assert(sizeof(block_iq4_xs) == 136, "iq4_xs block size");

// 32 elements: 2^(e - 128) * mxfp4_value(q), an E8M0 scale times E2M1 values doubled; nibbles as q4_0.
struct block_mxfp4 {
    u8 e;
    u8 qs[16];
};
static_assert(sizeof(block_mxfp4) == 17, "mxfp4 block size");

// Byte n (0-15) of the 16-byte table (lo, hi): a lookup that stays in registers.
__device__ __forceinline__ u32 table16(unsigned long long lo, unsigned long long hi, u32 n) {
    return (u32)((n < 8 ? lo : hi) >> (8 * (n & 7))) & 0xFF;
}

// IQ4_NL's 16 levels (-127, -104, ..., 113) plus 128, so that uint_to_f32(.., 128) gives them.
__device__ __forceinline__ u32 iq4_biased(u32 n) {
    return table16(0x766A5D4F3F2D1801ull, 0xF1D9C5B5A6998D81ull, n);
}

// MXFP4's values doubled (0, 1, 2, 3, 4, 6, 8, 12 and their negatives) plus 12.
__device__ __forceinline__ u32 mxfp4_biased(u32 n) {
    return table16(0x181412100F0E0D0Cull, 0x00040608090A0B0Cull, n);
}

// Half of 2^(e - 127): MXFP4's multiplier, its values being doubled. Subnormal for e < 2, which
// CuPy's -ftz=true flushes to zero on a GPU: blocks of at most 12 * 2^-127 decode to zeros there.
__device__ __forceinline__ float e8m0_half(u32 e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

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

// Part p of a q2_K/q3_K block, as q6_K's: half h = p / 8 and l = 4 * (p % 8)..+3, one group per
// quarter k (elements 128h + 32k + l..), whose sub-block is 8h + 2k + l / 16.
__device__ __forceinline__ int k2_group_start(int part, int g) { return 128 * (part / 8) + 32 * g + 4 * (part % 8); }

struct q2_K {
    typedef block_q2_K block;
    static constexpr int QK = 256, PARTS = 16, GROUPS = 4;
    __device__ static int group_start(int part, int g) { return k2_group_start(part, g); }
    __device__ static void decode(const block* b, int part, float v[16]) {
        const int h = part / 8, l = 4 * (part % 8);
        const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
        const u32 q = load_u32(b->qs + 32 * h + l);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const u32 s = b->scales[8 * h + 2 * k + l / 16];
            const float a = d * uint_to_f32(s & 0xF), c = dmin * uint_to_f32(s >> 4);
#pragma unroll
            for (int i = 0; i < 4; i++) v[4 * k + i] = a * uint_to_f32((byte_of(q, i) >> (2 * k)) & 3) - c;
        }
    }
};

struct q3_K {
    typedef block_q3_K block;
    static constexpr int QK = 256, PARTS = 16, GROUPS = 4;
    __device__ static int group_start(int part, int g) { return k2_group_start(part, g); }
    __device__ static void decode(const block* b, int part, float v[16]) {
        const int h = part / 8, l = 4 * (part % 8);
        const float d = f16_to_f32(b->d);
        const u32 q = load_u32_a2(b->qs + 32 * h + l), hm = load_u32_a2(b->hmask + l);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int m = 4 * h + k, s = 2 * m + l / 16;
            const u32 sc = ((b->scales[s % 8] >> (4 * (s / 8))) & 0xF)
                           | (((b->scales[8 + s % 4] >> (2 * (s / 4))) & 3) << 4);
            const float a = d * uint_to_f32(sc, 32.0f);
#pragma unroll
            for (int i = 0; i < 4; i++) {  // q + 4 is the two bits with the hmask bit as the third
                const u32 q4 = ((byte_of(q, i) >> (2 * k)) & 3) | (((byte_of(hm, i) >> m) & 1) << 2);
                v[4 * k + i] = a * uint_to_f32(q4, 4.0f);
            }
        }
    }
};

struct iq4_nl {  // parts as q4_0
    typedef block_iq4_nl block;
    static constexpr int QK = 32, PARTS = 4, GROUPS = 2;
    __device__ static int group_start(int part, int g) { return 4 * part + 16 * g; }
    __device__ static void decode(const block* b, int part, float v[8]) {
        const float d = f16_to_f32(b->d);
        const u32 w = load_u32_a2(b->qs + 4 * part);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[i] = d * uint_to_f32(iq4_biased((w >> (8 * i)) & 0xF), 128.0f);
            v[4 + i] = d * uint_to_f32(iq4_biased((w >> (8 * i + 4)) & 0xF), 128.0f);
        }
    }
};

// Part p: half (p % 2) of sub-block j = p / 2, bytes 8 * (p % 2).. of its 16, so elements
// 32j + 8 * (p % 2).. (low nibbles, groups 0-1) and 16 more on (high nibbles, groups 2-3).
struct iq4_xs {
    typedef block_iq4_xs block;
    static constexpr int QK = 256, PARTS = 16, GROUPS = 4;
    __device__ static int group_start(int part, int g) {
        return 32 * (part / 2) + 8 * (part % 2) + 16 * (g / 2) + 4 * (g % 2);
    }
    __device__ static void decode(const block* b, int part, float v[16]) {
        const int j = part / 2;
        const u32 sc = ((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b->scales_h >> (2 * j)) & 3) << 4);
        const float a = f16_to_f32(b->d) * uint_to_f32(sc, 32.0f);
        const uint2 q = load_u2(b->qs + 16 * j + 8 * (part % 2));
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const u32 w = g % 2 ? q.y : q.x;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                v[4 * g + i] = a * uint_to_f32(iq4_biased((byte_of(w, i) >> (4 * (g / 2))) & 0xF), 128.0f);
            }
        }
    }
};

struct mxfp4 {  // parts as q4_0; 17-byte blocks leave every field 1-byte aligned: bytes read singly
    typedef block_mxfp4 block;
    static constexpr int QK = 32, PARTS = 4, GROUPS = 2;
    __device__ static int group_start(int part, int g) { return 4 * part + 16 * g; }
    __device__ static void decode(const block* b, int part, float v[8]) {
        const float d = e8m0_half(b->e);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u32 q = b->qs[4 * part + i];
            v[i] = d * uint_to_f32(mxfp4_biased(q & 0xF), 12.0f);
            v[4 + i] = d * uint_to_f32(mxfp4_biased(q >> 4), 12.0f);
        }
    }
};
