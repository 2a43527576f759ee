"""KV-cache rows packed in 4-bit blocks on the CPU: q4_0 and iq4_nl, quantized as ggml's reference
quantizers (quantize_row_q4_0_ref, quantize_row_iq4_nl_ref) do, so that a cache of either type
holds what llama.cpp's would.

Both lay a row of d elements out as d / 32 blocks of 18 bytes: an f16 scale, then 16 bytes whose
byte j holds element j in its low nibble and element j + 16 in its high one. q4_0 decodes nibble n
as d * (n - 8); iq4_nl as d * IQ4_NL_VALUES[n], a non-linear table denser near zero.
"""

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

PACKED_TYPES = ("q4_0", "iq4_nl")
BLOCK, BLOCK_BYTES = GGML_QUANT_SIZES[GGMLQuantizationType.Q4_0]   # IQ4_NL's are the same: 32 elements in 18 bytes
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
# What nibble n means, times its block's scale: the table the compiled attention decodes with.
LEVELS = {"q4_0": np.arange(-8, 8, dtype=np.float32), "iq4_nl": IQ4_NL_VALUES}
# ggml's GROUP_MAX_EPS: an iq4_nl block whose largest magnitude is below it is stored as zeros.
_IQ4_NL_EPS = np.float32(1e-15)


def row_bytes(d: int) -> int:
    return d // BLOCK * BLOCK_BYTES


def _signed_max(blocks: np.ndarray) -> np.ndarray:
    """Each block's element of largest magnitude, with its sign (the first such on a tie): (..., 1)."""
    at = np.abs(blocks).argmax(axis=-1)[..., None]
    return np.take_along_axis(blocks, at, axis=-1)


def _nearest_iq4(x: np.ndarray) -> np.ndarray:
    """Index of the table value nearest x, the upper one on a tie (ggml's best_index_int8)."""
    upper = np.clip(np.searchsorted(IQ4_NL_VALUES, x, side="right"), 1, 15)
    lower = upper - 1
    return np.where(x - IQ4_NL_VALUES[lower] < IQ4_NL_VALUES[upper] - x, lower, upper).astype(np.uint8)


def _q4_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = _signed_max(blocks) / np.float32(-8)
    inv = np.where(d == 0, np.float32(0), np.float32(1) / np.where(d == 0, np.float32(1), d))
    q = np.minimum(15, np.trunc(blocks * inv + np.float32(8.5))).astype(np.uint8)
    return d, q


def _iq4_nl(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    top = _signed_max(blocks)
    d = top / IQ4_NL_VALUES[0]
    inv = np.where(d == 0, np.float32(0), np.float32(1) / np.where(d == 0, np.float32(1), d))
    q = _nearest_iq4(blocks * inv)
    # The scale that best fits the chosen levels, each element weighted by its square; summed in
    # element order as the reference's loop (and kv_cache.cuh's) does, so the f16 scales agree:
    # add.accumulate adds one element at a time, where sum() would add in pairs.
    wq = blocks * blocks * IQ4_NL_VALUES[q]
    sum_qx = np.add.accumulate(wq * blocks, axis=-1)[..., -1:]
    sum_q2 = np.add.accumulate(wq * IQ4_NL_VALUES[q], axis=-1)[..., -1:]
    fitted = np.where(sum_q2 > 0, sum_qx / np.where(sum_q2 > 0, sum_q2, np.float32(1)), np.float32(0))
    tiny = np.abs(top) < _IQ4_NL_EPS
    return np.where(tiny, np.float32(0), fitted), np.where(tiny, np.uint8(0), q)


def quantize(x: np.ndarray, cache_type: str) -> np.ndarray:
    """Rows x (..., d) float32 -> (..., row_bytes(d)) uint8 blocks of cache_type."""
    blocks = np.asarray(x, np.float32).reshape(*x.shape[:-1], -1, BLOCK)       # (..., nb, 32)
    d, q = (_q4_0 if cache_type == "q4_0" else _iq4_nl)(blocks)                # (..., nb, 1), (..., nb, 32)
    out = np.empty((*blocks.shape[:-1], BLOCK_BYTES), np.uint8)                # (..., nb, 18)
    out[..., :2] = d.astype(np.float16).view(np.uint8)
    out[..., 2:] = q[..., :BLOCK // 2] | (q[..., BLOCK // 2:] << 4)
    return out.reshape(*x.shape[:-1], -1)


def dequantize(raw: np.ndarray, cache_type: str) -> np.ndarray:
    """Rows raw (..., row_bytes(d)) uint8 blocks of cache_type -> (..., d) float32."""
    blocks = raw.reshape(*raw.shape[:-1], -1, BLOCK_BYTES)                      # (..., nb, 18)
    d = np.ascontiguousarray(blocks[..., :2]).view(np.float16).astype(np.float32)   # (..., nb, 1)
    nibbles = np.concatenate([blocks[..., 2:] & 0xF, blocks[..., 2:] >> 4], axis=-1)   # (..., nb, 32)
    return (d * LEVELS[cache_type][nibbles]).reshape(*raw.shape[:-1], -1)
