"""The CPU's second `matmul`: products with GGUF matrices read in their blocks, never expanded.

Two shapes of product, chosen by the number of tokens (measured crossovers, see docs/PERF.md):
- few tokens (decode, small batches, short prompts): each weight row is decoded in registers and
  dotted with every token's activations while it is in cache, rows shared out over every core.
  Where the CPU has integer dot products, up to INT8_MAX_TOKENS tokens with 8-bit activations
  (cpu_quant_int8; `isa`: LLOGOS_CPU_ISA=vnni|avx2|float chooses, default the best there is);
  otherwise, or with `float`, up to MATVEC_MAX_TOKENS with float32 activations (cpu_quant_dot);
- more tokens (batched decode, prefill): tiles of rows are expanded to float32 (cpu_quant_dequant)
  into one reused buffer and multiplied there, by cpu_rows for 2-64 rows, else by BLAS, so
  expanding a weight is paid once per tile, not once per token.
F16 and BF16 matrices always take the tile path.
"""

import os

import numpy as np
from gguf import GGMLQuantizationType as T

from llogos_cli.backends import CPU_DOT_TYPES, cpu_quant_dequant, cpu_quant_dot, cpu_quant_int8, cpu_rows
from llogos_cli.backends.cpu_jit import restore_chunks, share_out
from llogos_cli.backends.cpu_simd_int8 import ISA_ARG, host_isa
from llogos_cli.errors import LlogosError
from llogos_cli.gguf import quants

MATVEC_MAX_TOKENS = 4    # float32 activations
INT8_MAX_TOKENS = 12     # 8-bit activations: SmolLM2 12 tokens 47 ms against 52 from tiles, the 1B 255 against 437+
TILE_ELEMENTS = 1 << 20        # 4 MiB of float32 per tile
INT16_BLOCK = 256              # activations share one scale per this many elements (a K-quant block)
# Stand-ins for the per-token inputs a type's kernel does not read.
_NO_SUMS = np.empty((MATVEC_MAX_TOKENS, 0), np.float32)
_NO_INT16 = (np.empty((MATVEC_MAX_TOKENS, 2, 0), np.int16), np.empty((MATVEC_MAX_TOKENS, 2, 0), np.float32))


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (T, cols) as two int16 parts per 256 elements: q (T, 2, cols) and scales (T, 2, cols / 256)
    with x ≈ q[:, 0] · scale[:, 0] + q[:, 1] · scale[:, 1]. The first part is x rounded to 16 bits of
    its block's largest magnitude; the second, the remainder (at most half a step) rounded to 16
    bits of that step, which leaves each element within 2^-32 of its block's largest magnitude."""
    blocks = x.reshape(x.shape[0], -1, INT16_BLOCK)
    scale = np.empty((x.shape[0], 2, blocks.shape[1]), np.float32)
    scale[:, 0] = np.abs(blocks).max(axis=2) / np.float32(32767)
    scale[:, 1] = scale[:, 0] / np.float32(65534)
    step = np.where(scale == 0, np.float32(1), scale)[:, :, :, None].astype(np.float64)
    blocks = blocks.astype(np.float64)      # so that the remainder is exact and at most half a step
    first = np.rint(blocks / step[:, 0])
    second = np.clip(np.rint((blocks - first * scale[:, 0, :, None]) / step[:, 1]), -32767, 32767)
    q = np.stack([first, second], axis=1).astype(np.int16)
    return q.reshape(x.shape[0], 2, -1), scale


ISA_NAMES = {"vnni": "AVX-512 VNNI integer", "avx2": "AVX2 integer", "float": "float32"}


def choose_isa(asked: str | None) -> str:
    """The instruction set of the integer products: `asked` (LLOGOS_CPU_ISA) if the CPU has it,
    else the best it has; "float" keeps every product in float32."""
    best = host_isa() or "float"
    if asked in (None, ""):
        return best
    if asked not in (*ISA_ARG, "float"):
        raise LlogosError(f"LLOGOS_CPU_ISA={asked} is not one of vnni, avx2, float")
    if asked == "vnni" and best != "vnni" or asked == "avx2" and best == "float":
        raise LlogosError(f"LLOGOS_CPU_ISA={asked}: this CPU does not have it (best: {best})")
    return asked


class QuantMatmul:
    """x (T, in) float32 · W (out, in)ᵀ for W given as raw GGUF rows; holds the reused tile buffer
    and the last activations quantized to 8 bits (q, k and v, gate and up share their input)."""

    def __init__(self, isa: str | None = None):
        self._tile = np.empty(0, np.float32)
        self.isa = choose_isa(isa if isa is not None else os.environ.get("LLOGOS_CPU_ISA"))
        self._quantized_of: np.ndarray | None = None
        self._quantized = None

    def warm_up(self) -> None:
        """Call each kernel once, as products call them (weights read-only, as memory-mapped
        from the file), so that compiling or loading them from numba's cache is done here."""
        raw = np.zeros((1, 34), np.uint8)
        raw.flags.writeable = False
        self._matvec(np.zeros((1, 32), np.float32), raw, T.Q8_0)
        if self.isa in ISA_ARG:
            self._matvec8(np.zeros((1, 32), np.float32), raw, T.Q8_0)
        self._tiled(np.zeros((MATVEC_MAX_TOKENS + 1, 32), np.float32), raw, T.Q8_0, 1, 32)
        cpu_rows.warm_up()

    def __call__(self, x: np.ndarray, raw: np.ndarray, qtype: T) -> np.ndarray:
        rows, cols = raw.shape[0], quants.row_elements(raw, qtype)
        assert x.shape[1] == cols, f"x has {x.shape[1]} features, the matrix {cols}"
        x = np.ascontiguousarray(x, np.float32)
        int8 = self.isa in ISA_ARG and qtype in cpu_quant_int8.TYPES
        if int8 and x.shape[0] <= INT8_MAX_TOKENS:
            return self._matvec8(x, raw, qtype)
        if not int8 and x.shape[0] <= MATVEC_MAX_TOKENS and qtype in CPU_DOT_TYPES:
            return self._matvec(x, raw, qtype)
        return self._tiled(x, raw, qtype, rows, cols)

    @staticmethod
    def _matvec(x: np.ndarray, raw: np.ndarray, qtype: T) -> np.ndarray:
        out = np.empty((x.shape[0], raw.shape[0]), np.float32)
        xs = x.reshape(x.shape[0], -1, 32).sum(axis=2) if qtype in cpu_quant_dot.SUMS_TYPES else _NO_SUMS
        xq, dx = quantize_rows(x) if qtype in cpu_quant_dot.INT16_TYPES else _NO_INT16
        before = share_out(-(-raw.shape[0] // cpu_quant_dot.CHUNK))
        try:
            cpu_quant_dot.matvec(raw, int(qtype), x, xs, xq, dx, out)
        finally:
            restore_chunks(before)
        return out

    def _matvec8(self, x: np.ndarray, raw: np.ndarray, qtype: T) -> np.ndarray:
        if x is not self._quantized_of:
            n_tok, cols = x.shape
            n_blocks = cols // cpu_quant_int8.BLOCK
            self._quantized = (np.empty((n_tok, 2 * cols), np.int8), np.empty((n_tok, n_blocks), np.float32),
                               np.empty((n_tok, n_blocks), np.float32), np.empty((n_tok, cols // cpu_quant_int8.LANE), np.int32))
            cpu_quant_int8.quantize_blocks(x, *self._quantized)
            self._quantized_of = x   # held, so that no other array can take its identity meanwhile
        out = np.empty((x.shape[0], raw.shape[0]), np.float32)
        before = share_out(-(-raw.shape[0] // cpu_quant_int8.CHUNK))
        try:
            cpu_quant_int8.matvec8(raw, int(qtype), *self._quantized, out, ISA_ARG[self.isa])
        finally:
            restore_chunks(before)
        return out

    def _tiled(self, x: np.ndarray, raw: np.ndarray, qtype: T, rows: int, cols: int) -> np.ndarray:
        step = max(1, TILE_ELEMENTS // cols)
        if self._tile.size < min(step, rows) * cols:
            self._tile = np.empty(min(step, rows) * cols, np.float32)
        out = np.empty((x.shape[0], rows), np.float32)
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            tile = self._tile[:(r1 - r0) * cols].reshape(r1 - r0, cols)
            cpu_quant_dequant.dequantize_rows(raw[r0:r1], int(qtype), tile)
            if cpu_rows.takes(x.shape[0], tile):
                cpu_rows.matmul_rows(x, tile, out[:, r0:r1])
            else:
                out[:, r0:r1] = x @ tile.T
        return out
