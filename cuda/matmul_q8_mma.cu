// y (ntok, nrows) = x · W (nrows, ncols)ᵀ with x quantized to 8 bits (quantize_q8.cu) and W in one
// of the types of mma_runs.cuh, on int8 tensor cores (mma_s8.cuh), as llama.cpp's MMQ: the
// products of prompts without dequantizing W to float16 first. A block of 8 warps takes a tile of
// 128 rows (matmul_q8_mma_<type>) or 64 (matmul_q8_mma_rows64_<type>, for grids that would
// otherwise leave multiprocessors idle) by MMQ_TOKENS tokens; per stage of MMQ_RUNS runs of 32 it
// decodes the tile's weights to int8 and copies the tokens' activations into shared memory, and
// each warp then multiplies 32 (16) rows by 32 tokens, one 16 x 8 x 32 product per run and 16
// rows: a run is one scale of the weights and one step of the activations, applied in float to
// that product's integer sums.
// Tiles of the same rows are neighbours in the grid (blockIdx.x the token tile), so a prompt's
// token tiles read each weight tile from L2 rather than memory.
//
// moe_matmul_q8_mma_<type> is the same product on a mixture-of-experts prompt's pairs as moe_sort
// grouped them (moe_gather, then quantize_q8): token tile blockIdx.x is entry blockIdx.x of a
// table of (expert e, first grouped row r, count c <= MMQ_TOKENS), and yg[r..r+c) = xg[r..r+c) ·
// W_eᵀ, W_e matrix e of the experts stacked in one tensor. Only where a tile's weights and tokens
// start differ, so it is an entry of this file, not an op of its own: all experts' tiles in one
// launch, each expert's weights read in their blocks once per MMQ_TOKENS of its tokens.
#include "common.cuh"
#include "mma_runs.cuh"
#include "mma_s8.cuh"

#define MMQ_TOKENS 64
#define MMQ_RUNS 4
#define MMQ_THREADS 256
// Bytes a staged row takes: 16 past its runs put the 8 rows a fragment load reads (4 bytes at
// 4t of row g) in 32 different banks.
#define MMQ_STRIDE (MMQ_RUNS * 32 + 16)
// A product starts its sums at the bits of 1.5 * 2^23: for |sum| < 2^22 (a run's is at most
// 32 * 127 * 127) the result's bits are the float 1.5 * 2^23 + sum exactly, so one full-rate add
// takes the sum to float instead of the quarter-rate int-to-float conversion.
#define MMQ_SUM_BIAS 0x4B400000
#define MMQ_SUM_BIAS_F 12582912.0f

__device__ __forceinline__ float sum_to_f32(int c) { return __uint_as_float((u32)c) - MMQ_SUM_BIAS_F; }

// MI: products of 16 rows a warp takes, the block's tile 64 MI rows.
// The tile of rows blockIdx.y * 64 MI.. of w by tokens tok0..tok0 + MMQ_TOKENS of xq (those from
// ntok on multiply zeros and store nothing).
template <class Q, int MI>
__device__ void matmul_q8_mma(const u8* w, const i8* xq, const float2* xs, float* y, int ncols, int nrows, int tok0,
                              int ntok) {
    constexpr int ROWS = 64 * MI;
    __shared__ uint4 w_s[ROWS * MMQ_STRIDE / 16];
    __shared__ uint4 x_s[MMQ_TOKENS * MMQ_STRIDE / 16];
    __shared__ float2 wd_s[ROWS][MMQ_RUNS];
    __shared__ float2 xd_s[MMQ_TOKENS][MMQ_RUNS];
    u8* wq = (u8*)w_s;
    u8* xq_s = (u8*)x_s;

    const int row0 = blockIdx.y * ROWS;
    const int nruns = ncols / 32, nblocks = ncols / Q::QK;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    const int wrow = 16 * MI * (warp % 4), wtok = 32 * (warp / 4);  // the warp's rows and tokens in the tile
    float acc[MI][4][4] = {};

    for (int run0 = 0; run0 < nruns; run0 += MMQ_RUNS) {
        const int runs = min(MMQ_RUNS, nruns - run0);
        for (int i = threadIdx.x; i < ROWS * MMQ_RUNS; i += MMQ_THREADS) {
            const int r = i / MMQ_RUNS, k = i % MMQ_RUNS;
            if (k >= runs) continue;
            const int row = min(row0 + r, nrows - 1);  // rows past the end read the last one again and store nothing
            const int run = run0 + k, per_block = Q::QK / 32;
            u32 v[8];
            wd_s[r][k] = Q::run((const typename Q::block*)w + (i64)row * nblocks + run / per_block, run % per_block, v);
            uint4* dst = (uint4*)(wq + r * MMQ_STRIDE + 32 * k);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint4 q;
                q.x = v[4 * h];
                q.y = v[4 * h + 1];
                q.z = v[4 * h + 2];
                q.w = v[4 * h + 3];
                dst[h] = q;
            }
        }
        for (int i = threadIdx.x; i < MMQ_TOKENS * MMQ_RUNS; i += MMQ_THREADS) {
            const int n = i / MMQ_RUNS, k = i % MMQ_RUNS, tok = tok0 + n;
            if (k >= runs) continue;
            uint4* dst = (uint4*)(xq_s + n * MMQ_STRIDE + 32 * k);
            float2 step;
            step.x = step.y = 0.0f;
            uint4 lo, hi;
            lo.x = lo.y = lo.z = lo.w = hi.x = hi.y = hi.z = hi.w = 0u;
            if (tok < ntok) {  // tokens past the end multiply zeros
                const i8* src = xq + (i64)tok * ncols + 32 * (run0 + k);
                lo = load_u4(src);
                hi = load_u4(src + 16);
                step = xs[(i64)tok * nruns + run0 + k];
            }
            dst[0] = lo;
            dst[1] = hi;
            xd_s[n][k] = step;
        }
        __syncthreads();

        for (int k = 0; k < runs; k++) {
            u32 a[MI][4], b[4][2];
            float2 wd[MI][2], xd[4][2];
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                const u8* p = wq + (wrow + 16 * mi + g) * MMQ_STRIDE + 32 * k + 4 * t;
                a[mi][0] = load_u32(p);
                a[mi][1] = load_u32(p + 8 * MMQ_STRIDE);
                a[mi][2] = load_u32(p + 16);
                a[mi][3] = load_u32(p + 8 * MMQ_STRIDE + 16);
                wd[mi][0] = wd_s[wrow + 16 * mi + g][k];
                wd[mi][1] = wd_s[wrow + 16 * mi + g + 8][k];
            }
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const u8* p = xq_s + (wtok + 8 * ni + g) * MMQ_STRIDE + 32 * k + 4 * t;
                b[ni][0] = load_u32(p);
                b[ni][1] = load_u32(p + 16);
                xd[ni][0] = xd_s[wtok + 8 * ni + 2 * t][k];
                xd[ni][1] = xd_s[wtok + 8 * ni + 2 * t + 1][k];
            }
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    if constexpr (Q::HALVES) {  // elements 0-15 and 16-31 in products of their own
                        const u32 a_lo[4] = {a[mi][0], a[mi][1], 0u, 0u}, a_hi[4] = {0u, 0u, a[mi][2], a[mi][3]};
                        int lo[4] = {MMQ_SUM_BIAS, MMQ_SUM_BIAS, MMQ_SUM_BIAS, MMQ_SUM_BIAS};
                        int hi[4] = {MMQ_SUM_BIAS, MMQ_SUM_BIAS, MMQ_SUM_BIAS, MMQ_SUM_BIAS};
                        mma_s8_16x8x32(lo, a_lo, b[ni]);
                        mma_s8_16x8x32(hi, a_hi, b[ni]);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            const float2 s = wd[mi][i / 2];
                            acc[mi][ni][i] += xd[ni][i % 2].x * (s.x * sum_to_f32(lo[i]) + s.y * sum_to_f32(hi[i]));
                        }
                    } else {
                        int c[4] = {MMQ_SUM_BIAS, MMQ_SUM_BIAS, MMQ_SUM_BIAS, MMQ_SUM_BIAS};
                        mma_s8_16x8x32(c, a[mi], b[ni]);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            const float2 s = wd[mi][i / 2], x = xd[ni][i % 2];
                            acc[mi][ni][i] += s.x * x.x * sum_to_f32(c[i]) + s.y * x.y;
                        }
                    }
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = row0 + wrow + 16 * mi + g + 8 * (i / 2), tok = tok0 + wtok + 8 * ni + 2 * t + i % 2;
                if (row < nrows && tok < ntok) y[(i64)tok * nrows + row] = acc[mi][ni][i];
            }
        }
    }
}

#define MATMUL_Q8_MMA_FORM(form, type, mi)                                                                      \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS)                                                   \
        matmul_q8_mma##form##_##type(const u8* __restrict__ w, const i8* __restrict__ xq,                       \
                                     const float2* __restrict__ xs, float* __restrict__ y, int ncols, int nrows, \
                                     int ntok) {                                                                \
        matmul_q8_mma<type##_mma, mi>(w, xq, xs, y, ncols, nrows, blockIdx.x * MMQ_TOKENS, ntok);                \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS)                                                   \
        moe_matmul_q8_mma##form##_##type(const u8* __restrict__ w, const i8* __restrict__ xq,                   \
                                         const float2* __restrict__ xs, float* __restrict__ yg,                 \
                                         const int* __restrict__ tiles, int ncols, int nrows) {                 \
        const int* tile = tiles + 3 * (i64)blockIdx.x;                                                          \
        const i64 expert_bytes = (i64)nrows * (ncols / type##_mma::QK) * sizeof(type##_mma::block);             \
        matmul_q8_mma<type##_mma, mi>(w + tile[0] * expert_bytes, xq, xs, yg, ncols, nrows, tile[1],             \
                                      tile[1] + tile[2]);                                                       \
    }
#define MATMUL_Q8_MMA(type)            \
    MATMUL_Q8_MMA_FORM(, type, 2)      \
    MATMUL_Q8_MMA_FORM(_rows64, type, 1)

MATMUL_Q8_MMA(q8_0)
MATMUL_Q8_MMA(q4_0)
MATMUL_Q8_MMA(q4_1)
MATMUL_Q8_MMA(q4_K)
MATMUL_Q8_MMA(q6_K)
MATMUL_Q8_MMA(q5_0)
MATMUL_Q8_MMA(q5_1)
MATMUL_Q8_MMA(q5_K)
MATMUL_Q8_MMA(q3_K)
MATMUL_Q8_MMA(mxfp4)
