"""Products of GGUF block rows with 8-bit activations: llama.cpp's way to multiply one token (or a
few) by a quantized matrix, in integer SIMD (cpu_simd_int8).

Each product quantizes its activations once, in blocks of 32, as two bytes an element: with dx =
max|x| / 127, xhi = round(x / dx) and xlo = round(254 · (x / dx - xhi)), so x ≈ dx · (xhi + xlo /
254) to within dx / 508, about 2^-16 of the block's largest magnitude (one byte alone, as llama.cpp
takes, leaves 2^-8: SmolLM2's decode logprobs then drifted up to 0.7 from the exact ones over a
reply, and near-ties turned). sx = dx · Σ (xhi + xlo / 254). Every row is then multiplied with them
in integer instructions, and the result is the product of the weights with the quantized
activations up to float32 rounding: it differs from the float32 product by at most
Σ_l |w_l| · dx / 508, which tests/test_cpu_quant_int8.py holds it to.
"""

import numpy as np
from gguf import GGMLQuantizationType as T

from llogos_cli.backends.cpu_jit import kernel, parallel_kernel, prange
from llogos_cli.backends.cpu_simd_int8 import k_row_dot8, plain_row_dot8

BLOCK = 32
LANE = 4   # elements summed into each int32 lane of an integer dot product
TYPES = frozenset({T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K})
_q8_0, _q4_0, _q4_1, _q5_0, _q5_1 = (plain_row_dot8(n) for n in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"))
_q4_k, _q5_k, _q6_k = (k_row_dot8(n) for n in ("q4_k", "q5_k", "q6_k"))
_Q8_0, _Q4_0, _Q4_1, _Q5_0, _Q5_1 = int(T.Q8_0), int(T.Q4_0), int(T.Q4_1), int(T.Q5_0), int(T.Q5_1)
_Q4_K, _Q5_K, _Q6_K = int(T.Q4_K), int(T.Q5_K), int(T.Q6_K)
CHUNK = 16   # rows a thread takes at a time


@kernel
def quantize_blocks(x, xq, dx, sx, xl):
    """x (T, cols) float32 -> xq (T, 2 · cols) int8, dx and sx (T, cols / 32) float32, and xl
    (T, cols / 4) int32, the sums of 254 · xhi + xlo over each 4 elements: each block of 32 as 32
    bytes xhi then 32 bytes xlo (see the module)."""
    for t in range(x.shape[0]):
        for k in range(x.shape[1] // BLOCK):
            amax = np.float32(0)
            for l in range(BLOCK):
                amax = max(amax, abs(x[t, BLOCK * k + l]))
            d = amax / np.float32(127)
            inv = np.float64(1) / d if d > 0 else np.float64(0)
            total = 0
            for l in range(BLOCK):
                scaled = x[t, BLOCK * k + l] * inv
                hi = np.rint(scaled)
                lo = min(max(np.rint((scaled - hi) * 254), -127), 127)
                xq[t, 2 * BLOCK * k + l] = np.int8(hi)
                xq[t, 2 * BLOCK * k + BLOCK + l] = np.int8(lo)
                whole = 254 * np.int64(hi) + np.int64(lo)
                total += whole
                if l % LANE == 0:
                    xl[t, (BLOCK * k + l) // LANE] = 0
                xl[t, (BLOCK * k + l) // LANE] += whole
            dx[t, k] = d
            sx[t, k] = d * np.float32(total / 254)


@kernel
def _k_rows(raw, code, r0, r1, xq, dx, sx, xl, out, isa):
    for t in range(xq.shape[0]):
        for r in range(r0, r1):
            if code == _Q4_K:
                out[t, r] = _q4_k(raw[r], xq[t], dx[t], sx[t], xl[t], isa)
            elif code == _Q6_K:
                out[t, r] = _q6_k(raw[r], xq[t], dx[t], sx[t], xl[t], isa)
            else:
                out[t, r] = _q5_k(raw[r], xq[t], dx[t], sx[t], xl[t], isa)


@kernel
def _plain_rows(raw, code, r0, r1, xq, dx, sx, out, isa):
    for t in range(xq.shape[0]):
        for r in range(r0, r1):
            if code == _Q4_1:
                out[t, r] = _q4_1(raw[r], xq[t], dx[t], sx[t], isa)
            elif code == _Q8_0:
                out[t, r] = _q8_0(raw[r], xq[t], dx[t], sx[t], isa)
            elif code == _Q4_0:
                out[t, r] = _q4_0(raw[r], xq[t], dx[t], sx[t], isa)
            elif code == _Q5_0:
                out[t, r] = _q5_0(raw[r], xq[t], dx[t], sx[t], isa)
            else:
                out[t, r] = _q5_1(raw[r], xq[t], dx[t], sx[t], isa)


@parallel_kernel
def matvec8(raw, code, xq, dx, sx, xl, out, isa):
    """out (T, rows) = the quantized activations (xq, dx, sx, xl) · rows of raw, on every core."""
    rows = raw.shape[0]
    k_type = code == _Q4_K or code == _Q5_K or code == _Q6_K
    for c in prange((rows + CHUNK - 1) // CHUNK):
        r0, r1 = c * CHUNK, min(rows, c * CHUNK + CHUNK)
        if k_type:
            _k_rows(raw, code, r0, r1, xq, dx, sx, xl, out, isa)
        else:
            _plain_rows(raw, code, r0, r1, xq, dx, sx, out, isa)
