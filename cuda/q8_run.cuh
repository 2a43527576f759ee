// One run of 32 activations quantized for the integer products (dot_q8.cuh), one lane an element
// of a whole warp: d = max |x| / 127, xq = round(x / d), xs = (d, d * sum of xq). Run `run` of
// the row-major activations, whose element this lane holds as v.
#pragma once
#include "common.cuh"

__device__ __forceinline__ void quantize_run(float v, i64 run, i8* __restrict__ xq, float2* __restrict__ xs) {
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const int q = amax > 0.0f ? __float2int_rn(v / d) : 0;
    const int lane = threadIdx.x % WARP_SIZE;
    xq[run * WARP_SIZE + lane] = (i8)q;
    const float sum = warp_sum((float)q);  // exact: at most 32 * 127 in magnitude
    if (lane == 0) {
        float2 s;
        s.x = d;
        s.y = d * sum;
        xs[run] = s;
    }
}
