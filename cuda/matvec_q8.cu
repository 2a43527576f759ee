// y (ntok, nrows) = x · W (nrows, ncols)ᵀ with x quantized to 8 bits (quantize_q8.cu) and W in one
// of the types of dot_q8.cuh: the few-token products in integer dot products. As in matvec.cu,
// lanes walk a row's blocks part by part. One token: matvec_q8_<type> gives a warp one row,
// matvec_q8_rows2_<type> two, which share the activations' loads. Up to MATVEC_MAX_TOKENS:
// matvec_q8_batch_<type>, one row a warp, each part dotted with every token's activations. Each
// token's sum runs in the same order in all three, so a token's product does not depend on the
// tokens beside it. The matvec_q8_add_* forms add a residual r in the epilogue, as matvec.cu's
// matvec_add_* do. matvec_q8_pair_<A>_<B> is one token's product with two matrices of different
// types sharing x (q and k joined in type A, v in type B, as llama.cpp's Q4_K_M makes attn_v Q6_K
// in half the layers), their rows stacked in y: A's thread blocks first, each row summed as
// matvec_q8_<type> sums it, in one launch instead of two.
#include "common.cuh"
#include "dot_q8.cuh"

#define MATVEC_MAX_TOKENS 8

template <class Q, int R>
__device__ void matvec_q8_rows(const u8* w, const i8* xq, const float2* xs, const float* add, float* y, int ncols,
                               int nrows, int block) {
    const int row0 = (block * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE) * R;
    if (row0 >= nrows) return;
    const int lane = threadIdx.x % WARP_SIZE;
    const int nblocks = ncols / Q::QK;
    const typename Q::block* blocks[R];
#pragma unroll
    for (int r = 0; r < R; r++)  // rows past the end read the last one again and store nothing
        blocks[r] = (const typename Q::block*)w + (i64)min(row0 + r, nrows - 1) * nblocks;

    float acc[R] = {};
    for (int i = lane; i < nblocks * Q::PARTS; i += WARP_SIZE) {
        const int ib = i / Q::PARTS, part = i % Q::PARTS;
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] += Q::dot(blocks[r] + ib, part, xq + ib * Q::QK, xs + ib * (Q::QK / 32));
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float sum = warp_sum(acc[r]);
        if (lane == 0 && row0 + r < nrows) y[row0 + r] = add ? add[row0 + r] + sum : sum;
    }
}

template <class Q, int NT>
__device__ void matvec_q8_tokens(const u8* w, const i8* xq, const float2* xs, const float* add, float* y, int ncols,
                                 int nrows, int ntok) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= nrows) return;
    const int lane = threadIdx.x % WARP_SIZE;
    const int nblocks = ncols / Q::QK;
    const typename Q::block* blocks = (const typename Q::block*)w + (i64)row * nblocks;

    float acc[NT] = {};
    for (int i = lane; i < nblocks * Q::PARTS; i += WARP_SIZE) {
        const int ib = i / Q::PARTS, part = i % Q::PARTS;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= ntok) break;
            acc[t] += Q::dot(blocks + ib, part, xq + (i64)t * ncols + ib * Q::QK, xs + (i64)t * (ncols / 32) + ib * (Q::QK / 32));
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= ntok) break;
        const float sum = warp_sum(acc[t]);
        if (lane == 0) y[(i64)t * nrows + row] = add ? add[(i64)t * nrows + row] + sum : sum;
    }
}

#define MATVEC_Q8_FORMS(form, type, add_param, add)                                                          \
    extern "C" __global__ void matvec_q8##form##_##type(const u8* __restrict__ w, const i8* __restrict__ xq,     \
                                                        const float2* __restrict__ xs add_param,                 \
                                                        float* __restrict__ y, int ncols, int nrows) {           \
        matvec_q8_rows<type##_q8, 1>(w, xq, xs, add, y, ncols, nrows, blockIdx.x);                                            \
    }                                                                                                             \
    extern "C" __global__ void matvec_q8##form##_rows2_##type(const u8* __restrict__ w, const i8* __restrict__ xq, \
                                                              const float2* __restrict__ xs add_param,           \
                                                              float* __restrict__ y, int ncols, int nrows) {     \
        matvec_q8_rows<type##_q8, 2>(w, xq, xs, add, y, ncols, nrows, blockIdx.x);                                            \
    }                                                                                                             \
    extern "C" __global__ void matvec_q8##form##_batch_##type(const u8* __restrict__ w, const i8* __restrict__ xq, \
                                                              const float2* __restrict__ xs add_param,           \
                                                              float* __restrict__ y, int ncols, int nrows,       \
                                                              int ntok) {                                         \
        matvec_q8_tokens<type##_q8, MATVEC_MAX_TOKENS>(w, xq, xs, add, y, ncols, nrows, ntok);                    \
    }

// Each form without and with the residual r (matvec_q8_add_*), whose parameter follows xs.
#define MATVEC_Q8_R , const float* __restrict__ r
#define MATVEC_Q8(type)                \
    MATVEC_Q8_FORMS(, type, , nullptr) \
    MATVEC_Q8_FORMS(_add, type, MATVEC_Q8_R, r)

MATVEC_Q8(q8_0)
MATVEC_Q8(q4_0)
MATVEC_Q8(q4_1)
MATVEC_Q8(q4_K)
MATVEC_Q8(q6_K)

template <class QA, class QB>
__device__ void matvec_q8_pair(const u8* wa, const u8* wb, const i8* xq, const float2* xs, float* y, int ncols,
                               int nrows_a, int nrows_b) {
    const int warps = blockDim.x / WARP_SIZE, blocks_a = (nrows_a + warps - 1) / warps;
    if ((int)blockIdx.x < blocks_a)
        matvec_q8_rows<QA, 1>(wa, xq, xs, nullptr, y, ncols, nrows_a, blockIdx.x);
    else
        matvec_q8_rows<QB, 1>(wb, xq, xs, nullptr, y + nrows_a, ncols, nrows_b, blockIdx.x - blocks_a);
}

#define MATVEC_Q8_PAIR(a, b)                                                                                  \
    extern "C" __global__ void matvec_q8_pair_##a##_##b(const u8* __restrict__ wa, const u8* __restrict__ wb,  \
                                                        const i8* __restrict__ xq, const float2* __restrict__ xs, \
                                                        float* __restrict__ y, int ncols, int nrows_a,         \
                                                        int nrows_b) {                                         \
        matvec_q8_pair<a##_q8, b##_q8>(wa, wb, xq, xs, y, ncols, nrows_a, nrows_b);                            \
    }

MATVEC_Q8_PAIR(q4_K, q6_K)
