// Pieces of the one-token float products (matvec.cu, matvec_glu.cu): a warp's dot products with
// its rows, and the RMSNorm of the input row that the *_norm_* forms compute in each block.
#pragma once
#include "common.cuh"
#include "quant_blocks.cuh"
#include "rms_scale.cuh"

#define MATVEC_MAX_TOKENS 8
#define MATVEC_NORM_COLS 4096

// x · each of the warp's R rows (blocks[r], quantized as Q), summed over the warp: in every lane.
// Lanes walk the rows' blocks part by part, so a warp's loads cover contiguous bytes; the R rows
// share each part's activation loads, and each row's sum runs in the same order whatever R is.
template <class Q, int R>
__device__ __forceinline__ void dot_rows(const typename Q::block* const (&blocks)[R], const float* x, int nblocks,
                                         float (&sums)[R]) {
    float acc[R] = {};
    for (int i = threadIdx.x % WARP_SIZE; i < nblocks * Q::PARTS; i += WARP_SIZE) {
        const int ib = i / Q::PARTS, part = i % Q::PARTS;
        float4 xv[Q::GROUPS];
#pragma unroll
        for (int g = 0; g < Q::GROUPS; g++) xv[g] = load_f4(x + ib * Q::QK + Q::group_start(part, g));
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v[4 * Q::GROUPS];
            Q::decode(blocks[r] + ib, part, v);
#pragma unroll
            for (int g = 0; g < Q::GROUPS; g++)
                acc[r] += v[4 * g] * xv[g].x + v[4 * g + 1] * xv[g].y + v[4 * g + 2] * xv[g].z + v[4 * g + 3] * xv[g].w;
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) sums[r] = warp_sum(acc[r]);
}

// x (ntok <= NT tokens' rows) · each of the warp's R rows, summed over the warp (every lane):
// each decoded part of a row is dotted with every token's activations before moving on, so that
// the weights are read once; each (row, token) sum runs in the same order whatever R and ntok are.
template <class Q, int R, int NT>
__device__ __forceinline__ void dot_rows_tokens(const typename Q::block* const (&blocks)[R], const float* x, int ncols,
                                                int ntok, float (&sums)[R][NT]) {
    const int nblocks = ncols / Q::QK;
    float acc[R][NT] = {};
    for (int i = threadIdx.x % WARP_SIZE; i < nblocks * Q::PARTS; i += WARP_SIZE) {
        const int ib = i / Q::PARTS, part = i % Q::PARTS;
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v[4 * Q::GROUPS];
            Q::decode(blocks[r] + ib, part, v);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= ntok) break;
                const float* xb = x + (i64)t * ncols + ib * Q::QK;
#pragma unroll
                for (int g = 0; g < Q::GROUPS; g++) {
                    const float4 xv = load_f4(xb + Q::group_start(part, g));
                    acc[r][t] += v[4 * g] * xv.x + v[4 * g + 1] * xv.y + v[4 * g + 2] * xv.z + v[4 * g + 3] * xv.w;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < ntok) sums[r][t] = warp_sum(acc[r][t]);
}

// The row x (ncols <= MATVEC_NORM_COLS) normed by nw into the block's shared memory, bit for bit
// as rmsnorm_f32 in a block of norm_threads writes it: -> that copy. Every thread must call it.
__device__ __forceinline__ const float* normed_row(const float* __restrict__ x, const float* __restrict__ nw, int ncols,
                                                   float eps, int norm_threads) {
    __shared__ float4 xn4[MATVEC_NORM_COLS / 4];  // float4s: aligned for dot_rows' load_f4
    float* xn = (float*)xn4;
    const float s = rms_scale(x, ncols, eps, norm_threads);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) xn[i] = x[i] * s * nw[i];
    __syncthreads();
    return xn;
}
