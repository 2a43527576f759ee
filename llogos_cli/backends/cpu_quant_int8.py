"""Products of GGUF block rows with 8-bit activations: llama.cpp's way to multiply tokens by a
quantized matrix, in integer SIMD (cpu_simd_int8).

Each product quantizes its activations once, in one of two forms, both one byte an element:
- for the plain 32-weight types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), llama.cpp's Q8_0 / Q8_1: blocks
  of 32 with dx = max|x| / 127 and xq = round(x / dx), within dx / 2 of x, and sx = dx · the sums
  of xq (per int32 lane: see quantize_blocks);
- for the K types (Q4_K, Q5_K, Q6_K), llama.cpp's Q8_K: blocks of 256, and xs the sums of xq over
  each 16. One scale per 256 lets a block's eight sub-block products add up in integers, each times
  its integer scale, before one conversion to float.
The matrices' rows are repacked at load (packed_rows) so that each int32 lane of a vector gathers
one block's quants (plain types, two blocks a vector) or one 32-weight group's (K types); the
activations are quantized in the same lane order. Every row is then multiplied with them in integer
instructions, and the result is the product of the weights with the quantized activations up to
float32 rounding; tests/test_cpu_quant_int8.py holds it to that, and to llama.cpp's bound against
the float64 product of the unquantized ones (normalized mean squared error below 5e-4, as its
test-backend-ops takes for these types).
"""


import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from llogos_cli.backends.cpu_jit import k_scales_mins, kernel, parallel_kernel, prange
from llogos_cli.backends.cpu_simd import PLAIN
from llogos_cli.backends.cpu_simd_int8 import K_PACKED, PLAIN_PACKED, k_row_dot8, plain_row_dot8

BLOCK = 32         # the plain types' activation block
K_BLOCK = 256      # the K types' (Q8_K)
K_SUM = 16         # elements of each of a K block's sums
GROUP = 32         # a K block's weights that share a scale (Q6_K's two sub-blocks of 16), one int32 lane
GROUPS = K_BLOCK // GROUP
PLAIN_TYPES = frozenset({T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1})
K_TYPES = frozenset({T.Q4_K, T.Q5_K, T.Q6_K})
TYPES = PLAIN_TYPES | K_TYPES
TOKENS = 4   # tokens a row is multiplied with at once, its blocks decoded once for them
MATRICES = 4   # products one call runs together (sharing an input), padded to this many
_q8_0, _q4_0, _q4_1, _q5_0, _q5_1 = (plain_row_dot8(n, 1) for n in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"))
_q8_04, _q4_04, _q4_14, _q5_04, _q5_14 = (plain_row_dot8(n, TOKENS) for n in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"))
_q4_k, _q5_k, _q6_k = (k_row_dot8(n, 1) for n in ("q4_k", "q5_k", "q6_k"))
_q4_k4, _q5_k4, _q6_k4 = (k_row_dot8(n, TOKENS) for n in ("q4_k", "q5_k", "q6_k"))
_Q8_0, _Q4_0, _Q4_1, _Q5_0, _Q5_1 = int(T.Q8_0), int(T.Q4_0), int(T.Q4_1), int(T.Q5_0), int(T.Q5_1)
_Q4_K, _Q5_K, _Q6_K = int(T.Q4_K), int(T.Q5_K), int(T.Q6_K)
CHUNK = 16   # rows a thread takes at a time


@kernel
def quantize_blocks(x, xq, dx, sx):
    """x (T, cols) float32 -> xq (T, 64 · pairs) int8, dx and sx (T, 8 · pairs) float32, pairs =
    ceil(cols / 64): each block of 32 as llama.cpp's Q8_0 (d = max|x| / 127, q = round(x / d)), laid
    out as the packed plain rows read them (cpu_simd_int8.PLAIN_PACKED): per pair of blocks, A
    (elements 0-15 of the first block, then of the second) and B (16-31); per int32 lane its block's
    d and d · the sum of its eight quants (four in A, four in B). Past an odd block count, zeros."""
    for t in range(x.shape[0]):
        xt, qt, dt, st = x[t], xq[t], dx[t], sx[t]
        qt[:] = 0
        dt[:] = 0
        st[:] = 0
        for k in range(x.shape[1] // BLOCK):
            block = xt[BLOCK * k:BLOCK * k + BLOCK]
            amax = np.float32(0)
            for l in range(BLOCK):
                amax = max(amax, abs(block[l]))
            d = amax / np.float32(127)
            inv = np.float32(1) / d if d > 0 else np.float32(0)
            a = 64 * (k // 2) + 16 * (k % 2)   # this block's A; its B is 32 further on
            lane = 8 * (k // 2) + 4 * (k % 2)
            for i in range(4):
                total = 0
                for h in range(2):
                    for b in range(4):   # |x · inv| <= 127 up to rounding: rint stays in int8
                        v = np.int8(np.rint(block[16 * h + 4 * i + b] * inv))
                        qt[a + 32 * h + 4 * i + b] = v
                        total += v
                dt[lane + i] = d
                st[lane + i] = d * np.float32(total)


@kernel
def quantize_k_blocks(x, xq, dx, xs):
    """x (T, cols) float32 -> xq (T, cols) int8, dx (T, cols / 256) float32 and xs (T, cols / 16)
    int32: llama.cpp's Q8_K (see the module), each block's bytes in the packed K rows' lane order
    (cpu_simd_int8.K_PACKED: element 32i + 4m + b of the block at byte 32m + 4i + b) and its sums
    over the first 16 of each group i at 16k + i, over the second at 16k + 8 + i."""
    for t in range(x.shape[0]):
        xt, qt, st = x[t], xq[t], xs[t]
        for k in range(x.shape[1] // K_BLOCK):
            block, q = xt[K_BLOCK * k:K_BLOCK * k + K_BLOCK], qt[K_BLOCK * k:K_BLOCK * k + K_BLOCK]
            amax = np.float32(0)
            for l in range(K_BLOCK):
                amax = max(amax, abs(block[l]))
            d = amax / np.float32(127)
            inv = np.float32(1) / d if d > 0 else np.float32(0)
            for i in range(GROUPS):
                for half in range(2):
                    total = 0
                    for l in range(16 * half, 16 * half + 16):   # |x · inv| <= 127 up to rounding: rint stays in int8
                        v = np.int8(np.rint(block[GROUP * i + l] * inv))
                        q[GROUP * (l // 4) + 4 * i + l % 4] = v
                        total += v
                    st[(K_BLOCK // K_SUM) * k + GROUPS * half + i] = total
            dx[t, k] = d


@kernel
def _pack_k_rows(raw, code, size, packed, out):
    """raw (rows, blocks · size bytes) in GGUF's Q4_K, Q5_K or Q6_K layout -> out (rows, blocks ·
    packed bytes) as cpu_simd_int8.K_PACKED lays them out."""
    q = np.empty(K_BLOCK, np.uint8)
    scales = np.empty(16, np.uint8)
    for r in range(raw.shape[0]):
        src, dst = raw[r], out[r]
        for k in range(src.shape[0] // size):
            b, p = src[k * size:(k + 1) * size], dst[k * packed:(k + 1) * packed]
            if code == _Q6_K:
                for h in range(2):          # GGUF: per half, ql 64 bytes, qh 32, four quarters of 32
                    for l in range(32):
                        a, c, hi = b[64 * h + l], b[64 * h + 32 + l], b[128 + 32 * h + l]
                        q[128 * h + l] = (a & 15) | ((hi & 3) << 4)
                        q[128 * h + 32 + l] = (c & 15) | (((hi >> 2) & 3) << 4)
                        q[128 * h + 64 + l] = (a >> 4) | (((hi >> 4) & 3) << 4)
                        q[128 * h + 96 + l] = (c >> 4) | (((hi >> 6) & 3) << 4)
                p[0], p[1] = b[208], b[209]
                for i in range(GROUPS):     # the even 16-weight sub-blocks' scales, then the odd
                    p[2 + i], p[10 + i] = b[192 + 2 * i], b[193 + 2 * i]
                ql, qh = 18, 146
            else:
                qs = 48 if code == _Q5_K else 16
                for g in range(4):          # GGUF: 32 bytes per two groups, low nibbles the first
                    for l in range(32):
                        v = b[qs + 32 * g + l]
                        q[64 * g + l], q[64 * g + 32 + l] = v & 15, v >> 4
                        if code == _Q5_K:
                            q[64 * g + l] |= ((b[16 + l] >> (2 * g)) & 1) << 4
                            q[64 * g + 32 + l] |= ((b[16 + l] >> (2 * g + 1)) & 1) << 4
                k_scales_mins(b, 4, scales[:GROUPS], scales[GROUPS:])   # six-bit scales, then mins
                p[0], p[1], p[2], p[3] = b[0], b[1], b[2], b[3]
                p[4:20] = scales
                ql, qh = (52, 20) if code == _Q5_K else (20, 0)
            for n in range(4):              # quant 32i + 4m + b at byte b of lane i of vector m
                for i in range(GROUPS):
                    for bb in range(4):
                        e = GROUP * i + 4 * n + bb
                        p[ql + 32 * n + 4 * i + bb] = (q[e] & 15) | ((q[e + 16] & 15) << 4)
            for i in range(GROUPS):         # the bits above the nibbles, as K_PACKED says
                for bb in range(4):
                    if code == _Q5_K:
                        bits = 0
                        for m in range(8):
                            bits |= (q[GROUP * i + 4 * m + bb] >> 4) << m
                        p[qh + 4 * i + bb] = bits
                    elif code == _Q6_K:
                        for h in range(2):
                            bits = 0
                            for kk in range(4):
                                bits |= (q[GROUP * i + 4 * (4 * h + kk) + bb] >> 4) << (2 * kk)
                            p[qh + 32 * h + 4 * i + bb] = bits


def _pack_plain_rows(raw: np.ndarray, name: str, out: np.ndarray) -> None:
    """A plain type's rows in GGUF's layout -> out (rows, pairs · bytes, zeros) as PLAIN_PACKED lays them out."""
    size, _, _, qh_at, qs_at, _ = PLAIN[name]
    packed, d_at, m_at, masks_at, quants_at, _ = PLAIN_PACKED[name]
    # (source byte in the block, destination in the pair for the first block, for the second)
    moves = [(d_at + i, d_at + i, d_at + 2 + i) for i in range(2)]
    if m_at is not None:
        moves += [(2 + i, m_at + i, m_at + 2 + i) for i in range(2)]
    if masks_at is not None:   # fifth bits 0-15 of both blocks into A's mask, 16-31 into B's
        moves += [(qh_at + 2 * half + i, masks_at + 4 * half + i, masks_at + 4 * half + 2 + i) for half in range(2) for i in range(2)]
    if size - qs_at == BLOCK:   # one byte a quant (Q8_0): elements 0-15 of both blocks to A, 16-31 to B
        moves += [(qs_at + 16 * half + l, quants_at + 32 * half + l, quants_at + 32 * half + 16 + l) for half in range(2) for l in range(16)]
    else:                       # nibbles: each block's 16 bytes as they are
        moves += [(qs_at + l, quants_at + l, quants_at + 16 + l) for l in range(16)]
    _move_bytes(raw, size, packed, np.array(moves, np.int64), out)


@kernel
def _move_bytes(raw, size, packed, moves, out):
    """For every block k of every row: byte moves[i, 0] of the block to byte moves[i, 1 + k % 2] of
    pair k // 2 of out's row."""
    for r in range(raw.shape[0]):
        for k in range(raw.shape[1] // size):
            src, dst, h = k * size, (k // 2) * packed, 1 + k % 2
            for i in range(moves.shape[0]):
                out[r, dst + moves[i, h]] = raw[r, src + moves[i, 0]]


def new_packed_rows(raw: np.ndarray, qtype: T) -> np.ndarray:
    """The array pack_rows fills for a matrix's rows (rows, bytes): the K types' blocks one for one,
    the plain types' two blocks at a time (the second of an odd count's last pair all zeros)."""
    name, size = qtype.name.lower(), GGML_QUANT_SIZES[qtype][1]
    n_blocks = raw.shape[1] // size
    if qtype in K_TYPES:
        return np.zeros((raw.shape[0], n_blocks * K_PACKED[name][0]), np.uint8)
    return np.zeros((raw.shape[0], -(-n_blocks // 2) * PLAIN_PACKED[name][0]), np.uint8)


def pack_rows(raw: np.ndarray, qtype: T, out: np.ndarray) -> None:
    """A matrix's rows (rows, bytes) repacked into out as the integer products read them."""
    if qtype in K_TYPES:
        _pack_k_rows(raw, int(qtype), GGML_QUANT_SIZES[qtype][1], K_PACKED[qtype.name.lower()][0], out)
    else:
        _pack_plain_rows(raw, qtype.name.lower(), out)


def packed_rows(raw: np.ndarray, qtype: T) -> np.ndarray:
    """A matrix's rows repacked (read-only)."""
    out = new_packed_rows(raw, qtype)
    pack_rows(raw, qtype, out)
    out.flags.writeable = False
    return out


@kernel
def _k_rows(raw, code, r0, r1, xq, dx, xs, out, isa):
    n_tok = xq.shape[0]
    for t in range(0, n_tok - n_tok % TOKENS, TOKENS):
        for r in range(r0, r1):
            if code == _Q4_K:
                sums = _q4_k4(raw[r], xq, dx, xs, t, isa)
            elif code == _Q6_K:
                sums = _q6_k4(raw[r], xq, dx, xs, t, isa)
            else:
                sums = _q5_k4(raw[r], xq, dx, xs, t, isa)
            for i in range(TOKENS):
                out[t + i, r] = sums[i]
    for t in range(n_tok - n_tok % TOKENS, n_tok):
        for r in range(r0, r1):
            if code == _Q4_K:
                out[t, r] = _q4_k(raw[r], xq, dx, xs, t, isa)[0]
            elif code == _Q6_K:
                out[t, r] = _q6_k(raw[r], xq, dx, xs, t, isa)[0]
            else:
                out[t, r] = _q5_k(raw[r], xq, dx, xs, t, isa)[0]


@kernel
def _plain_rows(raw, code, r0, r1, xq, dx, sx, out, isa):
    n_tok = xq.shape[0]
    for t in range(0, n_tok - n_tok % TOKENS, TOKENS):
        for r in range(r0, r1):
            if code == _Q4_1:
                sums = _q4_14(raw[r], xq, dx, sx, t, isa)
            elif code == _Q8_0:
                sums = _q8_04(raw[r], xq, dx, sx, t, isa)
            elif code == _Q4_0:
                sums = _q4_04(raw[r], xq, dx, sx, t, isa)
            elif code == _Q5_0:
                sums = _q5_04(raw[r], xq, dx, sx, t, isa)
            else:
                sums = _q5_14(raw[r], xq, dx, sx, t, isa)
            for i in range(TOKENS):
                out[t + i, r] = sums[i]
    for t in range(n_tok - n_tok % TOKENS, n_tok):
        for r in range(r0, r1):
            if code == _Q4_1:
                out[t, r] = _q4_1(raw[r], xq, dx, sx, t, isa)[0]
            elif code == _Q8_0:
                out[t, r] = _q8_0(raw[r], xq, dx, sx, t, isa)[0]
            elif code == _Q4_0:
                out[t, r] = _q4_0(raw[r], xq, dx, sx, t, isa)[0]
            elif code == _Q5_0:
                out[t, r] = _q5_0(raw[r], xq, dx, sx, t, isa)[0]
            else:
                out[t, r] = _q5_1(raw[r], xq, dx, sx, t, isa)[0]


@parallel_kernel
def matvec8(raws, codes, firsts, xq, dx, sx, outs, isa):
    """outs[i] (T, rows) = the Q8_0 activations (xq, dx, sx) · packed rows of raws[i] (plain types), for
    every matrix in one parallel region (q, k and v, or gate and up, share their input): chunks of
    CHUNK rows, firsts[i] the first of raws[i]'s, firsts[-1] their number. The tuples always hold
    MATRICES arrays (padding of no rows), so that one specialisation serves every call."""
    for c in prange(firsts[-1]):
        i = _matrix_of(firsts, c)
        r0 = (c - firsts[i]) * CHUNK
        _plain_rows(raws[i], codes[i], r0, min(raws[i].shape[0], r0 + CHUNK), xq, dx, sx, outs[i], isa)


@parallel_kernel
def matvec8_k(raws, codes, firsts, xq, dx, xs, outs, isa):
    """matvec8 for the K types' packed rows, with the Q8_K activations (xq, dx, xs)."""
    for c in prange(firsts[-1]):
        i = _matrix_of(firsts, c)
        r0 = (c - firsts[i]) * CHUNK
        _k_rows(raws[i], codes[i], r0, min(raws[i].shape[0], r0 + CHUNK), xq, dx, xs, outs[i], isa)


@kernel
def _matrix_of(firsts, chunk):
    i = 0
    while firsts[i + 1] <= chunk:
        i += 1
    return i


@parallel_kernel
def matvec8_one(raw, code, xq, dx, sx, out, isa):
    """matvec8 for a single matrix, without the tuples (whose padding costs each call ~2 µs to pass)."""
    for c in prange(-(-raw.shape[0] // CHUNK)):
        _plain_rows(raw, code, c * CHUNK, min(raw.shape[0], c * CHUNK + CHUNK), xq, dx, sx, out, isa)


@parallel_kernel
def matvec8_k_one(raw, code, xq, dx, xs, out, isa):
    """matvec8_k for a single matrix."""
    for c in prange(-(-raw.shape[0] // CHUNK)):
        _k_rows(raw, code, c * CHUNK, min(raw.shape[0], c * CHUNK + CHUNK), xq, dx, xs, out, isa)
