"""Dequantize GGUF tensor rows to float32 with vectorized NumPy.

`gguf.quants.dequantize` is the reference these are tested against; it runs at ~50 M
elements/s on Q8_0, too slow to expand a model at start-up, so the CPU backend uses these
(~10x faster). Each takes raw bytes shaped (rows, bytes per row) and returns (rows, cols).
"""

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType

from llogos_cli.errors import LlogosError
from llogos_cli.gguf.layout import printable


def _blocks(raw: np.ndarray, qtype: QType) -> np.ndarray:
    """View raw row bytes as (rows, blocks per row, bytes per block)."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    return raw.reshape(raw.shape[0], -1, type_size)


def _f16(b: np.ndarray, start: int) -> np.ndarray:
    """A float16 field at byte `start` of every block, as float32 with a trailing axis of 1."""
    return b[..., start:start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Low nibbles then high nibbles of each byte group, as in Q4_0/Q4_1/Q5_x blocks."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _q8_0(b):  # d:f16, qs:int8[32]
    return _f16(b, 0) * b[..., 2:34].view(np.int8).astype(np.float32)


def _q4_0(b):  # d:f16, qs:u8[16] (elements 0-15 in low nibbles, 16-31 in high)
    return _f16(b, 0) * (_nibbles(b[..., 2:18]).astype(np.float32) - 8.0)


def _q4_1(b):  # d:f16, m:f16, qs:u8[16]
    return _f16(b, 0) * _nibbles(b[..., 4:20]).astype(np.float32) + _f16(b, 2)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Bit j of the little-endian u32 `qh` is the fifth bit of element j (0-31)."""
    bits = np.unpackbits(qh, axis=-1, bitorder="little")
    return bits.astype(np.uint8) << 4


def _q5_0(b):  # d:f16, qh:u32 (fifth bits), qs:u8[16]
    q = _nibbles(b[..., 6:22]) | _fifth_bits(b[..., 2:6])
    return _f16(b, 0) * (q.astype(np.float32) - 16.0)


def _q5_1(b):  # d:f16, m:f16, qh:u32, qs:u8[16]
    q = _nibbles(b[..., 8:24]) | _fifth_bits(b[..., 4:8])
    return _f16(b, 0) * q.astype(np.float32) + _f16(b, 2)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12-byte K-quant scale field into 8 six-bit scales and 8 six-bit mins."""
    lo, hi = s[..., 0:4], s[..., 4:8]
    tail = s[..., 8:12]
    sc = np.concatenate([lo & 63, (tail & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([hi & 63, (tail >> 4) | ((hi >> 6) << 4)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """128 bytes -> 8 sub-blocks of 32: each 32-byte group gives its low nibbles, then high."""
    g = qs.reshape(*qs.shape[:-1], 4, 1, 32)
    return np.concatenate([g & 0x0F, g >> 4], axis=-2).reshape(*qs.shape[:-1], 8, 32)


def _q4_k(b):  # d:f16, dmin:f16, scales:u8[12], qs:u8[128] per 256 elements
    sc, mn = _k_scales(b[..., 4:16])
    q = _k_nibbles(b[..., 16:144]).astype(np.float32)
    y = (_f16(b, 0) * sc)[..., None] * q - (_f16(b, 2) * mn)[..., None]
    return y.reshape(*b.shape[:-1], 256)


def _q5_k(b):  # d:f16, dmin:f16, scales:u8[12], qh:u8[32], qs:u8[128] per 256 elements
    sc, mn = _k_scales(b[..., 4:16])
    qh = b[..., 16:48]
    high = np.stack([(qh >> j) & 1 for j in range(8)], axis=-2)  # sub-block j takes bit j
    q = (_k_nibbles(b[..., 48:176]) | (high << 4)).astype(np.float32)
    y = (_f16(b, 0) * sc)[..., None] * q - (_f16(b, 2) * mn)[..., None]
    return y.reshape(*b.shape[:-1], 256)


def _q6_k(b):  # ql:u8[128], qh:u8[64], scales:i8[16], d:f16 per 256 elements
    ql = b[..., 0:128].reshape(*b.shape[:-1], 2, 2, 32)   # (half, byte group, 32)
    qh = b[..., 128:192].reshape(*b.shape[:-1], 2, 1, 32)  # (half, 1, 32)
    lo = np.concatenate([ql & 0x0F, ql >> 4], axis=-2)     # quarters 0-3 of each half
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(4, 1)
    hi = (qh >> shifts) & 3
    q = (lo | (hi << 4)).astype(np.float32) - 32.0           # (half, quarter, 32)
    sc = b[..., 192:208].view(np.int8).astype(np.float32).reshape(*b.shape[:-1], 2, 4, 2, 1)
    y = _f16(b, 208)[..., None, None, None] * sc * q.reshape(*q.shape[:-1], 2, 16)
    return y.reshape(*b.shape[:-1], 256)


def _two_bits(qs: np.ndarray) -> np.ndarray:
    """64 bytes -> 256 two-bit values: in half h (32 bytes), element 32k + l is bits 2k of byte l."""
    g = qs.reshape(*qs.shape[:-1], 2, 1, 32)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(4, 1)
    return ((g >> shifts) & 3).reshape(*qs.shape[:-1], 256)


def _q2_k(b):  # scales:u8[16] (low nibble scale, high nibble min), qs:u8[64], d:f16, dmin:f16 per 256
    sc = b[..., 0:16]
    a = (_f16(b, 80) * (sc & 0x0F).astype(np.float32))[..., None]
    c = (_f16(b, 82) * (sc >> 4).astype(np.float32))[..., None]
    q = _two_bits(b[..., 16:80]).astype(np.float32).reshape(*b.shape[:-1], 16, 16)
    return (a * q - c).reshape(*b.shape[:-1], 256)


def _q3_k(b):  # hmask:u8[32], qs:u8[64], scales:u8[12] (16 six-bit, biased by 32), d:f16 per 256
    s = b[..., 96:108]
    low = np.concatenate([s[..., 0:8] & 0x0F, s[..., 0:8] >> 4], axis=-1)                  # scale j: byte j % 8
    high = np.concatenate([(s[..., 8:12] >> k) & 3 for k in (0, 2, 4, 6)], axis=-1)      # byte 8 + j % 4
    scales = (low | (high << 4)).astype(np.float32) - 32.0
    # Element 32m + l takes bit m of hmask[l] as its third bit; a clear bit means q - 4.
    hbit = np.unpackbits(b[..., 0:32, None], axis=-1, bitorder="little")                   # (.., l, m)
    hbit = np.swapaxes(hbit, -1, -2).reshape(*b.shape[:-1], 256)
    q = _two_bits(b[..., 32:96]).astype(np.float32) - 4.0 * (1 - hbit).astype(np.float32)
    return ((_f16(b, 108) * scales)[..., None] * q.reshape(*b.shape[:-1], 16, 16)).reshape(*b.shape[:-1], 256)


# IQ4_NL's and IQ4_XS's 16 non-linear levels, and MXFP4's E2M1 values doubled (ggml-common.h).
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """Half of the power of two 2^(e - 127) an E8M0 byte stands for, as float32 (2^-128 and 2^-127,
    for e 0 and 1, are subnormal): MXFP4's values are doubled, so this is the block's multiplier."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (np.maximum(e, 1) - 1) << 23)
    return bits.astype(np.uint32).view(np.float32)


def _iq4_nl(b):  # d:f16, qs:u8[16] (nibbles as Q4_0, each an index into IQ4_NL_VALUES)
    return _f16(b, 0) * IQ4_NL_VALUES[_nibbles(b[..., 2:18])]


def _iq4_xs(b):  # d:f16, scales_h:u16, scales_l:u8[4], qs:u8[128] per 256: 8 sub-blocks of 32
    h = b[..., 2:4].copy().view(np.uint16)
    high = (h >> (2 * np.arange(8, dtype=np.uint16))) & 3                                 # sub-block j: bits 2j
    low = np.stack([b[..., 4:8] & 0x0F, b[..., 4:8] >> 4], axis=-1).reshape(*b.shape[:-1], 8)  # byte j / 2
    scales = (low.astype(np.uint16) | (high << 4)).astype(np.float32) - 32.0
    qs = b[..., 8:136].reshape(*b.shape[:-1], 8, 16)
    q = IQ4_NL_VALUES[np.concatenate([qs & 0x0F, qs >> 4], axis=-1)]                     # (.., 8, 32)
    return ((_f16(b, 0) * scales)[..., None] * q).reshape(*b.shape[:-1], 256)


def _mxfp4(b):  # e:E8M0, qs:u8[16] (nibbles as Q4_0, each an index into MXFP4_VALUES) per 32
    return e8m0_half(b[..., 0:1]) * MXFP4_VALUES[_nibbles(b[..., 1:17])]


_DEQUANT = {QType.Q8_0: _q8_0, QType.Q4_0: _q4_0, QType.Q4_1: _q4_1, QType.Q5_0: _q5_0, QType.Q5_1: _q5_1,
            QType.Q2_K: _q2_k, QType.Q3_K: _q3_k, QType.Q4_K: _q4_k, QType.Q5_K: _q5_k, QType.Q6_K: _q6_k,
            QType.IQ4_NL: _iq4_nl, QType.IQ4_XS: _iq4_xs, QType.MXFP4: _mxfp4}
_PLAIN = {QType.F32: np.float32, QType.F16: np.float16}
SUPPORTED = frozenset(_DEQUANT) | frozenset(_PLAIN) | {QType.BF16}


def check_supported(qtype: QType, name: str) -> None:
    if qtype not in SUPPORTED:
        raise LlogosError(f"unsupported tensor type {qtype.name} for {printable(name)} "
                          f"(supported: {', '.join(sorted(t.name for t in SUPPORTED))})")


def row_elements(raw: np.ndarray, qtype: QType) -> int:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    return raw.shape[-1] // type_size * block_size


def dequantize(raw: np.ndarray, qtype: QType) -> np.ndarray:
    """Raw bytes (rows, bytes per row) of type `qtype` -> float32 (rows, cols)."""
    check_supported(qtype, "tensor")
    out = np.empty((raw.shape[0], row_elements(raw, qtype)), dtype=np.float32)
    # Chunks of ~1M elements keep the temporaries in cache; whole-table temporaries are 4x slower.
    step = max(1, (1 << 20) // out.shape[1])
    for r in range(0, raw.shape[0], step):
        out[r:r + step] = _rows(raw[r:r + step], qtype)
    return out


def _rows(raw: np.ndarray, qtype: QType) -> np.ndarray:
    if qtype in _PLAIN:
        return raw.view(_PLAIN[qtype])
    if qtype == QType.BF16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return _DEQUANT[qtype](_blocks(raw, qtype)).reshape(raw.shape[0], -1)
