// The grouped product for experts with few tokens: for each tile (expert e, first grouped row r,
// count c <= MOE_MATVEC_TOKENS) of tiles (n_tiles, 3), yg (P, nrows)[r + t] = xg[r + t] · W_eᵀ for
// t < c, W the n_expert matrices stacked in one quantized tensor (n_expert * nrows, ncols) and xg
// the activations in the grouping moe_sort made (moe_gather).
//
// Grid (nrows / warps, n_tiles), one warp per output row as matvec_batch_<type> (matvec.cu): a
// warp decodes each weight of its row once and dots it with the tile's c rows, so an expert's
// matrix is read once per MOE_MATVEC_TOKENS of its tokens, where matvec_experts reads it per pair.
#include "matvec_rows.cuh"

#define MOE_MATVEC_TOKENS 8

template <class Q>
__device__ void moe_matvec(const u8* w, const float* xg, float* yg, const int* tiles, int ncols, int nrows) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= nrows) return;
    const int* tile = tiles + 3 * (i64)blockIdx.y;
    const int expert = tile[0], r0 = tile[1], ntok = tile[2];
    const typename Q::block* blocks[1] = {(const typename Q::block*)w + ((i64)expert * nrows + row) * (ncols / Q::QK)};
    float sums[1][MOE_MATVEC_TOKENS];
    dot_rows_tokens<Q, 1, MOE_MATVEC_TOKENS>(blocks, xg + (i64)r0 * ncols, ncols, ntok, sums);
    if (threadIdx.x % WARP_SIZE) return;
#pragma unroll
    for (int t = 0; t < MOE_MATVEC_TOKENS; t++) {   // constant indices keep the sums in registers
        if (t >= ntok) break;
        yg[((i64)r0 + t) * nrows + row] = sums[0][t];
    }
}

#define MOE_MATVEC(type)                                                                                      \
    extern "C" __global__ void moe_matvec_##type(const u8* __restrict__ w, const float* __restrict__ xg,       \
                                                 float* __restrict__ yg, const int* __restrict__ tiles,       \
                                                 int ncols, int nrows) {                                     \
        moe_matvec<type>(w, xg, yg, tiles, ncols, nrows);                                                     \
    }

MOE_MATVEC(f32)
MOE_MATVEC(f16)
MOE_MATVEC(bf16)
MOE_MATVEC(q8_0)
MOE_MATVEC(q4_0)
MOE_MATVEC(q4_1)
MOE_MATVEC(q5_0)
MOE_MATVEC(q5_1)
MOE_MATVEC(q4_K)
MOE_MATVEC(q5_K)
MOE_MATVEC(q6_K)
MOE_MATVEC(q2_K)
MOE_MATVEC(q3_K)
MOE_MATVEC(iq4_nl)
MOE_MATVEC(iq4_xs)
MOE_MATVEC(mxfp4)
