// Rotary position embedding of x (T, H, D): the first `dims` features of each head turn by
// pos[t] * freq_scale * base^(-2i/dims) / factors[i] in pairs (factors: Llama 3's rope_freqs or
// Phi-3's long-context factors, all ones for other models) and are scaled by attn_factor (Phi-3's
// long-context RoPE; 1 otherwise); the rest are copied. Llama pairs adjacent
// features (2i, 2i+1) ("norm"); NeoX-style models (Qwen, Gemma) pair i with i + dims/2.
//
// One thread per pair. Angles are computed in double: at positions in the thousands a float
// angle is off by ~1e-4 radians, and rotary embedding is cheap enough to afford the precision.
#include "common.cuh"

template <bool NEOX>
__device__ void rope(const float* x, float* y, const int* pos, const float* factors, int T, int H, int D,
                     int dims, float base, float freq_scale, float attn_factor) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const int half = D / 2;
    if (i >= (i64)T * H * half) return;
    const int pair = i % half;
    const int t = i / ((i64)H * half);
    const i64 head = (i / half) * D;
    if (2 * pair >= dims) {  // past the rotated features: copy two
        const int e = dims + 2 * (pair - dims / 2);
        y[head + e] = x[head + e];
        y[head + e + 1] = x[head + e + 1];
        return;
    }
    const int a = NEOX ? pair : 2 * pair, b = NEOX ? pair + dims / 2 : 2 * pair + 1;
    const double angle =
        (double)pos[t] * ((double)freq_scale * pow((double)base, -(double)(2 * pair) / dims)) / factors[pair];
    const float c = (float)cos(angle) * attn_factor, s = (float)sin(angle) * attn_factor;
    const float xa = x[head + a], xb = x[head + b];
    y[head + a] = xa * c - xb * s;
    y[head + b] = xa * s + xb * c;
}

extern "C" __global__ void rope_norm_f32(const float* __restrict__ x, float* __restrict__ y, const int* __restrict__ pos,
                                         const float* __restrict__ factors, int T, int H, int D, int dims,
                                         float base, float freq_scale, float attn_factor) {
    rope<false>(x, y, pos, factors, T, H, D, dims, base, freq_scale, attn_factor);
}

extern "C" __global__ void rope_neox_f32(const float* __restrict__ x, float* __restrict__ y, const int* __restrict__ pos,
                                         const float* __restrict__ factors, int T, int H, int D, int dims,
                                         float base, float freq_scale, float attn_factor) {
    rope<true>(x, y, pos, factors, T, H, D, dims, base, freq_scale, attn_factor);
}
