// y (1, n) = act(x · Gᵀ) * (x · Uᵀ), G and U the gate and up halves of the feed-forward block's
// joined matrix W (2n, ncols) (gate rows first): the one-token product and the GLU after it
// (glu.cu) in one launch, as a small model's decode step is bound by its launches. Each warp takes
// gate row i and up row n + i, as matvec.cu's two-rows-a-warp form takes two rows, and applies
// glu_value to its two sums: bit for bit matvec's product, then glu.cu's swiglu_f32 or geglu_f32.
// matvec_norm_glu_<type> takes x before the layer's RMSNorm and the norm's weight nw, and
// normalizes it first as matvec.cu's matvec_norm_* do (rows of up to MATVEC_NORM_COLS).
// matvec_glu_batch_<type> takes up to MATVEC_MAX_TOKENS tokens (a short prompt, a few decode
// rows) and dots each decoded part of the two rows with every token's activations, bit for bit
// matvec_batch_<type>'s products.
#include "glu.cuh"
#include "matvec_rows.cuh"

template <class Q>
__device__ void matvec_glu(const u8* w, const float* x, float* y, int ncols, int n, bool gelu) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= n) return;
    const int nblocks = ncols / Q::QK;
    const typename Q::block* blocks[2] = {(const typename Q::block*)w + (i64)row * nblocks,
                                          (const typename Q::block*)w + (i64)(n + row) * nblocks};
    float sums[2];
    dot_rows<Q, 2>(blocks, x, nblocks, sums);
    if (threadIdx.x % WARP_SIZE == 0) y[row] = glu_value(sums[0], sums[1], gelu);
}

template <class Q, int NT>
__device__ void matvec_glu_tokens(const u8* w, const float* x, float* y, int ncols, int n, int ntok, bool gelu) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= n) return;
    const int nblocks = ncols / Q::QK;
    const typename Q::block* blocks[2] = {(const typename Q::block*)w + (i64)row * nblocks,
                                          (const typename Q::block*)w + (i64)(n + row) * nblocks};
    float sums[2][NT];
    dot_rows_tokens<Q, 2, NT>(blocks, x, ncols, ntok, sums);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= ntok) break;
        if (threadIdx.x % WARP_SIZE == 0) y[(i64)t * n + row] = glu_value(sums[0][t], sums[1][t], gelu);
    }
}

#define MATVEC_GLU(type)                                                                                         \
    extern "C" __global__ void matvec_glu_##type(const u8* __restrict__ w, const float* __restrict__ x,           \
                                                 float* __restrict__ y, int ncols, int n, int gelu) {              \
        matvec_glu<type>(w, x, y, ncols, n, gelu != 0);                                                          \
    }                                                                                                            \
    extern "C" __global__ void matvec_norm_glu_##type(const u8* __restrict__ w, const float* __restrict__ x,      \
                                                      const float* __restrict__ nw, float* __restrict__ y,       \
                                                      int ncols, int n, float eps, int norm_threads, int gelu) { \
        matvec_glu<type>(w, normed_row(x, nw, ncols, eps, norm_threads), y, ncols, n, gelu != 0);                \
    }                                                                                                            \
    extern "C" __global__ void matvec_glu_batch_##type(const u8* __restrict__ w, const float* __restrict__ x,     \
                                                       float* __restrict__ y, int ncols, int n, int gelu,        \
                                                       int ntok) {                                               \
        matvec_glu_tokens<type, MATVEC_MAX_TOKENS>(w, x, y, ncols, n, ntok, gelu != 0);                          \
    }

MATVEC_GLU(f32)
MATVEC_GLU(f16)
MATVEC_GLU(bf16)
MATVEC_GLU(q8_0)
MATVEC_GLU(q4_0)
MATVEC_GLU(q4_1)
MATVEC_GLU(q5_0)
MATVEC_GLU(q5_1)
MATVEC_GLU(q4_K)
MATVEC_GLU(q5_K)
MATVEC_GLU(q6_K)
MATVEC_GLU(q2_K)
MATVEC_GLU(q3_K)
MATVEC_GLU(iq4_nl)
MATVEC_GLU(iq4_xs)
MATVEC_GLU(mxfp4)
