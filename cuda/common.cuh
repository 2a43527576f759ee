// Shared by every kernel: fixed-width types, half-precision conversions, vector loads and warp
// reductions. No system or CUDA headers, so NVRTC needs no include path beyond this folder.
#pragma once

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu
// NVRTC has no <math.h>, hence no INFINITY.
#define F32_INF __uint_as_float(0x7f800000u)

#ifdef __CUDA_ARCH__
// The hardware conversions. Host builds of these sources (the CPU emulator in tests/emu) supply
// bit-exact software versions instead.
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Round to nearest even, as NumPy's astype(float16) does.
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#endif

// Soft-capping of attention scores and logits (Gemma 2): s -> cap * tanh(s / cap); cap 0 leaves s.
__device__ __forceinline__ float soft_capped(float s, float cap) { return cap > 0.0f ? cap * tanhf(s / cap) : s; }

// GELU in its tanh approximation, ½ g (1 + tanh(√(2/π) (g + 0.044715 g³))), as Gemma was trained
// with and BERT's GGUFs are run by llama.cpp: GeGLU's gate (glu.cu) and BERT's feed-forward (gelu.cu).
__device__ __forceinline__ float gelu_tanh(float g) {
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
}

__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float((u32)h << 16); }

// (float)q - bias for 0 <= q < 2^23 in two full-rate instructions (the bias folds into the
// constant) instead of the quarter-rate int-to-float conversion, which would otherwise bound the
// 4-bit matrix-vector kernels.
__device__ __forceinline__ float uint_to_f32(u32 q, float bias = 0.0f) {
    return __uint_as_float(0x4B000000u | q) - (8388608.0f + bias);
}

// Misaligned vector loads fault on a GPU; the emulator defines CHECK_ALIGNED to trap them on the CPU.
#ifndef CHECK_ALIGNED
#define CHECK_ALIGNED(p, n)
#endif

__device__ __forceinline__ uint4 load_u4(const void* p) {
    CHECK_ALIGNED(p, 16);
    return *(const uint4*)p;
}

__device__ __forceinline__ uint2 load_u2(const void* p) {
    CHECK_ALIGNED(p, 8);
    return *(const uint2*)p;
}

__device__ __forceinline__ u32 load_u32(const void* p) {
    CHECK_ALIGNED(p, 4);
    return *(const u32*)p;
}

// Fields that blocks of 18, 22, 34 or 210 bytes leave only 2-byte aligned.
__device__ __forceinline__ u32 load_u32_a2(const void* p) {
    CHECK_ALIGNED(p, 2);
    const u16* h = (const u16*)p;
    return h[0] | ((u32)h[1] << 16);
}

__device__ __forceinline__ float4 load_f4(const float* p) {
    CHECK_ALIGNED(p, 16);
    return *(const float4*)p;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

// Sum over the thread block (blockDim.x a multiple of 32); every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    v = warp_sum(v);
    __syncthreads();  // a previous call may still be reading `partial`
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    return warp_sum(lane < (int)(blockDim.x / WARP_SIZE) ? partial[lane] : 0.0f);
}

__device__ __forceinline__ float block_max(float v) {
    __shared__ float partial[WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    return warp_max(lane < (int)(blockDim.x / WARP_SIZE) ? partial[lane] : -F32_INF);
}
