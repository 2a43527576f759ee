// y (1, n) = act(x · Gᵀ) * (x · Uᵀ) with x quantized to 8 bits (quantize_q8.cu) and G, U the gate
// and up halves of the feed-forward block's joined matrix W (2n, ncols) (gate rows first), in one
// of the types of dot_q8.cuh; y also quantized to 8 bits (yq, ys) for the down product after it.
// One op, as matvec_glu.cu is for float activations: the one-token product, the GLU and its
// quantization (glu.cu's swiglu_q8 / geglu_q8), fused because a decode step's feed-forward block
// would otherwise launch the GLU between its two products for n floats of work. A quantized run
// needs 32 neighbouring outputs, so a thread block takes one run: 32 warps, warp i gate row i and
// up row n + i of the run, each summed as matvec_q8.cu's matvec_q8_<type> sums a row; warp 0 then
// applies glu_value and quantize_run to the 32 (n a multiple of 32): bit for bit matvec_q8's
// products, then glu.cu's _q8 kernels.
#include "dot_q8.cuh"
#include "glu.cuh"
#include "q8_run.cuh"

#define GLU_Q8_WARPS WARP_SIZE  // a warp per output of the block's run

template <class Q>
__device__ void matvec_q8_glu(const u8* w, const i8* xq, const float2* xs, float* y, i8* yq, float2* ys, int ncols,
                              int n, bool gelu) {
    __shared__ float gates[GLU_Q8_WARPS], ups[GLU_Q8_WARPS];
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int row = blockIdx.x * GLU_Q8_WARPS + warp;
    const int nblocks = ncols / Q::QK;
    const typename Q::block* gate = (const typename Q::block*)w + (i64)row * nblocks;
    const typename Q::block* up = (const typename Q::block*)w + (i64)(n + row) * nblocks;

    float acc[2] = {};
    for (int i = lane; i < nblocks * Q::PARTS; i += WARP_SIZE) {
        const int ib = i / Q::PARTS, part = i % Q::PARTS;
        acc[0] += Q::dot(gate + ib, part, xq + ib * Q::QK, xs + ib * (Q::QK / 32));
        acc[1] += Q::dot(up + ib, part, xq + ib * Q::QK, xs + ib * (Q::QK / 32));
    }
    const float gate_sum = warp_sum(acc[0]), up_sum = warp_sum(acc[1]);
    if (lane == 0) {
        gates[warp] = gate_sum;
        ups[warp] = up_sum;
    }
    __syncthreads();
    if (warp == 0) {
        const float v = glu_value(gates[lane], ups[lane], gelu);
        y[(i64)blockIdx.x * WARP_SIZE + lane] = v;
        quantize_run(v, blockIdx.x, yq, ys);
    }
}

#define MATVEC_Q8_GLU(type)                                                                                          \
    extern "C" __global__ void __launch_bounds__(GLU_Q8_WARPS * WARP_SIZE) matvec_q8_glu_##type(                     \
        const u8* __restrict__ w, const i8* __restrict__ xq, const float2* __restrict__ xs, float* __restrict__ y,   \
        i8* __restrict__ yq, float2* __restrict__ ys, int ncols, int n, int gelu) {                                  \
        matvec_q8_glu<type##_q8>(w, xq, xs, y, yq, ys, ncols, n, gelu != 0);                                         \
    }

MATVEC_Q8_GLU(q8_0)
MATVEC_Q8_GLU(q4_0)
MATVEC_Q8_GLU(q4_1)
MATVEC_Q8_GLU(q4_K)
MATVEC_Q8_GLU(q6_K)
