// Rotary position embedding's turn of one pair of features (rope.cu, rope_store.cu): pair i of
// `dims` rotated features turns by p * freq_scale * base^(-2i/dims) / factors[i], its cosine and
// sine scaled by attn_factor. Llama pairs adjacent features (2i, 2i+1) ("norm"); NeoX-style models
// (Qwen, Gemma) pair i with i + dims/2.
//
// Angles are computed in double: at positions in the thousands a float angle is off by ~1e-4
// radians, and rotary embedding is cheap enough to afford the precision.
#pragma once
#include "common.cuh"

struct rope_turn {
    float c, s;
};

__device__ __forceinline__ rope_turn rope_angle(int pair, int p, const float* factors, int dims, float base,
                                                float freq_scale, float attn_factor) {
    const double angle =
        (double)p * ((double)freq_scale * pow((double)base, -(double)(2 * pair) / dims)) / factors[pair];
    return rope_turn{(float)cos(angle) * attn_factor, (float)sin(angle) * attn_factor};
}

// The features pair `pair` joins: a turns to a*c - b*s, b to a*s + b*c.
template <bool NEOX>
__device__ __forceinline__ int rope_first(int pair, int dims) { return NEOX ? pair : 2 * pair; }

template <bool NEOX>
__device__ __forceinline__ int rope_second(int pair, int dims) { return NEOX ? pair + dims / 2 : 2 * pair + 1; }

// Feature e of a head x (its first `dims` features rotated, the rest as they are) at position p.
template <bool NEOX>
__device__ __forceinline__ float rope_feature(const float* x, int e, int p, const float* factors, int dims, float base,
                                              float freq_scale, float attn_factor) {
    if (e >= dims) return x[e];
    const int pair = NEOX ? e % (dims / 2) : e / 2;
    const float xa = x[rope_first<NEOX>(pair, dims)], xb = x[rope_second<NEOX>(pair, dims)];
    const rope_turn r = rope_angle(pair, p, factors, dims, base, freq_scale, attn_factor);
    return e == rope_first<NEOX>(pair, dims) ? xa * r.c - xb * r.s : xa * r.s + xb * r.c;
}
