// Activations x (n elements, n a multiple of 32) -> 8-bit values for the integer products
// (dot_q8.cuh): per run of 32, d = max |x| / 127, xq = round(x / d), xs = (d, d * sum of xq).
// One warp a run, one thread an element.
#include "common.cuh"

extern "C" __global__ void quantize_q8(const float* __restrict__ x, i8* __restrict__ xq, float2* __restrict__ xs, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;  // whole warps: n is a multiple of 32
    const float v = x[i];
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const int q = amax > 0.0f ? __float2int_rn(v / d) : 0;
    xq[i] = (i8)q;
    const float sum = warp_sum((float)q);  // exact: at most 32 * 127 in magnitude
    if (i % WARP_SIZE == 0) {
        float2 s;
        s.x = d;
        s.y = d * sum;
        xs[i / WARP_SIZE] = s;
    }
}
