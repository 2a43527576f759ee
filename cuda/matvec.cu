// y (ntok, nrows) = x (ntok, ncols) · W (nrows, ncols)ᵀ with W quantized: the decode-time product.
//
// One warp per output row. Lanes walk the row's blocks part by part, so a warp's loads cover
// contiguous bytes, and each decoded part is dotted with every activation row before moving on:
// the weights, which dominate the traffic, are read once. matvec_<type> takes one token (decode);
// matvec_batch_<type> up to MATVEC_MAX_TOKENS, at the cost of registers (~2x) and so occupancy,
// which the one-token kernel keeps high to have enough loads in flight.
#include "common.cuh"
#include "quant_blocks.cuh"

#define MATVEC_MAX_TOKENS 8

template <class Q, int NT>
__device__ void matvec(const u8* w, const float* x, float* y, int ncols, int nrows, int ntok) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= nrows) return;
    const int lane = threadIdx.x % WARP_SIZE;
    const int nblocks = ncols / Q::QK;
    const typename Q::block* blocks = (const typename Q::block*)w + (i64)row * nblocks;

    float acc[NT] = {};
    for (int i = lane; i < nblocks * Q::PARTS; i += WARP_SIZE) {
        const int ib = i / Q::PARTS, part = i % Q::PARTS;
        float v[4 * Q::GROUPS];
        Q::decode(blocks + ib, part, v);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= ntok) break;
            const float* xb = x + (i64)t * ncols + ib * Q::QK;
#pragma unroll
            for (int g = 0; g < Q::GROUPS; g++) {
                const float4 xv = load_f4(xb + Q::group_start(part, g));
                acc[t] += v[4 * g] * xv.x + v[4 * g + 1] * xv.y + v[4 * g + 2] * xv.z + v[4 * g + 3] * xv.w;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= ntok) break;
        const float sum = warp_sum(acc[t]);
        if (lane == 0) y[(i64)t * nrows + row] = sum;
    }
}

#define MATVEC(type)                                                                                     \
    extern "C" __global__ void matvec_##type(const u8* __restrict__ w, const float* __restrict__ x,        \
                                             float* __restrict__ y, int ncols, int nrows) {               \
        matvec<type, 1>(w, x, y, ncols, nrows, 1);                                                       \
    }                                                                                                    \
    extern "C" __global__ void matvec_batch_##type(const u8* __restrict__ w, const float* __restrict__ x,  \
                                                   float* __restrict__ y, int ncols, int nrows, int ntok) { \
        matvec<type, MATVEC_MAX_TOKENS>(w, x, y, ncols, nrows, ntok);                                    \
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
