// Rotary position embedding of x (T, H, D) by the positions pos (rope.cuh has the turn): the first
// `dims` features of each head rotate in pairs and the rest are copied.
//
// One thread per pair.
#include "rope.cuh"

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
    const int a = rope_first<NEOX>(pair, dims), b = rope_second<NEOX>(pair, dims);
    const rope_turn r = rope_angle(pair, pos[t], factors, dims, base, freq_scale, attn_factor);
    const float xa = x[head + a], xb = x[head + b];
    y[head + a] = xa * r.c - xb * r.s;
    y[head + b] = xa * r.s + xb * r.c;
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
