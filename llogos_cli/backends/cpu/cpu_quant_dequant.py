"""GGUF block rows -> float32, compiled: the tiles that many-token products hand to BLAS.

The same layouts as llogos_cli/gguf/quants.py (the NumPy reference), compiled: the K, IQ4 and
MXFP4 types written per element, the plain types as vectors (cpu_simd.plain_row_expand), far faster
than the NumPy dequantizers; every value exactly gguf-py's. Offsets: `o` a block's first byte, `e`
its first element.
"""

import numpy as np
from gguf import GGMLQuantizationType as QType

from llogos_cli.backends.cpu.cpu_jit import F16, f16_at, k_scales_mins, kernel, parallel_kernel, prange
from llogos_cli.backends.cpu.cpu_simd import plain_row_expand
from llogos_cli.gguf.quants import IQ4_NL_VALUES, MXFP4_VALUES, e8m0_half

E8M0_HALF = e8m0_half(np.arange(256, dtype=np.uint8))   # MXFP4's block multiplier by scale byte


# The plain types (cpu_simd): a block's 32 weights unpacked and scaled as one vector.
_q8_0, _q4_0, _q4_1, _q5_0, _q5_1 = (plain_row_expand(n) for n in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"))


@kernel
def _q4_k(row, out, sc, mn):  # d:f16, dmin:f16, scales:u8[12], qs:u8[128] per 256
    for b in range(row.shape[0] // 144):
        o = 144 * b
        d, dmin = f16_at(row, o), f16_at(row, o + 2)
        k_scales_mins(row, o + 4, sc, mn)
        for g in range(4):   # 32 bytes: low nibbles are sub-block 2g, high nibbles 2g+1
            a0, c0, a1, c1 = d * sc[2 * g], dmin * mn[2 * g], d * sc[2 * g + 1], dmin * mn[2 * g + 1]
            q, e = o + 16 + 32 * g, 256 * b + 64 * g
            for l in range(32):
                v = row[q + l]
                out[e + l] = a0 * np.float32(np.uint8(v & 15)) - c0
                out[e + 32 + l] = a1 * np.float32(np.uint8(v >> 4)) - c1


@kernel
def _q5_k(row, out, sc, mn):  # d:f16, dmin:f16, scales:u8[12], qh:u8[32], qs:u8[128] per 256
    for b in range(row.shape[0] // 176):
        o = 176 * b
        d, dmin = f16_at(row, o), f16_at(row, o + 2)
        k_scales_mins(row, o + 4, sc, mn)
        for g in range(4):   # sub-block j takes bit j of qh[l] as its fifth bit
            a0, c0, a1, c1 = d * sc[2 * g], dmin * mn[2 * g], d * sc[2 * g + 1], dmin * mn[2 * g + 1]
            q, h, e = o + 48 + 32 * g, o + 16, 256 * b + 64 * g
            for l in range(32):
                v, bits = row[q + l], row[h + l] >> (2 * g)
                out[e + l] = a0 * np.float32(np.uint8((v & 15) | ((bits & 1) << 4))) - c0
                out[e + 32 + l] = a1 * np.float32(np.uint8((v >> 4) | ((bits & 2) << 3))) - c1


@kernel
def _q6_k(row, out):  # ql:u8[128], qh:u8[64], scales:i8[16], d:f16 per 256
    for b in range(row.shape[0] // 210):
        o = 210 * b
        d = f16_at(row, o + 208)
        for h in range(2):   # bytes i of the half's ql, ql + 32 and qh hold elements e + i + 32 * quarter
            ql, qh, e = o + 64 * h, o + 128 + 32 * h, 256 * b + 128 * h
            for half in range(2):   # one scale per 16 elements; q - 32 taken in int8
                sc = o + 192 + 8 * h + half
                s0 = d * np.float32(np.int8(row[sc]))
                s1 = d * np.float32(np.int8(row[sc + 2]))
                s2 = d * np.float32(np.int8(row[sc + 4]))
                s3 = d * np.float32(np.int8(row[sc + 6]))
                for l in range(16 * half, 16 * half + 16):
                    a, c, bits = row[ql + l], row[ql + 32 + l], row[qh + l]
                    out[e + l] = s0 * np.float32(np.int8((a & 15) | ((bits & 3) << 4)) - np.int8(32))
                    out[e + 32 + l] = s1 * np.float32(np.int8((c & 15) | ((bits & 12) << 2)) - np.int8(32))
                    out[e + 64 + l] = s2 * np.float32(np.int8((a >> 4) | (bits & 48)) - np.int8(32))
                    out[e + 96 + l] = s3 * np.float32(np.int8((c >> 4) | ((bits & 192) >> 2)) - np.int8(32))


@kernel
def _q2_k(row, out):  # scales:u8[16] (low nibble scale, high nibble min), qs:u8[64], d:f16, dmin:f16 per 256
    for b in range(row.shape[0] // 84):
        o = 84 * b
        d, dmin = f16_at(row, o + 80), f16_at(row, o + 82)
        for h in range(2):   # byte l of the half's 32 holds elements 32k + l in bits 2k
            for k in range(4):
                for half in range(2):   # one scale and min per 16 elements
                    sc = row[o + 8 * h + 2 * k + half]
                    a, c = d * np.float32(sc & 15), dmin * np.float32(sc >> 4)
                    q, e = o + 16 + 32 * h + 16 * half, 256 * b + 128 * h + 32 * k + 16 * half
                    for l in range(16):
                        out[e + l] = a * np.float32((row[q + l] >> (2 * k)) & 3) - c


@kernel
def _q3_k(row, out, sc):  # hmask:u8[32], qs:u8[64], scales:u8[12], d:f16 per 256
    for b in range(row.shape[0] // 110):
        o = 110 * b
        d = f16_at(row, o + 108)
        for j in range(16):   # six-bit scales biased by 32: low 4 bits in byte j % 8, top 2 in 8 + j % 4
            low = (row[o + 96 + j % 8] >> (4 * (j // 8))) & 15
            high = (row[o + 104 + j % 4] >> (2 * (j // 4))) & 3
            sc[j] = d * (np.float32(low | (high << 4)) - np.float32(32))
        for m in range(8):   # as Q2_K's two bits, and bit m of hmask[l] for element 32m + l: clear is -4
            for half in range(2):   # one scale per 16 elements
                a, shift = sc[2 * m + half], 2 * (m % 4)
                q, hm, e = o + 32 + 32 * (m // 4) + 16 * half, o + 16 * half, 256 * b + 32 * m + 16 * half
                for l in range(16):
                    low, third = (row[q + l] >> shift) & 3, (row[hm + l] >> m) & 1
                    out[e + l] = a * np.float32(np.int32(low | (third << 2)) - 4)


@kernel
def _iq4_nl(row, out):  # d:f16, qs:u8[16] (low nibbles elements 0-15, high 16-31), levels IQ4_NL_VALUES
    for b in range(row.shape[0] // 18):
        o, e = 18 * b, 32 * b
        d = f16_at(row, o)
        for l in range(16):
            v = row[o + 2 + l]
            out[e + l] = d * IQ4_NL_VALUES[v & 15]
            out[e + 16 + l] = d * IQ4_NL_VALUES[v >> 4]


@kernel
def _iq4_xs(row, out):  # d:f16, scales_h:u16, scales_l:u8[4], qs:u8[128] per 256: 8 sub-blocks of 32
    for b in range(row.shape[0] // 136):
        o = 136 * b
        d = f16_at(row, o)
        high = np.int32(row[o + 2]) | (np.int32(row[o + 3]) << 8)
        for j in range(8):   # sub-block j: scale bits 4*(j%2) of scales_l[j / 2] and 2j of scales_h, biased by 32
            low = (row[o + 4 + j // 2] >> (4 * (j % 2))) & 15
            a = d * (np.float32(np.int32(low) | (((high >> (2 * j)) & 3) << 4)) - np.float32(32))
            q, e = o + 8 + 16 * j, 256 * b + 32 * j
            for l in range(16):
                v = row[q + l]
                out[e + l] = a * IQ4_NL_VALUES[v & 15]
                out[e + 16 + l] = a * IQ4_NL_VALUES[v >> 4]


@kernel
def _mxfp4(row, out):  # e:E8M0, qs:u8[16] (nibbles as IQ4_NL), values MXFP4_VALUES
    for b in range(row.shape[0] // 17):
        o, e = 17 * b, 32 * b
        d = E8M0_HALF[row[o]]
        for l in range(16):
            v = row[o + 1 + l]
            out[e + l] = d * MXFP4_VALUES[v & 15]
            out[e + 16 + l] = d * MXFP4_VALUES[v >> 4]


@kernel
def _f16(row, out):
    for i in range(out.shape[0]):
        out[i] = F16[np.int64(row[2 * i]) | (np.int64(row[2 * i + 1]) << 8)]


@kernel
def _bf16(row, out):   # the top half of a float32
    bits = out.view(np.uint32)
    for i in range(out.shape[0]):
        bits[i] = (np.uint32(row[2 * i]) << 16) | (np.uint32(row[2 * i + 1]) << 24)


_Q8_0, _Q4_0, _Q4_1, _Q5_0, _Q5_1 = int(QType.Q8_0), int(QType.Q4_0), int(QType.Q4_1), int(QType.Q5_0), int(QType.Q5_1)
_Q2_K, _Q3_K, _Q4_K, _Q5_K, _Q6_K = int(QType.Q2_K), int(QType.Q3_K), int(QType.Q4_K), int(QType.Q5_K), int(QType.Q6_K)
_IQ4_NL, _IQ4_XS, _MXFP4, _F16, _BF16 = int(QType.IQ4_NL), int(QType.IQ4_XS), int(QType.MXFP4), int(QType.F16), int(QType.BF16)
TYPES = frozenset({QType.Q8_0, QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K,
                   QType.IQ4_NL, QType.IQ4_XS, QType.MXFP4, QType.F16, QType.BF16})


@kernel
def _row(row, code, out, sc, mn):
    if code == _Q8_0:
        _q8_0(row, out)
    elif code == _Q4_0:
        _q4_0(row, out)
    elif code == _Q4_1:
        _q4_1(row, out)
    elif code == _Q5_0:
        _q5_0(row, out)
    elif code == _Q5_1:
        _q5_1(row, out)
    elif code == _Q4_K:
        _q4_k(row, out, sc, mn)
    elif code == _Q5_K:
        _q5_k(row, out, sc, mn)
    elif code == _Q6_K:
        _q6_k(row, out)
    elif code == _Q2_K:
        _q2_k(row, out)
    elif code == _Q3_K:
        _q3_k(row, out, sc)
    elif code == _IQ4_NL:
        _iq4_nl(row, out)
    elif code == _IQ4_XS:
        _iq4_xs(row, out)
    elif code == _MXFP4:
        _mxfp4(row, out)
    elif code == _F16:
        _f16(row, out)
    elif code == _BF16:
        _bf16(row, out)
    else:
        raise ValueError("no dequantizer for this GGML type")


@kernel
def dequantize_rows(raw, code, out):
    """out (rows, cols) float32 = the rows of raw (rows, bytes per row) of GGML type `code`.
    On one thread: BLAS, which takes the tile next, has the others, and numba's OpenMP threads
    spinning beside OpenBLAS's made a 128-token product 15x slower on two cores."""
    sc, mn = np.empty(16, np.float32), np.empty(8, np.float32)   # a K block's scales (Q3_K's 16) and mins
    for r in range(raw.shape[0]):
        _row(raw[r], code, out[r], sc, mn)


ROWS_A_SHARE = 16   # rows matvec_rows hands a thread at a time, decoded into one buffer


@parallel_kernel
def matvec_rows(raw, code, x, out):
    """out (T, rows) = x (T, cols) · the rows of raw of GGML type `code`, for the types no float32
    dot kernel takes (Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4; the integer products do, where the CPU has
    them), on every core: each row is decoded to float32
    once and dotted with every token's x, instead of a whole matrix being decoded a tile at a time
    on one thread before a BLAS product, as prompts' products are."""
    rows, cols = raw.shape[0], x.shape[1]
    for share in prange((rows + ROWS_A_SHARE - 1) // ROWS_A_SHARE):
        row, sc, mn = np.empty(cols, np.float32), np.empty(16, np.float32), np.empty(8, np.float32)
        for r in range(share * ROWS_A_SHARE, min(rows, (share + 1) * ROWS_A_SHARE)):
            _row(raw[r], code, row, sc, mn)
            for t in range(x.shape[0]):
                acc = np.float32(0)
                for i in range(cols):
                    acc += row[i] * x[t, i]
                out[t, r] = acc
