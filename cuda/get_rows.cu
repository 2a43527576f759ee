// y (n, ncols) float32 = rows ids[0..n) of W (·, ncols) quantized: the embedding lookup, and the
// gather of cached keys and values for prefill attention.
#include "common.cuh"
#include "quant_blocks.cuh"

template <class Q>
__device__ void get_rows(const u8* w, const int* ids, float* y, int ncols, int n) {
    const int parts_per_row = ncols / Q::QK * Q::PARTS;
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)n * parts_per_row) return;
    const int row = i / parts_per_row, ib = (i % parts_per_row) / Q::PARTS, part = i % Q::PARTS;
    const typename Q::block* src = (const typename Q::block*)w + (i64)ids[row] * (ncols / Q::QK) + ib;
    float v[4 * Q::GROUPS];
    Q::decode(src, part, v);
#pragma unroll
    for (int g = 0; g < Q::GROUPS; g++) {
        float* out = y + (i64)row * ncols + ib * Q::QK + Q::group_start(part, g);
        CHECK_ALIGNED(out, 16);
        *(float4*)out = float4{v[4 * g], v[4 * g + 1], v[4 * g + 2], v[4 * g + 3]};
    }
}

#define GET_ROWS(type)                                                                            \
    extern "C" __global__ void get_rows_##type(const u8* __restrict__ w, const int* __restrict__ ids, \
                                               float* __restrict__ y, int ncols, int n) {          \
        get_rows<type>(w, ids, y, ncols, n);                                                      \
    }

GET_ROWS(f32)
GET_ROWS(f16)
GET_ROWS(bf16)
GET_ROWS(q8_0)
GET_ROWS(q4_0)
GET_ROWS(q4_1)
GET_ROWS(q5_0)
GET_ROWS(q5_1)
GET_ROWS(q4_K)
GET_ROWS(q5_K)
GET_ROWS(q6_K)
GET_ROWS(q2_K)
GET_ROWS(q3_K)
GET_ROWS(iq4_nl)
GET_ROWS(iq4_xs)
GET_ROWS(mxfp4)
