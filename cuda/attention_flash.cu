// A prompt run's causal attention over the KV cache in one pass, flash-attention style: no score
// matrix in memory. Both products run on f16 tensor cores (mma_f16.cuh, f32 sums): per tile of
// FLASH_KEYS keys, S = Q Kᵀ, the online softmax (each row's running max and sum), then O += P V.
// Prompt runs of cuda_attention.FLASH_MIN_TOKENS queries or more from caches of FLASH_TYPES take
// it (cuda_attention.flash_takes); their rounding is the f16 GEMM path's, bounded in docs/PERF.md
// (section flashpre) and by the op test.
//
// Grid (blocks of queries, n_kv), FLASH_WARPS warps, each warp 16 rows of the block's
// FLASH_ROWS: row r is query t_first + r / group of head kv * group + r % group, so a block holds
// all the query heads of one KV group and reads each K and V tile once for all of them (GQA).
// Query t (at position pos0 + t of cache slot `slot`, reached through kv_where) sees keys
// [max(0, pos0 + t + 1 - window), pos0 + t + 1) (window 0: from 0). The queries are scaled, then
// rounded to f16, in registers as the products' A fragments for the whole run. Each tile's keys
// and values are decoded from their stored type to f16 in shared memory (values transposed, so a
// B fragment's pair of keys is one 32-bit word). Scores past a row's span are -inf; soft-capping
// (Gemma 2) applies to the rest, and with has_sinks, head h's sinks[h] joins each softmax's
// denominator at the end (gpt-oss).
//
// Tiles start at multiples of FLASH_KEYS, wherever the block starts, and a row's sums take only
// its own scores: a tile it sees none of adds exact zeros. So a query's output is the same bits
// whichever queries share its block, and under any cut of its prompt into runs this kernel takes.
#include "kv_cache.cuh"
#include "mma_f16.cuh"

#define FLASH_WARPS 4
#define FLASH_ROWS (16 * FLASH_WARPS)
#define FLASH_KEYS 32
static_assert(FLASH_KEYS % 16 == 0, "whole k16 steps of P V");

template <class K, class V, int D>
__device__ void attention_flash(const float* q, const u8* k_cache, const u8* v_cache, float* out, int slot, int pos0,
                                int n_tok, int n_head, float scale, int window, float softcap, const float* sinks,
                                int has_sinks, kv_where where) {
    static_assert(D % 16 == 0, "whole k16 steps of Q Kᵀ");
    // Halves in pairs, 32-bit aligned: the tile's keys (pairs along the head), its values
    // transposed (pairs along the keys); + 4 words a row: a fragment's 8 rows in other banks.
    __shared__ u32 k_s[FLASH_KEYS][D / 2 + 4];
    __shared__ u32 vt_s[D][FLASH_KEYS / 2 + 4];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, g = lane / 4, tg = lane % 4;
    const int kv = blockIdx.y, group = n_head / where.n_kv, per_block = FLASH_ROWS / group;
    const int t_first = blockIdx.x * per_block, t_last = min(n_tok, t_first + per_block) - 1;

    // This lane's two rows, g and g + 8 of its warp's 16.
    int tok[2], head[2];
    bool valid[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = 16 * warp + g + 8 * i;
        tok[i] = t_first + r / group;
        head[i] = kv * group + r % group;
        valid[i] = r < per_block * group && tok[i] < n_tok;
    }
    u32 qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        for (int j = 0; j < 4; j++) {
            const int i = j % 2, e = 16 * kk + 8 * (j / 2) + 2 * tg;
            const float* row = q + ((i64)tok[i] * n_head + head[i]) * D;
            qf[kk][j] = valid[i] ? pack_f16x2(row[e] * scale, row[e + 1] * scale) : 0u;
        }

    float o[D / 8][4] = {}, m[2] = {-F32_INF, -F32_INF}, l[2] = {0.0f, 0.0f};
    const int first_key = window > 0 ? max(0, pos0 + t_first + 1 - window) : 0, end_key = pos0 + t_last + 1;
    const i64 k_row = K::row_bytes(D), v_row = V::row_bytes(D);
    for (int k0 = first_key / FLASH_KEYS * FLASH_KEYS; k0 < end_key; k0 += FLASH_KEYS) {
        __syncthreads();  // every warp is done with the last tile
        for (int i = threadIdx.x; i < FLASH_KEYS / 2 * D / 4; i += blockDim.x) {  // 2 keys x 4 elements each
            const int m = i / (D / 4), e = 4 * (i % (D / 4));
            float4 kx[2], vx[2];
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int p = k0 + 2 * m + c;
                kx[c] = vx[c] = float4{0.0f, 0.0f, 0.0f, 0.0f};
                if (p >= first_key && p < end_key) {  // no row sees the others: zeros, not whatever the cache holds
                    const i64 row = where.row(slot, kv, p);
                    kx[c] = K::load4(k_cache + row * k_row, e);
                    vx[c] = V::load4(v_cache + row * v_row, e);
                }
                k_s[2 * m + c][e / 2] = pack_f16x2(kx[c].x, kx[c].y);
                k_s[2 * m + c][e / 2 + 1] = pack_f16x2(kx[c].z, kx[c].w);
            }
            vt_s[e][m] = pack_f16x2(vx[0].x, vx[1].x);
            vt_s[e + 1][m] = pack_f16x2(vx[0].y, vx[1].y);
            vt_s[e + 2][m] = pack_f16x2(vx[0].z, vx[1].z);
            vt_s[e + 3][m] = pack_f16x2(vx[0].w, vx[1].w);
        }
        __syncthreads();

        float s[FLASH_KEYS / 8][4] = {};  // S's n8 tiles: s[n] holds keys k0 + 8n..
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
            for (int n = 0; n < FLASH_KEYS / 8; n++) {
                const u32 b[2] = {k_s[8 * n + g][8 * kk + tg], k_s[8 * n + g][8 * kk + 4 + tg]};
                mma_f16_16x8x16(s[n], qf[kk], b);
            }

#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int hi = pos0 + tok[i] + 1, lo = window > 0 ? hi - window : 0;
            float top = -F32_INF;
#pragma unroll
            for (int n = 0; n < FLASH_KEYS / 8; n++)
                for (int c = 0; c < 2; c++) {
                    const int key = k0 + 8 * n + 2 * tg + c;
                    float& x = s[n][2 * i + c];
                    x = valid[i] && key >= lo && key < hi ? soft_capped(x, softcap) : -F32_INF;
                    top = fmaxf(top, x);
                }
            top = fmaxf(top, __shfl_xor_sync(FULL_MASK, top, 1));  // the row's 4 lanes
            top = fmaxf(top, __shfl_xor_sync(FULL_MASK, top, 2));
            const float m_new = fmaxf(m[i], top);
            const float base = m_new == -F32_INF ? 0.0f : m_new;  // no key seen yet: every p is 0
            const float correction = expf(m[i] - base);           // 0 then, with o and l still 0
            m[i] = m_new;
            l[i] *= correction;
#pragma unroll
            for (int j = 0; j < D / 8; j++) {
                o[j][2 * i] *= correction;
                o[j][2 * i + 1] *= correction;
            }
#pragma unroll
            for (int n = 0; n < FLASH_KEYS / 8; n++)
                for (int c = 0; c < 2; c++) {
                    float& x = s[n][2 * i + c];
                    x = expf(x - base);
                    l[i] += x;
                }
        }

#pragma unroll
        for (int kk = 0; kk < FLASH_KEYS / 16; kk++) {
            // P's A fragment over keys 16kk..: S's tiles 2kk and 2kk + 1, as they lie (mma_f16.cuh)
            const u32 a[4] = {pack_f16x2(s[2 * kk][0], s[2 * kk][1]), pack_f16x2(s[2 * kk][2], s[2 * kk][3]),
                              pack_f16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_f16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int j = 0; j < D / 8; j++) {
                const u32 b[2] = {vt_s[8 * j + g][8 * kk + tg], vt_s[8 * j + g][8 * kk + 4 + tg]};
                mma_f16_16x8x16(o[j], a, b);
            }
        }
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(FULL_MASK, l[i], 1);
        l[i] += __shfl_xor_sync(FULL_MASK, l[i], 2);
        float correction = 1.0f;
        if (has_sinks && valid[i]) {
            const float sink = sinks[head[i]], m_all = fmaxf(m[i], sink);
            correction = expf(m[i] - m_all);
            l[i] = l[i] * correction + expf(sink - m_all);
        }
        if (!valid[i]) continue;
        float* row = out + ((i64)tok[i] * n_head + head[i]) * D;
#pragma unroll
        for (int j = 0; j < D / 8; j++)
            for (int c = 0; c < 2; c++) row[8 * j + 2 * tg + c] = o[j][2 * i + c] * correction / l[i];
    }
}

#define ATTENTION_FLASH(tk, tv, d)                                                                            \
    extern "C" __global__ void __launch_bounds__(FLASH_WARPS * WARP_SIZE) attention_flash_##tk##_##tv##_d##d( \
        const float* __restrict__ q, const u8* __restrict__ k_cache, const u8* __restrict__ v_cache,          \
        float* __restrict__ out, int slot, int pos0, int n_tok, int n_head, int n_kv, float scale, int window, \
        float softcap, const float* __restrict__ sinks, int has_sinks, const int* __restrict__ tables,        \
        int paged, int max_blocks, int block_size) {                                                           \
        attention_flash<kv_##tk, kv_##tv, d>(q, k_cache, v_cache, out, slot, pos0, n_tok, n_head, scale,      \
                                             window, softcap, sinks, has_sinks,                                \
                                             kv_where{tables, paged, max_blocks, block_size, n_kv});           \
    }
#define ATTENTION_FLASH_DIMS(tk, tv) ATTENTION_FLASH(tk, tv, 64) ATTENTION_FLASH(tk, tv, 128) ATTENTION_FLASH(tk, tv, 256)

ATTENTION_FLASH_DIMS(f16, f16)
ATTENTION_FLASH_DIMS(f16, q8_0)
ATTENTION_FLASH_DIMS(q8_0, f16)
ATTENTION_FLASH_DIMS(q8_0, q8_0)
