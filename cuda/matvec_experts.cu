// The mixture-of-experts product: y (P, nrows) with row p = x_p · W_e (nrows, ncols)ᵀ for the pair
// p = (token t, choice j) = (p / k, p % k) and its expert e = experts[p], W the n_expert matrices
// stacked in one quantized tensor (n_expert * nrows, ncols), as the GGUF stores ffn_*_exps. x_p is
// x[t] when every choice of a token reads the same input (x (T, ncols)), or x[p] (x (P, ncols)).
//
// Grid (nrows / warps, P), one warp per output row as in matvec.cu. The experts are read from
// device memory, so a captured decode step replays for other routings.
#include "common.cuh"
#include "quant_blocks.cuh"

template <class Q>
__device__ void matvec_experts(const u8* w, const float* x, float* y, const int* experts, int ncols, int nrows,
                               int k, int x_per_pair) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= nrows) return;
    const int pair = blockIdx.y, lane = threadIdx.x % WARP_SIZE;
    const int nblocks = ncols / Q::QK;
    const typename Q::block* blocks = (const typename Q::block*)w + ((i64)experts[pair] * nrows + row) * nblocks;
    const float* xr = x + (i64)(x_per_pair ? pair : pair / k) * ncols;

    float acc = 0.0f;
    for (int i = lane; i < nblocks * Q::PARTS; i += WARP_SIZE) {
        const int ib = i / Q::PARTS, part = i % Q::PARTS;
        float v[4 * Q::GROUPS];
        Q::decode(blocks + ib, part, v);
#pragma unroll
        for (int g = 0; g < Q::GROUPS; g++) {
            const float4 xv = load_f4(xr + ib * Q::QK + Q::group_start(part, g));
            acc += v[4 * g] * xv.x + v[4 * g + 1] * xv.y + v[4 * g + 2] * xv.z + v[4 * g + 3] * xv.w;
        }
    }
    const float sum = warp_sum(acc);
    if (lane == 0) y[(i64)pair * nrows + row] = sum;
}

#define MATVEC_EXPERTS(type)                                                                             \
    extern "C" __global__ void matvec_experts_##type(const u8* __restrict__ w, const float* __restrict__ x, \
                                                     float* __restrict__ y, const int* __restrict__ experts, \
                                                     int ncols, int nrows, int k, int x_per_pair) {        \
        matvec_experts<type>(w, x, y, experts, ncols, nrows, k, x_per_pair);                             \
    }

MATVEC_EXPERTS(f32)
MATVEC_EXPERTS(f16)
MATVEC_EXPERTS(bf16)
MATVEC_EXPERTS(q8_0)
MATVEC_EXPERTS(q4_0)
MATVEC_EXPERTS(q4_1)
MATVEC_EXPERTS(q5_0)
MATVEC_EXPERTS(q5_1)
MATVEC_EXPERTS(q4_K)
MATVEC_EXPERTS(q5_K)
MATVEC_EXPERTS(q6_K)
MATVEC_EXPERTS(q2_K)
MATVEC_EXPERTS(q3_K)
MATVEC_EXPERTS(iq4_nl)
MATVEC_EXPERTS(iq4_xs)
MATVEC_EXPERTS(mxfp4)
