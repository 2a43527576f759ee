"""Products of GGUF block rows with 8-bit activations: llama.cpp's way to multiply one token (or a
few) by a quantized matrix, in integer SIMD (cpu_simd_int8).

Each product quantizes its activations once, in one of two forms:
- for the plain 32-weight types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), blocks of 32 as two bytes an
  element: with dx = max|x| / 127, xhi = round(x / dx) and xlo = round(254 · (x / dx - xhi)), so x
  ≈ dx · (xhi + xlo / 254) to within dx / 508, about 2^-16 of the block's largest magnitude, and
  sx = dx · Σ (xhi + xlo / 254). These types' products cost little beyond their weights' bytes, so
  the second byte is nearly free;
- for the K types (Q4_K, Q5_K, Q6_K), llama.cpp's Q8_K: blocks of 256 as one byte an element, dx
  = max|x| / 127 and xq = round(x / dx), within dx / 2 of x, and xs the sums of xq over each 16.
  One scale per 256 lets a block's eight sub-block products add up in integers, each times its
  integer scale, before one conversion to float: the instructions a weight costs halve.
Every row is then multiplied with them in integer instructions, and the result is the product of
the weights with the quantized activations up to float32 rounding; tests/test_cpu_quant_int8.py
holds it to that, and to llama.cpp's bound against the float64 product of the unquantized ones
(normalized mean squared error below 5e-4, as its test-backend-ops takes for these types).
"""

import numpy as np
from gguf import GGMLQuantizationType as T

from llogos_cli.backends.cpu_jit import kernel, parallel_kernel, prange
from llogos_cli.backends.cpu_simd_int8 import k_row_dot8, plain_row_dot8

BLOCK = 32         # the plain types' activation block
K_BLOCK = 256      # the K types' (Q8_K)
K_SUM = 16         # elements of each of a K block's sums
PLAIN_TYPES = frozenset({T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1})
K_TYPES = frozenset({T.Q4_K, T.Q5_K, T.Q6_K})
TYPES = PLAIN_TYPES | K_TYPES
TOKENS = 4   # tokens a K row is multiplied with at once, its blocks decoded once for them
MATRICES = 4   # products one call runs together (sharing an input), padded to this many
_q8_0, _q4_0, _q4_1, _q5_0, _q5_1 = (plain_row_dot8(n) for n in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"))
_q4_k, _q5_k, _q6_k = (k_row_dot8(n, 1) for n in ("q4_k", "q5_k", "q6_k"))
_q4_k4, _q5_k4, _q6_k4 = (k_row_dot8(n, TOKENS) for n in ("q4_k", "q5_k", "q6_k"))
_Q8_0, _Q4_0, _Q4_1, _Q5_0, _Q5_1 = int(T.Q8_0), int(T.Q4_0), int(T.Q4_1), int(T.Q5_0), int(T.Q5_1)
_Q4_K, _Q5_K, _Q6_K = int(T.Q4_K), int(T.Q5_K), int(T.Q6_K)
CHUNK = 16   # rows a thread takes at a time


@kernel
def quantize_blocks(x, xq, dx, sx):
    """x (T, cols) float32 -> xq (T, 2 · cols) int8, dx and sx (T, cols / 32) float32: each block
    of 32 as 32 bytes xhi then 32 bytes xlo (see the module)."""
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
                total += 254 * np.int64(hi) + np.int64(lo)
            dx[t, k] = d
            sx[t, k] = d * np.float32(total / 254)


@kernel
def quantize_k_blocks(x, xq, dx, xs):
    """x (T, cols) float32 -> xq (T, cols) int8, dx (T, cols / 256) float32 and xs (T, cols / 16)
    int16: llama.cpp's Q8_K (see the module)."""
    for t in range(x.shape[0]):
        xt, qt, st = x[t], xq[t], xs[t]
        for k in range(x.shape[1] // K_BLOCK):
            block, q = xt[K_BLOCK * k:K_BLOCK * k + K_BLOCK], qt[K_BLOCK * k:K_BLOCK * k + K_BLOCK]
            amax = np.float32(0)
            for l in range(K_BLOCK):
                amax = max(amax, abs(block[l]))
            d = amax / np.float32(127)
            inv = np.float32(1) / d if d > 0 else np.float32(0)
            for l in range(K_BLOCK):   # |x · inv| <= 127 up to rounding, so rint stays within int8
                q[l] = np.int8(np.rint(block[l] * inv))
            for g in range(K_BLOCK // K_SUM):
                total = np.int16(0)
                for l in range(K_SUM * g, K_SUM * g + K_SUM):
                    total += np.int16(q[l])
                st[(K_BLOCK // K_SUM) * k + g] = total
            dx[t, k] = d


@kernel
def _k_rows(raw, code, r0, r1, xq, dx, xs, out):
    n_tok = xq.shape[0]
    for t in range(0, n_tok - n_tok % TOKENS, TOKENS):
        for r in range(r0, r1):
            if code == _Q4_K:
                sums = _q4_k4(raw[r], xq, dx, xs, t)
            elif code == _Q6_K:
                sums = _q6_k4(raw[r], xq, dx, xs, t)
            else:
                sums = _q5_k4(raw[r], xq, dx, xs, t)
            for i in range(TOKENS):
                out[t + i, r] = sums[i]
    for t in range(n_tok - n_tok % TOKENS, n_tok):
        for r in range(r0, r1):
            if code == _Q4_K:
                out[t, r] = _q4_k(raw[r], xq[t], dx[t], xs[t], 0)[0]
            elif code == _Q6_K:
                out[t, r] = _q6_k(raw[r], xq[t], dx[t], xs[t], 0)[0]
            else:
                out[t, r] = _q5_k(raw[r], xq[t], dx[t], xs[t], 0)[0]


@kernel
def _plain_rows(raw, code, r0, r1, xq, dx, sx, out, isa):
    """A token at a time: these rows cost little beyond their bytes, and their prompts of more than
    INT8_MAX_TOKENS tokens take the float32 tiles (cpu_quant)."""
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
def matvec8(raws, codes, firsts, xq, dx, sx, outs, isa):
    """outs[i] (T, rows) = the two-byte activations (xq, dx, sx) · rows of raws[i] (plain types), for
    every matrix in one parallel region (q, k and v, or gate and up, share their input): chunks of
    CHUNK rows, firsts[i] the first of raws[i]'s, firsts[-1] their number. The tuples always hold
    MATRICES arrays (padding of no rows), so that one specialisation serves every call."""
    for c in prange(firsts[-1]):
        i = _matrix_of(firsts, c)
        r0 = (c - firsts[i]) * CHUNK
        _plain_rows(raws[i], codes[i], r0, min(raws[i].shape[0], r0 + CHUNK), xq, dx, sx, outs[i], isa)


@parallel_kernel
def matvec8_k(raws, codes, firsts, xq, dx, xs, outs):
    """matvec8 for the K types, with the Q8_K activations (xq, dx, xs)."""
    for c in prange(firsts[-1]):
        i = _matrix_of(firsts, c)
        r0 = (c - firsts[i]) * CHUNK
        _k_rows(raws[i], codes[i], r0, min(raws[i].shape[0], r0 + CHUNK), xq, dx, xs, outs[i])


@kernel
def _matrix_of(firsts, chunk):
    i = 0
    while firsts[i + 1] <= chunk:
        i += 1
    return i
