// Activations x (n elements, n a multiple of 32) -> 8-bit values for the integer products
// (dot_q8.cuh), per run of 32 as q8_run.cuh says. One warp a run, one thread an element.
#include "q8_run.cuh"

extern "C" __global__ void quantize_q8(const float* __restrict__ x, i8* __restrict__ xq, float2* __restrict__ xs, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;  // whole warps: n is a multiple of 32
    quantize_run(x[i], i / WARP_SIZE, xq, xs);
}
