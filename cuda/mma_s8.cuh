// One warp's int8 tensor-core product, PTX mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 (sm_80+):
// C (16 x 8, s32) += A (16 x 32, s8) · B (32 x 8, s8). Each lane holds fragments as PTX lays them
// out, with g = lane / 4 and t = lane % 4 (4 bytes a register, lowest byte the lowest k):
//   a[0] = A[g][4t..4t+3]   a[1] = A[g+8][4t..]   a[2] = A[g][16+4t..]   a[3] = A[g+8][16+4t..]
//   b[0] = B[4t..4t+3][g]   b[1] = B[16+4t..][g]
//   c[0] = C[g][2t]   c[1] = C[g][2t+1]   c[2] = C[g+8][2t]   c[3] = C[g+8][2t+1]
// The CPU emulator (tests/emu/cuda_emu.h) supplies the same function with the same layout.
#pragma once
#include "common.cuh"

#ifdef __CUDA_ARCH__
__device__ __forceinline__ void mma_s8_16x8x32(int c[4], const u32 a[4], const u32 b[2]) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif
