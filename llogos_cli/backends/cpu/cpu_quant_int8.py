"""Products of GGUF block rows with 8-bit activations: llama.cpp's way to multiply tokens by a
quantized matrix, in integer SIMD (cpu_simd_int8).

Each product quantizes its activations once, in one of two forms, both one byte an element:
- for the plain 32-weight types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4), llama.cpp's Q8_0 / Q8_1: blocks
  of 32 with dx = max|x| / 127 and xq = round(x / dx), within dx / 2 of x, and xsum = Σ xq, in
  element order (quantize_blocks);
- for the K types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS), llama.cpp's Q8_K: blocks of 256, and xs the sums of xq over
  each 16. One scale per 256 lets a block's eight sub-block products add up in integers, each times
  its integer scale, before one conversion to float.
The matrices' rows are repacked at load (packed_rows): the plain types' tiled, TILE rows side by
side, so that a vector holds four quants of every row of a tile; the K types' so that each int32
lane of a vector gathers one 32-weight group's quants, the activations quantized in the same lane
order. Every row is then multiplied with them in integer instructions, and the result is the
product of the weights with the quantized activations up to float32 rounding;
tests/test_cpu_quant_int8.py holds it to that, and to llama.cpp's bound against the float64
product of the unquantized ones (normalized mean squared error below 5e-4, as its test-backend-ops
takes for these types).
"""

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType

from llogos_cli.backends import CPU_INT8_TYPES
from llogos_cli.backends.cpu.cpu_jit import kernel, parallel_kernel, prange
from llogos_cli.backends.cpu.cpu_simd import PLAIN
from llogos_cli.backends.cpu.cpu_simd_int8 import K_TILED, TILE, TILED, k_tile_dot8, quantize8, tile_dot8
from numba import typeof                   # (after cpu_jit, which sets numba's cache folder first)
from numba.extending import overload

BLOCK = 32         # the plain types' activation block
K_BLOCK = 256      # the K types' (Q8_K)
K_SUM = 16         # elements of each of a K block's sums
TYPES = CPU_INT8_TYPES
K_TYPES = frozenset({QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K, QType.IQ4_XS})
PLAIN_TYPES = TYPES - K_TYPES
TOKENS = 4   # tokens a row is multiplied with at once, its blocks decoded once for them
WIDE = 8     # ... and in prompts, while that many are left: the blocks decoded once for twice the tokens
MATRICES = 4   # products one call runs together (sharing an input), padded to this many
_PLAIN_NAMES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mxfp4", "iq4_nl")
_q8_0, _q4_0, _q4_1, _q5_0, _q5_1, _mxfp4, _iq4_nl = (tile_dot8(n, 1) for n in _PLAIN_NAMES)
_q8_04, _q4_04, _q4_14, _q5_04, _q5_14, _mxfp44, _iq4_nl4 = (tile_dot8(n, TOKENS) for n in _PLAIN_NAMES)
_K_NAMES = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs")
_q2_k, _q3_k, _q4_k, _q5_k, _q6_k, _iq4_xs = (k_tile_dot8(n, 1) for n in _K_NAMES)
_q2_k4, _q3_k4, _q4_k4, _q5_k4, _q6_k4, _iq4_xs4 = (k_tile_dot8(n, TOKENS) for n in _K_NAMES)
_q8_08, _q4_08, _q4_18, _q5_08, _q5_18, _mxfp48, _iq4_nl8 = (tile_dot8(n, WIDE) for n in _PLAIN_NAMES)
_q2_k8, _q3_k8, _q4_k8, _q5_k8, _q6_k8, _iq4_xs8 = (k_tile_dot8(n, WIDE) for n in _K_NAMES)
_Q8_0, _Q4_0, _Q4_1, _Q5_0, _Q5_1 = int(QType.Q8_0), int(QType.Q4_0), int(QType.Q4_1), int(QType.Q5_0), int(QType.Q5_1)
_Q2_K, _Q3_K, _Q4_K, _Q5_K, _Q6_K = int(QType.Q2_K), int(QType.Q3_K), int(QType.Q4_K), int(QType.Q5_K), int(QType.Q6_K)
_MXFP4, _IQ4_NL, _IQ4_XS = int(QType.MXFP4), int(QType.IQ4_NL), int(QType.IQ4_XS)
CHUNK = TILE   # rows a thread takes at a time (a tile of the plain types')
# Which family's kernels, plain or K (True), a product's specialisation compiles, named by a NumPy
# scalar's type as ISA_ARG names the instruction set: a model of plain types never compiles the K
# types' kernels, nor one of K types the plain ones' (each about half a first run's compile).
FAMILY_ARG = {False: np.uint8(0), True: np.uint16(0)}
_quantize_plain, _quantize_k = quantize8(BLOCK, BLOCK), quantize8(K_BLOCK, K_SUM)


@kernel
def quantize_blocks(x, xq, dx, xsum):
    """x (T, cols) float32 -> llama.cpp's Q8_0 blocks of 32 in element order: xq (T, cols) int8 =
    round(x / d), and per block dx (T, cols / 32) = d = max|x| / 127 and xsum (T, cols / 32) int32 = Σ xq."""
    for t in range(x.shape[0]):
        _quantize_plain(x, xq, dx, xsum, t)


@kernel
def quantize_k_blocks(x, xq, dx, xs):
    """x (T, cols) float32 -> llama.cpp's Q8_K in element order: xq (T, cols) int8, per block of 256
    dx (T, cols / 256) = max|x| / 127, and xs (T, cols / 16) int32, the sums of xq over each 16."""
    for t in range(x.shape[0]):
        _quantize_k(x, xq, dx, xs, t)


def _tiles_of(raw: np.ndarray, size: int, out: np.ndarray, tile: int) -> tuple[np.ndarray, np.ndarray]:
    """raw's blocks of `size` bytes as (tiles, blocks, TILE rows, size), the rows past raw's zeros,
    and out's memory from its first byte as (tiles, blocks, tile bytes)."""
    rows, n_blocks = raw.shape[0], raw.shape[1] // size
    n = -(-rows // TILE)
    padded = np.zeros((n * TILE, raw.shape[1]), np.uint8)
    padded[:rows] = raw
    blocks = padded.reshape(n, TILE, n_blocks, size).transpose(0, 2, 1, 3)
    return blocks, np.lib.stride_tricks.as_strided(out, (n, n_blocks, tile), (tile * n_blocks, tile, 1))


def _as_vectors(quants: np.ndarray) -> np.ndarray:
    """(.., TILE rows, 4m bytes) -> (.., TILE · 4m): vector n of 64 bytes holding each row's bytes 4n..4n+3."""
    *lead, rows, per = quants.shape
    return quants.reshape(*lead, rows, per // 4, 4).swapaxes(-3, -2).reshape(*lead, rows * per)


def _k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight six-bit scales and mins of Q4_K/Q5_K blocks from their 12-byte fields (.., 12)."""
    sc, mn = np.empty(s.shape[:-1] + (8,), np.uint8), np.empty(s.shape[:-1] + (8,), np.uint8)
    sc[..., :4], mn[..., :4] = s[..., 0:4] & 63, s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def _tile_k_rows(raw: np.ndarray, name: str, out: np.ndarray) -> None:
    """A K type's rows in GGUF's layout -> their tiles (K_TILED) in out's memory, as _tile_rows."""
    size = GGML_QUANT_SIZES[QType[name.upper()]][1]
    tile, d_at, dmin_at, scales_at, mins_at, quants_at, high_at = K_TILED[name]
    blocks, dest = _tiles_of(raw, size, out, tile)
    lead = blocks.shape[:2]
    if name == "q3_k":   # in compiled code: NumPy's steps over each element took ~25 s a GB
        n_blocks = raw.shape[1] // size
        _tile_q3_k(raw, np.lib.stride_tricks.as_strided(out, (-(-raw.shape[0] // TILE), n_blocks, tile),
                                                        (tile * n_blocks, tile, 1)))
        return
    if name == "q2_k":   # GGUF: 16 bytes of a scale (low nibble) and min (high) per 16, qs 64 bytes, d, dmin
        dest[..., d_at:d_at + 2 * TILE] = blocks[..., 80:82].reshape(*lead, 2 * TILE)
        dest[..., dmin_at:dmin_at + 2 * TILE] = blocks[..., 82:84].reshape(*lead, 2 * TILE)
        dest[..., scales_at:scales_at + 16 * TILE] = blocks[..., 0:16].swapaxes(-1, -2).reshape(*lead, 16 * TILE)
        qs = blocks[..., 16:80].reshape(*blocks.shape[:3], 2, 1, 32)                # (.., row, half, 1, l)
        q = (qs >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3                 # group 4 half + shift, quant l
        dest[..., quants_at:quants_at + 1024] = _two_bit_vectors(q.reshape(*blocks.shape[:3], 8, 32), lead)
        return
    if name == "q6_k":   # GGUF: ql 128 bytes, qh 64, 16 scales (i8), d
        ql, qh = blocks[..., 0:128].astype(np.uint8), blocks[..., 128:192]
        q = np.empty(blocks.shape[:3] + (256,), np.uint8)
        for h in range(2):
            a, c, hi = ql[..., 64 * h:64 * h + 32], ql[..., 64 * h + 32:64 * h + 64], qh[..., 32 * h:32 * h + 32]
            q[..., 128 * h:128 * h + 32] = (a & 15) | ((hi & 3) << 4)
            q[..., 128 * h + 32:128 * h + 64] = (c & 15) | (((hi >> 2) & 3) << 4)
            q[..., 128 * h + 64:128 * h + 96] = (a >> 4) | (((hi >> 4) & 3) << 4)
            q[..., 128 * h + 96:128 * h + 128] = (c >> 4) | (((hi >> 6) & 3) << 4)
        dest[..., d_at:d_at + 2 * TILE] = blocks[..., 208:210].reshape(*lead, 2 * TILE)
        dest[..., scales_at:scales_at + 16 * TILE] = blocks[..., 192:208].swapaxes(-1, -2).reshape(*lead, 16 * TILE)
        groups = q.reshape(*q.shape[:-1], 4, 2, 32)                        # (.., row, pair g, group 2g + k, quant)
        nibbles = (groups[..., 0, :] & 15) | ((groups[..., 1, :] & 15) << 4)   # (.., row, g, 32)
        high = groups >> 4
        highs = (high[..., 0, :16] | (high[..., 1, :16] << 2) | (high[..., 0, 16:] << 4) | (high[..., 1, 16:] << 6))
        dest[..., quants_at:quants_at + 2048] = _k_vectors(nibbles, lead)
        dest[..., high_at:high_at + 1024] = _k_vectors(highs, lead)
        return
    dest[..., d_at:d_at + 2 * TILE] = blocks[..., 0:2].reshape(*lead, 2 * TILE)
    if name == "iq4_xs":   # GGUF: d, scales_h (u16), scales_l 4 bytes, then 16 bytes of nibbles a sub-block
        high = blocks[..., 2].astype(np.uint16) | (blocks[..., 3].astype(np.uint16) << 8)
        j = np.arange(8)
        ls = ((blocks[..., 4 + j // 2] >> (4 * (j % 2))) & 15) | (((high[..., None] >> (2 * j)) & 3) << 4).astype(np.uint8)
        dest[..., scales_at:scales_at + 8 * TILE] = ((ls + 224) & 255).astype(np.uint8).swapaxes(-1, -2).reshape(*lead, 8 * TILE)
        qs = blocks[..., 8:136].reshape(*blocks.shape[:3], 8, 16)
        q = np.concatenate([qs & 15, qs >> 4], axis=-1)                 # (.., row, sub-block, 32): element order
        pairs = q[..., 0::2, :] | (q[..., 1::2, :] << 4)                 # (.., row, g, 32): groups 2g, 2g + 1 as Q4_K's
        dest[..., quants_at:quants_at + 2048] = _k_vectors(pairs, lead)
        return
    dest[..., dmin_at:dmin_at + 2 * TILE] = blocks[..., 2:4].reshape(*lead, 2 * TILE)
    sc, mn = _k_scales_mins(blocks[..., 4:16])
    dest[..., scales_at:scales_at + 8 * TILE] = sc.swapaxes(-1, -2).reshape(*lead, 8 * TILE)
    dest[..., mins_at:mins_at + 8 * TILE] = mn.swapaxes(-1, -2).reshape(*lead, 8 * TILE)
    qs = blocks[..., 48:176] if name == "q5_k" else blocks[..., 16:144]   # byte 32g + l: quant l of groups 2g, 2g + 1
    dest[..., quants_at:quants_at + 2048] = _k_vectors(qs.reshape(*qs.shape[:-1], 4, 32), lead)
    if name == "q5_k":   # bit j of qh byte l: the fifth bit of quant l of group j
        fifth = (blocks[..., 16:48, None] >> np.arange(8, dtype=np.uint8)) & 1    # (.., row, l, j)
        dest[..., high_at:high_at + 512] = _k_masks(fifth.swapaxes(-1, -2), lead)


_Q3_K_AT = tuple(K_TILED["q3_k"][i] for i in (1, 3, 5, 6))   # d, scales, two low bits, masks of the third


@parallel_kernel
def _tile_q3_k(raw, dest):
    """Q3_K rows (rows, blocks · 110 bytes: hmask 32, qs 64, 12 bytes of scales, d) -> their tiles
    (dest (tiles, blocks, K_TILED bytes), zeros, and zeros past the rows): d; the 16 six-bit scales
    less 32, one signed byte each; quants u = two bits of qs and one of hmask (element 128h + 32k +
    l: bits 2k of qs[32h + l], bit 4h + k of hmask[l]), their two low bits in pair g's vector n at
    bits 2 (j - 2g) + 4 part for quant 4n + b + 16 part of group j, their third in mask 8j + l // 4,
    bit 4i + l % 4 (i the row in the tile)."""
    d_at, scales_at, low_at, masks_at = _Q3_K_AT
    for c in prange(dest.shape[0]):   # tiles on every core: each writes its own
        for i in range(min(TILE, raw.shape[0] - TILE * c)):
            row = raw[TILE * c + i]
            for b in range(dest.shape[1]):
                blk, out = row[110 * b:110 * b + 110], dest[c, b]
                out[d_at + 2 * i], out[d_at + 2 * i + 1] = blk[108], blk[109]
                for j in range(16):
                    sc = ((blk[96 + j % 8] >> (4 * (j // 8))) & 15) | (((blk[104 + j % 4] >> (2 * (j // 4))) & 3) << 4)
                    out[scales_at + TILE * j + i] = (sc + 224) & 255   # sc - 32, as a byte
                for j in range(8):
                    h, k = j // 4, j % 4
                    for l in range(32):
                        u = ((blk[32 + 32 * h + l] >> (2 * k)) & 3) | (((blk[l] >> (4 * h + k)) & 1) << 2)
                        where = low_at + 256 * (j // 2) + 64 * ((l % 16) // 4) + 4 * i + l % 4
                        out[where] |= (u & 3) << (2 * (j % 2) + 4 * (l // 16))
                        bit = 4 * i + l % 4
                        out[masks_at + 8 * (8 * j + l // 4) + bit // 8] |= (u >> 2) << (bit % 8)


def _two_bit_vectors(q: np.ndarray, lead) -> np.ndarray:
    """(.., TILE rows, 8 groups, 32 quants) of 0..3 -> (.., 1024) bytes as _tile_q3_k lays out its
    two low bits: byte 256 g + 64 n + 4 i + b holds at bits 2 k + 4 part row i's quant 16 part + 4 n + b
    of group 2 g + k."""
    q = q.reshape(*lead, TILE, 4, 2, 2, 4, 4)                                      # (.., row, g, k, part, n, b)
    shifts = (2 * np.arange(2)[:, None] + 4 * np.arange(2)[None, :]).astype(np.uint8)   # (k, part)
    packed = np.bitwise_or.reduce((q << shifts[:, :, None, None]).reshape(*lead, TILE, 4, 4, 4, 4), axis=-3)
    return packed.transpose(0, 1, 3, 4, 2, 5).reshape(*lead, 1024)                  # (.., g, n, row, b)


def _k_vectors(per_group: np.ndarray, lead) -> np.ndarray:
    """(.., TILE rows, G, 4m bytes) -> (.., G · TILE · 4m): for each G, its vectors (_as_vectors)."""
    return _as_vectors(per_group.swapaxes(-3, -2)).reshape(*lead, -1)


def _k_masks(bits: np.ndarray, lead) -> np.ndarray:
    """(.., TILE rows, 8 groups, 32 quants) of 0/1 -> (.., 8 groups · 8 words · 8) bytes: mask 8j + n's
    bit 4i + b is row i's fifth bit of quant 4n + b of group j."""
    arranged = bits.reshape(*lead, TILE, 8, 8, 4).transpose(0, 1, 3, 4, 2, 5)   # (.., j, n, row, b)
    return np.packbits(arranged.reshape(*lead, 64, 64), axis=-1, bitorder="little").reshape(*lead, 512)


# The GGUF blocks of the types tiled as the plain ones but without float32 kernels of their own
# (PLAIN's): IQ4_NL's is Q4_0's, its nibbles indices into its levels.
_GGUF_BLOCKS = {"iq4_nl": PLAIN["q4_0"]}


def _tile_rows(raw: np.ndarray, name: str, out: np.ndarray) -> None:
    """A plain type's rows (rows, bytes) in GGUF's layout, rows a whole number of tiles but for the
    last, -> their tiles (TILED) in out's memory from its first byte on, the last tile's rows past
    raw's zeros (out: the packed array's rows from the same row on, whose memory runs on to the
    end of a whole tile)."""
    tile, td, tm, masks_at, quants_at, _ = TILED[name]
    if name == "mxfp4":   # GGUF: the E8M0 byte, then 16 bytes of nibbles as Q4_0's
        blocks, dest = _tiles_of(raw, 17, out, tile)
        dest[..., td:td + TILE] = blocks[..., 0]
        dest[..., quants_at:quants_at + TILE * 16] = _as_vectors(blocks[..., 1:17])
        return
    size, d_at, m_at, qh_at, qs_at, _ = PLAIN[name] if name in PLAIN else _GGUF_BLOCKS[name]
    blocks, dest = _tiles_of(raw, size, out, tile)                 # (tiles, blocks, row, byte), (tiles, blocks, tile)
    lead = blocks.shape[:2]
    dest[..., td:td + 2 * TILE] = blocks[..., d_at:d_at + 2].reshape(*lead, 2 * TILE)
    if m_at is not None:
        dest[..., tm:tm + 2 * TILE] = blocks[..., m_at:m_at + 2].reshape(*lead, 2 * TILE)
    per = 32 if name == "q8_0" else 16   # quant bytes a row
    dest[..., quants_at:quants_at + TILE * per] = _as_vectors(blocks[..., qs_at:qs_at + per])
    if qh_at is not None:   # mask 2n + h, bit 4i + b: the fifth bit of row i's quant 16h + 4n + b
        bits = np.unpackbits(blocks[..., qh_at:qh_at + 4], axis=-1, bitorder="little")       # (.., row, 32)
        bits = bits.reshape(*lead, TILE, 2, 4, 4).transpose(0, 1, 4, 3, 2, 5)               # (.., n, h, row, b)
        dest[..., masks_at:masks_at + 64] = np.packbits(bits.reshape(*lead, 8, 64), axis=-1,
                                                        bitorder="little").reshape(*lead, 64)


def new_packed_rows(rows: int, row_bytes: int, qtype: QType) -> np.ndarray:
    """The array pack_rows fills for a matrix's rows (rows of row_bytes in the file): their tiles,
    the memory under the array running on to the end of the last whole tile (zeros), which the
    products read."""
    n_blocks = row_bytes // GGML_QUANT_SIZES[qtype][1]
    return np.zeros((-(-rows // TILE) * TILE, n_blocks * _tile_bytes(qtype) // TILE), np.uint8)[:rows]


def _tile_bytes(qtype: QType) -> int:
    """Bytes of TILE rows' blocks side by side, tiled (TILED, K_TILED)."""
    return (K_TILED if qtype in K_TYPES else TILED)[qtype.name.lower()][0]


def packed_bytes(qtype: QType, nbytes: int) -> int:
    """About the bytes a matrix of nbytes in the file takes tiled (its last tile's padding aside)."""
    if qtype not in TYPES:
        return nbytes
    return nbytes * _tile_bytes(qtype) // (TILE * GGML_QUANT_SIZES[qtype][1])


def pack_rows(raw: np.ndarray, qtype: QType, out: np.ndarray) -> None:
    """A matrix's rows (rows, bytes) tiled into out as the integer products read them; raw's first
    row is the first of a tile, and so is out's."""
    (_tile_k_rows if qtype in K_TYPES else _tile_rows)(raw, qtype.name.lower(), out)


def packed_rows(raw: np.ndarray, qtype: QType) -> np.ndarray:
    """A matrix's rows repacked (read-only)."""
    out = new_packed_rows(*raw.shape, qtype)
    pack_rows(raw, qtype, out)
    out.flags.writeable = False
    return out


@kernel
def _tiles(rows, code, c0, c1, xq, dx, xs, out, isa, family):
    """Tiles c0..c1-1 of tiled rows of type `code` times every token, into out (T, rows): WIDE
    tokens at a time while that many are left (a prompt's), then TOKENS, then one at a time; xq, dx, xs the activations of the T tokens in their
    first T rows, xs their integer sums (per block of 32 for the plain types, per 16 for the K types)."""
    n_tok, n_rows = out.shape[0], out.shape[1]
    sums = np.empty(TILE * WIDE, np.float32)
    for c in range(c0, c1):
        r0 = TILE * c
        n = min(TILE, n_rows - r0)
        t = 0
        while t < n_tok:
            k = n_tok - t
            if k >= WIDE:
                k = WIDE
                _dot8(rows, code, c, xq, dx, xs, t, isa, sums, family)
            elif k >= TOKENS:
                k = TOKENS
                _dot4(rows, code, c, xq, dx, xs, t, isa, sums, family)
            else:
                for j in range(k):
                    _dot1(rows, code, c, xq, dx, xs, t + j, isa, sums[TILE * j:], family)
            for j in range(k):
                for i in range(n):
                    out[t + j, r0 + i] = sums[TILE * j + i]
            t += k


# The kernels by type code, a chain for each family and count of tokens: compiled code names each
# intrinsic it calls, so the tables are written out (the plain types' most common first).
@kernel
def _plain_dot1(rows, code, c, xq, dx, xs, t, isa, sums):
    if code == _Q4_1:
        _q4_1(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q8_0:
        _q8_0(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q4_0:
        _q4_0(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q5_0:
        _q5_0(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q5_1:
        _q5_1(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _MXFP4:
        _mxfp4(rows, c, xq, dx, xs, t, isa, sums)
    else:
        _iq4_nl(rows, c, xq, dx, xs, t, isa, sums)


@kernel
def _k_dot1(rows, code, c, xq, dx, xs, t, isa, sums):
    if code == _Q4_K:
        _q4_k(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q6_K:
        _q6_k(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q3_K:
        _q3_k(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _IQ4_XS:
        _iq4_xs(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q2_K:
        _q2_k(rows, c, xq, dx, xs, t, isa, sums)
    else:
        _q5_k(rows, c, xq, dx, xs, t, isa, sums)


@kernel
def _plain_dot4(rows, code, c, xq, dx, xs, t, isa, sums):
    if code == _Q4_1:
        _q4_14(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q8_0:
        _q8_04(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q4_0:
        _q4_04(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q5_0:
        _q5_04(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q5_1:
        _q5_14(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _MXFP4:
        _mxfp44(rows, c, xq, dx, xs, t, isa, sums)
    else:
        _iq4_nl4(rows, c, xq, dx, xs, t, isa, sums)


@kernel
def _k_dot4(rows, code, c, xq, dx, xs, t, isa, sums):
    if code == _Q4_K:
        _q4_k4(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q6_K:
        _q6_k4(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q3_K:
        _q3_k4(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _IQ4_XS:
        _iq4_xs4(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q2_K:
        _q2_k4(rows, c, xq, dx, xs, t, isa, sums)
    else:
        _q5_k4(rows, c, xq, dx, xs, t, isa, sums)


@kernel
def _plain_dot8(rows, code, c, xq, dx, xs, t, isa, sums):
    if code == _Q4_1:
        _q4_18(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q8_0:
        _q8_08(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q4_0:
        _q4_08(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q5_0:
        _q5_08(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q5_1:
        _q5_18(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _MXFP4:
        _mxfp48(rows, c, xq, dx, xs, t, isa, sums)
    else:
        _iq4_nl8(rows, c, xq, dx, xs, t, isa, sums)


@kernel
def _k_dot8(rows, code, c, xq, dx, xs, t, isa, sums):
    if code == _Q4_K:
        _q4_k8(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q6_K:
        _q6_k8(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q3_K:
        _q3_k8(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _IQ4_XS:
        _iq4_xs8(rows, c, xq, dx, xs, t, isa, sums)
    elif code == _Q2_K:
        _q2_k8(rows, c, xq, dx, xs, t, isa, sums)
    else:
        _q5_k8(rows, c, xq, dx, xs, t, isa, sums)


def _by_family(plain, k):
    """f(*args, family) for compiled code: plain(*args) or k(*args), chosen by family's type alone
    (FAMILY_ARG), so that only that family's kernels compile."""
    def dispatch(*args):
        raise NotImplementedError("for compiled code")

    @overload(dispatch)
    def _chosen(*args):
        chosen = k if args[-1] == typeof(FAMILY_ARG[True]) else plain

        def impl(*args):
            chosen(*args[:-1])
        return impl
    return dispatch


_dot1, _dot4, _dot8 = (_by_family(p, k) for p, k in ((_plain_dot1, _k_dot1), (_plain_dot4, _k_dot4), (_plain_dot8, _k_dot8)))
# x's activations into the first x.shape[0] rows of xq, dx, xs in the form the family takes:
# quantize(x, xq, dx, xs, family).
quantize = _by_family(quantize_blocks, quantize_k_blocks)


@parallel_kernel
def matvec8(raws, codes, firsts, x, xq, dx, xs, outs, isa, parts, family):
    """outs[i] (T, rows) = x (T, cols) · tiled rows of raws[i]ᵀ, for every matrix in one parallel
    region (q, k and v, or gate and up, share their input; all plain types, taking llama.cpp's
    Q8_0, or all K types, taking its Q8_K): x quantized into xq, dx, xs first (quantize; arrays of
    at least T rows), then the tiles (CHUNK rows each) cut into `parts` ranges handed out to the
    threads, firsts[i] the first tile of raws[i], firsts[-1] their number. The tuples always hold
    MATRICES arrays (padding of no rows), so that one specialisation serves every call."""
    quantize(x, xq, dx, xs, family)
    n = firsts[-1]
    for part in prange(parts):
        c, end = part * n // parts, (part + 1) * n // parts
        while c < end:   # the range's tiles of each matrix it crosses
            i = _matrix_of(firsts, c)
            stop = min(end, firsts[i + 1])
            _tiles(raws[i], codes[i], c - firsts[i], stop - firsts[i], xq, dx, xs, outs[i], isa, family)
            c = stop


@parallel_kernel
def matvec8_experts(raw, code, experts, x, xq, dx, xs, out, isa, parts, family):
    """out (P, n) = for each pair j, x[j] (x (P, cols)) times the n rows of expert experts[j] of the
    stacked tiled rows raw (n_expert · n, n whole tiles): a decode step's chosen experts in one
    parallel region, each streamed once, instead of a call and a region each. x quantized into xq,
    dx, xs first (arrays of at least P rows); the pairs' tiles cut into `parts` ranges."""
    quantize(x, xq, dx, xs, family)
    n = out.shape[1]
    per = n // TILE
    total = experts.shape[0] * per
    for part in prange(parts):
        c, end = part * total // parts, (part + 1) * total // parts
        while c < end:   # the range's tiles of each pair it crosses
            j = c // per
            stop = min(end, (j + 1) * per)
            e = experts[j]
            _tiles(raw[e * n:(e + 1) * n], code, c - j * per, stop - j * per,
                   xq[j:j + 1], dx[j:j + 1], xs[j:j + 1], out[j:j + 1], isa, family)
            c = stop


@kernel
def _matrix_of(firsts, chunk):
    i = 0
    while firsts[i + 1] <= chunk:
        i += 1
    return i


@parallel_kernel
def matvec8_one(raw, code, x, xq, dx, xs, out, isa, parts, family):
    """matvec8 for a single matrix, without the tuples (whose padding costs each call time to pass)."""
    quantize(x, xq, dx, xs, family)
    n = -(-raw.shape[0] // TILE)
    for part in prange(parts):
        _tiles(raw, code, part * n // parts, (part + 1) * n // parts, xq, dx, xs, out, isa, family)
