"""Float32 products of a few rows (a batched decode step): x (R, K) · W (N, K)ᵀ for 2 <= R <= 64.

OpenBLAS repacks the whole weight matrix on every small-row GEMM call, so a step of a few rows
costs it several one-row GEMVs for little more arithmetic. Here the weights are read
once, in place: the tokens go across the lanes of 1-4 vectors of 16 (x transposed into xt, a few
hundred KiB at most), each weight is broadcast into them, and a tile of weight rows keeps its sums
in registers for the whole row (cpu_simd.f32_rows_tile). Tiles are shared out over the cores in
contiguous runs, so each core's prefetches of its next tile are its own. Measured in
docs/PERF.md ("Products of a few rows").
"""

import llvmlite.binding as llvm
import numpy as np

from llogos_cli.backends.cpu.cpu_jit import parallel_kernel, prange, split_evenly
from llogos_cli.backends.cpu.cpu_simd import ROW_LANES, f32_rows_tile

MAX_ROWS = 4 * ROW_LANES
# A matrix of fewer weights is left to BLAS: it is not what streaming from memory is about, and a
# parallel call (~10 us, and on a busy machine a wait for a descheduled thread at its end) costs
# more than OpenBLAS's single-threaded product. Tiny test models ran 14x slower beside two busy
# processes when every product took the kernel (docs/PERF.md).
MIN_WEIGHTS = 1 << 16
# Weight rows per tile for 1-4 vectors of tokens: rows x vectors sums plus the vectors and one
# broadcast fill the 32 vector registers of AVX-512; elsewhere a 16-lane vector takes two
# registers of 16 and the tiles shrink to fit.
_WIDE = bool(llvm.get_host_cpu_features().get("avx512f", False))
TILE_ROWS = (8, 8, 8, 6) if _WIDE else (6, 3, 2, 1)
_TILE_1, _TILE_2, _TILE_3, _TILE_4 = (f32_rows_tile(rows, v + 1) for v, rows in enumerate(TILE_ROWS))


@parallel_kernel
def _product(x, w, xt, out):
    n_tok, k_len = x.shape
    for k in range(k_len):          # tokens across lanes; lanes past n_tok are zeros, never stored
        for r in range(n_tok):
            xt[k, r] = x[r, k]
        for r in range(n_tok, xt.shape[1]):
            xt[k, r] = 0
    vectors = xt.shape[1] // ROW_LANES
    rows = TILE_ROWS[vectors - 1]
    n = w.shape[0]
    for t in prange((n + rows - 1) // rows):
        n0 = t * rows
        nr = min(rows, n - n0)
        if vectors == 1:
            _TILE_1(w, xt, out, n0, nr)
        elif vectors == 2:
            _TILE_2(w, xt, out, n0, nr)
        elif vectors == 3:
            _TILE_3(w, xt, out, n0, nr)
        else:
            _TILE_4(w, xt, out, n0, nr)


def takes(n_tok: int, w: np.ndarray) -> bool:
    """Whether a product of n_tok rows with w is this kernel's to do."""
    return 1 < n_tok <= MAX_ROWS and w.size >= MIN_WEIGHTS


def matmul_rows(x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x (R, K) float32 · w (N, K)ᵀ into out (R, N) (a new array, or e.g. a column range of a
    larger one: rows may be strided, elements must be contiguous)."""
    n_tok, k_len = x.shape
    assert n_tok <= MAX_ROWS and w.shape[1] == k_len, (x.shape, w.shape)
    if out is None:
        out = np.empty((n_tok, w.shape[0]), np.float32)
    assert out.shape == (n_tok, w.shape[0])
    if out.size == 0:   # (an empty array's strides may be anything)
        return out
    assert w.dtype == out.dtype == np.float32 and w.strides[1] == out.strides[1] == 4, (w.strides, out.strides)
    xt = np.empty((k_len, -(-n_tok // ROW_LANES) * ROW_LANES), np.float32)
    split_evenly()
    _product(np.ascontiguousarray(x, np.float32), w, xt, out)
    return out


def warm_up() -> None:
    """Compile the kernel, or load it from numba's cache, for the two kinds of output it is given:
    a whole array, and a column range of one (the quantized path's tiles)."""
    x, w = np.ones((2, 16), np.float32), np.ones((4, 16), np.float32)
    matmul_rows(x, w)
    matmul_rows(x, w, np.empty((2, 8), np.float32)[:, :4])
