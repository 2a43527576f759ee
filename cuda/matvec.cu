// y (ntok, nrows) = x (ntok, ncols) · W (nrows, ncols)ᵀ with W quantized: the decode-time product.
//
// Lanes walk a row's blocks part by part, so a warp's loads cover contiguous bytes. One token
// (decode): matvec_<type> gives each warp one row, matvec_rows2_<type> two, whose lanes load a
// part's activations once for both (at 4 bits, 8 bytes of activations a weight byte otherwise),
// at the cost of registers and so of warps in flight; the launcher chooses by type and size.
// matvec_batch_<type> takes up to MATVEC_MAX_TOKENS, one row per warp, and dots each decoded part
// with every activation row before moving on, so that the weights are read once.
//
// The matvec_add_* forms return r + x · Wᵀ (r shaped as y): a residual added in the product's
// epilogue, one op as the add after the projection then needs no launch of its own. r + sum is the
// add kernel's own float addition, so the result is bit for bit the product's and add.cu's.
//
// The matvec_norm_* forms (one token) take x before the RMSNorm that precedes the product in a
// layer and the norm's weight nw: each thread block normalizes the row into shared memory first,
// its scale summed as rmsnorm_f32 sums it in a block of norm_threads (rms_scale.cuh) and each
// element x * s * nw as rmsnorm_f32 writes it, so y is bit for bit rmsnorm_f32's then matvec's,
// in one launch instead of two (a small model's decode step is bound by its launches). Each block
// reads the row and nw again (L2 hits); rows of up to MATVEC_NORM_COLS (matvec_rows.cuh).
#include "matvec_rows.cuh"

template <class Q, int R>
__device__ void matvec_rows(const u8* w, const float* x, const float* add, float* y, int ncols, int nrows) {
    const int row0 = (blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE) * R;
    if (row0 >= nrows) return;
    const int lane = threadIdx.x % WARP_SIZE;
    const int nblocks = ncols / Q::QK;
    const typename Q::block* blocks[R];
#pragma unroll
    for (int r = 0; r < R; r++)  // rows past the end read the last one again and store nothing
        blocks[r] = (const typename Q::block*)w + (i64)min(row0 + r, nrows - 1) * nblocks;
    float sums[R];
    dot_rows<Q, R>(blocks, x, nblocks, sums);
#pragma unroll
    for (int r = 0; r < R; r++)
        if (lane == 0 && row0 + r < nrows) y[row0 + r] = add ? add[row0 + r] + sums[r] : sums[r];
}

template <class Q, int NT>
__device__ void matvec(const u8* w, const float* x, const float* add, float* y, int ncols, int nrows, int ntok) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= nrows) return;
    const typename Q::block* blocks[1] = {(const typename Q::block*)w + (i64)row * (ncols / Q::QK)};
    float sums[1][NT];
    dot_rows_tokens<Q, 1, NT>(blocks, x, ncols, ntok, sums);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= ntok) break;
        if (threadIdx.x % WARP_SIZE == 0) y[(i64)t * nrows + row] = add ? add[(i64)t * nrows + row] + sums[0][t] : sums[0][t];
    }
}

template <class Q, int R>
__device__ void matvec_norm(const u8* w, const float* x, const float* nw, float* y, int ncols, int nrows, float eps,
                            int norm_threads) {
    matvec_rows<Q, R>(w, normed_row(x, nw, ncols, eps, norm_threads), nullptr, y, ncols, nrows);
}

#define MATVEC_FORMS(form, type, add_param, add)                                                          \
    extern "C" __global__ void matvec##form##_##type(const u8* __restrict__ w,                            \
                                                     const float* __restrict__ x add_param,               \
                                                     float* __restrict__ y, int ncols, int nrows) {       \
        matvec_rows<type, 1>(w, x, add, y, ncols, nrows);                                                 \
    }                                                                                                     \
    extern "C" __global__ void matvec##form##_rows2_##type(const u8* __restrict__ w,                      \
                                                           const float* __restrict__ x add_param,         \
                                                           float* __restrict__ y, int ncols, int nrows) { \
        matvec_rows<type, 2>(w, x, add, y, ncols, nrows);                                                 \
    }                                                                                                     \
    extern "C" __global__ void matvec##form##_batch_##type(const u8* __restrict__ w,                      \
                                                           const float* __restrict__ x add_param,         \
                                                           float* __restrict__ y, int ncols, int nrows,   \
                                                           int ntok) {                                    \
        matvec<type, MATVEC_MAX_TOKENS>(w, x, add, y, ncols, nrows, ntok);                                \
    }

// Each form without and with the residual r (matvec_add_*), whose parameter follows x, and the
// one-token forms with the norm (matvec_norm_*).
#define MATVEC_R , const float* __restrict__ r
#define MATVEC(type)                \
    MATVEC_FORMS(, type, , nullptr) \
    MATVEC_FORMS(_add, type, MATVEC_R, r)                                                                    \
    MATVEC_NORM_FORM(, type, 1)                                                                          \
    MATVEC_NORM_FORM(_rows2, type, 2)

#define MATVEC_NORM_FORM(form, type, R)                                                                  \
    extern "C" __global__ void matvec_norm##form##_##type(const u8* __restrict__ w, const float* __restrict__ x, \
                                                          const float* __restrict__ nw, float* __restrict__ y,  \
                                                          int ncols, int nrows, float eps, int norm_threads) {  \
        matvec_norm<type, R>(w, x, nw, y, ncols, nrows, eps, norm_threads);                              \
    }

MATVEC(f32)
MATVEC(f16)
MATVEC(bf16)
MATVEC(q8_0)
MATVEC(q4_0)
MATVEC(q4_1)
MATVEC(q5_0)
MATVEC(q5_1)
MATVEC(q4_K)
MATVEC(q5_K)
MATVEC(q6_K)
MATVEC(q2_K)
MATVEC(q3_K)
MATVEC(iq4_nl)
MATVEC(iq4_xs)
MATVEC(mxfp4)
