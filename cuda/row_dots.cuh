// A warp's dot products of one quantized row with up to NT activation rows, each weight decoded
// once and dotted with every row before the next (the weights read once for all the rows):
// matvec_batch_<type> (matvec.cu) and the grouped expert product (moe_matvec.cu).
#pragma once
#include "common.cuh"
#include "quant_blocks.cuh"

// acc[t] = row · x[t] (x (ntok, ncols), ntok <= NT), on every lane of the warp.
template <class Q, int NT>
__device__ __forceinline__ void row_dots(const typename Q::block* blocks, const float* x, int ncols, int ntok,
                                         float (&acc)[NT]) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int nblocks = ncols / Q::QK;
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
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
        acc[t] = warp_sum(acc[t]);
    }
}
