"""Dot products of GGUF block rows with the activations, reading the blocks in place.

Each type takes the way measured fastest on rows of 2048 (the figures: docs/PERF.md):
- Q6_K (a Q4_K_M model's LM head and half its ffn_down): the activations as two int16 parts per
  256 elements and the block's quants multiplied in integer SIMD registers (cpu_simd), one scale
  multiply per half block in float, as exact as the float32 kernel and faster;
- Q4_K: in float32, a whole row in vector registers (cpu_simd.q4_k_row_dot), the sub-block
  scales worked out per block beforehand and the mins taken from the activations' sums over each
  32 (`xs`, once per token) instead of every weight;
- Q5_K: a float32 sum per 32-weight sub-block, a reduction LLVM splits across SIMD registers,
  times the sub-block's scale once, the mins again from `xs`;
- the plain types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): in float32 vector registers as well
  (cpu_simd.plain_row_dot), a block's 32 quants unpacked, converted and scaled as one vector,
  summed once per row, rather than 32 lanes kept in a scratch array.

numba widens integer arithmetic to int64; the np.uint8 casts on each decoded quant let LLVM keep
the byte lanes narrow. Offsets: `o` a block's first byte, `e` its first element, `k` its index
in `xs`.
"""

import numpy as np
from gguf import GGMLQuantizationType as QType

from llogos_cli.backends.cpu.cpu_jit import (
    f16_at,
    helper,
    k_scales_mins,
    kernel,
    parallel_kernel,
    prange,
)
from llogos_cli.backends.cpu.cpu_simd import plain_row_dot, q4_k_row_dot, q6_k_half_sums

# The plain types' row products (cpu_simd).
_q8_0_dot, _q4_0_dot, _q4_1_dot, _q5_0_dot, _q5_1_dot = (plain_row_dot(n) for n in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"))
# per thread: a K block's 8 scales and 8 mins at 0:16, then (Q4_K) the row's d · scale of every
# sub-block, cols / 32 of them
SCRATCH = 16


@helper
def _k_mins(mn, xs, k):
    """Σ min_j · (Σ x over sub-block j) for the 8 sub-blocks of a 256-weight block."""
    s = np.float32(0)
    for j in range(8):
        s += mn[j] * xs[k + j]
    return s


@kernel
def _dot_q4_k(row, x, xs, scratch):  # d:f16, dmin:f16, scales:u8[12], qs:u8[128] per 256
    sc, mn, scales = scratch[0:8], scratch[8:16], scratch[SCRATCH:]
    mins = np.float32(0)
    for b in range(row.shape[0] // 144):
        o = 144 * b
        d = f16_at(row, o)
        k_scales_mins(row, o + 4, sc, mn)
        for j in range(8):
            scales[8 * b + j] = d * sc[j]
        mins += f16_at(row, o + 2) * _k_mins(mn, xs, 8 * b)
    return q4_k_row_dot(row, x, scales) - mins


@kernel
def _dot_q5_k(row, x, xs, scratch):  # d:f16, dmin:f16, scales:u8[12], qh:u8[32], qs:u8[128] per 256
    sc, mn = scratch[0:8], scratch[8:16]
    tot = np.float32(0)
    for b in range(row.shape[0] // 176):
        o = 176 * b
        k_scales_mins(row, o + 4, sc, mn)
        acc = np.float32(0)
        for g in range(4):   # sub-block j takes bit j of qh[l] as its fifth bit
            q, h, e = o + 48 + 32 * g, o + 16, 256 * b + 64 * g
            s0 = s1 = np.float32(0)
            for l in range(32):
                v, bits = row[q + l], row[h + l] >> (2 * g)
                s0 += np.float32(np.uint8((v & 15) | ((bits & 1) << 4))) * x[e + l]
                s1 += np.float32(np.uint8((v >> 4) | ((bits & 2) << 3))) * x[e + 32 + l]
            acc += sc[2 * g] * s0 + sc[2 * g + 1] * s1
        tot += f16_at(row, o) * acc - f16_at(row, o + 2) * _k_mins(mn, xs, 8 * b)
    return tot


@kernel
def _dot_q6_k(row, xq, dx):  # ql:u8[128], qh:u8[64], scales:i8[16], d:f16 per 256
    tot = np.float32(0)
    for b in range(row.shape[0] // 210):
        o, e = 210 * b, 256 * b
        hi0, lo0 = q6_k_half_sums(row, o, 0, xq[0], xq[1], e)
        hi1, lo1 = q6_k_half_sums(row, o, 1, xq[0], xq[1], e + 128)
        tot += f16_at(row, o + 208) * (dx[0, b] * np.float32(hi0 + hi1) + dx[1, b] * np.float32(lo0 + lo1))
    return tot


# GGML's type numbers, frozen into the kernels as constants.
_Q8_0, _Q4_0, _Q4_1, _Q5_0, _Q5_1 = int(QType.Q8_0), int(QType.Q4_0), int(QType.Q4_1), int(QType.Q5_0), int(QType.Q5_1)
_Q4_K, _Q5_K, _Q6_K = int(QType.Q4_K), int(QType.Q5_K), int(QType.Q6_K)
INT16_TYPES = frozenset({QType.Q6_K})   # multiplied with the activations' int16 parts (cpu_simd)
SUMS_TYPES = frozenset({QType.Q4_K, QType.Q5_K})   # take their mins from the activations' sums over 32s
CHUNK = 16   # rows a thread takes at a time, sharing one scratch buffer


@kernel
def _rows(raw, code, r0, r1, x, xs, xq, dx, out, scratch):
    """out[:, r0:r1]. Each type's kernel is called directly: one more call per row, through a
    dispatching function, cost Q4_K a tenth of its speed."""
    for t in range(x.shape[0]):
        for r in range(r0, r1):
            if code == _Q4_K:
                out[t, r] = _dot_q4_k(raw[r], x[t], xs[t], scratch)
            elif code == _Q6_K:
                out[t, r] = _dot_q6_k(raw[r], xq[t], dx[t])
            elif code == _Q5_K:
                out[t, r] = _dot_q5_k(raw[r], x[t], xs[t], scratch)
            elif code == _Q8_0:
                out[t, r] = _q8_0_dot(raw[r], x[t])
            elif code == _Q4_0:
                out[t, r] = _q4_0_dot(raw[r], x[t])
            elif code == _Q4_1:
                out[t, r] = _q4_1_dot(raw[r], x[t])
            elif code == _Q5_0:
                out[t, r] = _q5_0_dot(raw[r], x[t])
            else:
                out[t, r] = _q5_1_dot(raw[r], x[t])


@parallel_kernel
def matvec(raw, code, x, xs, xq, dx, out):
    """out (T, rows) = x (T, cols) · rows of raw, on every core; each row is read once for all T tokens.
    xs (T, cols / 32): the sums of x over each 32 elements, for SUMS_TYPES;
    xq (T, 2, cols) int16 and dx (T, 2, cols / 256): x as two int16 parts, for INT16_TYPES."""
    rows = raw.shape[0]
    for c in prange((rows + CHUNK - 1) // CHUNK):
        _rows(raw, code, c * CHUNK, min(rows, c * CHUNK + CHUNK), x, xs, xq, dx, out,
              np.empty(SCRATCH + x.shape[1] // 32, np.float32))
