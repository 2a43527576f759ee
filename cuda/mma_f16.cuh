// One warp's f16 tensor-core product, PTX mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
// (sm_80+): C (16 x 8, f32) += A (16 x 16, f16) · B (16 x 8, f16). Each lane holds fragments as
// PTX lays them out, with g = lane / 4 and t = lane % 4 (two halves a register, the lower k or
// column in the low 16 bits):
//   a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][8+2t, ..]   a[3] = A[g+8][8+2t, ..]
//   b[0] = B[2t, 2t+1][g]   b[1] = B[8+2t, 8+2t+1][g]
//   c[0] = C[g][2t]   c[1] = C[g][2t+1]   c[2] = C[g+8][2t]   c[3] = C[g+8][2t+1]
// So an accumulator's two n8 tiles (c of columns 8j.. and 8j+8..) rounded to halves are, pair by
// pair, the A fragment of the next product along those 16 columns (attention_flash.cu's P·V).
// The CPU emulator (tests/emu/cuda_emu.h) supplies the same function with the same layout.
#pragma once
#include "common.cuh"

#ifdef __CUDA_ARCH__
__device__ __forceinline__ void mma_f16_16x8x16(float c[4], const u32 a[4], const u32 b[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// Two floats as the halves of one register, x in the low 16 bits.
__device__ __forceinline__ u32 pack_f16x2(float x, float y) { return f32_to_f16(x) | ((u32)f32_to_f16(y) << 16); }
