// W (nrows, ncols) quantized -> float16, for the tensor-core GEMM that prefill multiplies with.
//
// A matrix is a flat run of blocks, so one thread per block part needs no notion of rows.
#include "common.cuh"
#include "quant_blocks.cuh"

template <class Q>
__device__ void dequantize(const u8* w, u16* y, i64 nparts) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nparts) return;
    const i64 ib = i / Q::PARTS;
    const int part = i % Q::PARTS;
    float v[4 * Q::GROUPS];
    Q::decode((const typename Q::block*)w + ib, part, v);
#pragma unroll
    for (int g = 0; g < Q::GROUPS; g++) {
        uint2 h;
        h.x = f32_to_f16(v[4 * g]) | ((u32)f32_to_f16(v[4 * g + 1]) << 16);
        h.y = f32_to_f16(v[4 * g + 2]) | ((u32)f32_to_f16(v[4 * g + 3]) << 16);
        u16* out = y + ib * Q::QK + Q::group_start(part, g);
        CHECK_ALIGNED(out, 8);
        *(uint2*)out = h;
    }
}

// nparts = rows * ncols / QK * PARTS, which the launcher computes.
#define DEQUANTIZE(type)                                                                               \
    extern "C" __global__ void dequantize_##type(const u8* __restrict__ w, u16* __restrict__ y, int nrows, \
                                                 int ncols) {                                          \
        dequantize<type>(w, y, (i64)nrows * (ncols / type::QK) * type::PARTS);                         \
    }

DEQUANTIZE(f32)
DEQUANTIZE(f16)
DEQUANTIZE(bf16)
DEQUANTIZE(q8_0)
DEQUANTIZE(q4_0)
DEQUANTIZE(q4_1)
DEQUANTIZE(q5_0)
DEQUANTIZE(q5_1)
DEQUANTIZE(q4_K)
DEQUANTIZE(q5_K)
DEQUANTIZE(q6_K)
DEQUANTIZE(q2_K)
DEQUANTIZE(q3_K)
DEQUANTIZE(iq4_nl)
DEQUANTIZE(iq4_xs)
DEQUANTIZE(mxfp4)
