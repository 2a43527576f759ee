"""Numba set-up for the CPU's quantized kernels, and the block fields they all read.

Compiled kernels are cached (`cache=True`) in llogos' cache folder, so only the first run on a
machine pays for compiling them; the folder has to be named before numba is imported, because
numba reads NUMBA_CACHE_DIR once, at import. It is named after the kernels' sources: numba checks
a cached kernel against its own file only, so a changed intrinsic in cpu_simd*.py would otherwise
leave the kernels of other files that inline it running the old code. Importing this module is
what makes the quantized path cost numba's import time: the float32 path never imports it.
"""

import functools
import hashlib
import os
from pathlib import Path

import numpy as np

from llogos_cli.paths import optional_cache_dir


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("cpu_*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_folder = optional_cache_dir("numba", _sources_digest())
if _folder is not None:   # else numba falls back to __pycache__ or its own per-user folder
    os.environ.setdefault("NUMBA_CACHE_DIR", str(_folder))

import numba  # noqa: E402  (after NUMBA_CACHE_DIR is set)
from numba.np.ufunc import parallel as _parallel  # noqa: E402

# fastmath lets LLVM split float sums across SIMD lanes; the integer dot products are exact anyway.
kernel = numba.njit(cache=True, fastmath=True, nogil=True)
parallel_kernel = numba.njit(cache=True, fastmath=True, nogil=True, parallel=True)
# Helpers called once per block: inlined by numba itself, since LLVM leaves calls between separately
# compiled functions in place, and a call per 32 weights costs more than the weights.
helper = numba.njit(cache=True, fastmath=True, inline="always")
prange = numba.prange
SHARES = 8   # chunks of rows a product hands each thread (share_out)


def share_out(chunks: int) -> int:
    """Make the next prange over `chunks` hand them out as threads come free, about SHARES per
    thread; returns the chunk size to restore afterwards. On a shared machine a thread that loses
    its core for a time slice then holds up one share, not its whole part of the rows; each hand-out
    costs ~0.2 µs (one per 16 rows took a 1536-row product on one thread from 84 to 101 µs). Through
    the threading layer's own functions once its threads run: numba's public getter and setters
    check and start them on every call, ~4 µs of a 6 µs product. (Inside a kernel, they would keep
    numba from caching it.)"""
    set_chunks, thread_count = _threading_layer()
    return set_chunks(max(1, chunks // (SHARES * thread_count())))


def restore_chunks(before: int) -> None:
    _threading_layer()[0](before)


@functools.cache
def _threading_layer():
    """The threading layer's chunk-size setter and thread-count getter, which exist once numba has
    started its threads."""
    numba.get_num_threads()
    return _parallel._set_parallel_chunksize, _parallel._get_num_threads

# float16 bit pattern -> float32, for the per-block scales (a global array is frozen into the code).
F16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@helper
def f16_at(row: np.ndarray, o: int) -> np.float32:
    """The little-endian float16 at byte o of row."""
    return F16[np.int64(row[o]) | (np.int64(row[o + 1]) << 8)]


@helper
def k_scales_mins(row: np.ndarray, s: int, sc: np.ndarray, mn: np.ndarray) -> None:
    """The eight six-bit scales and mins of a Q4_K/Q5_K block, from its 12-byte field at row[s:s+12],
    into sc and mn (float or integer arrays)."""
    for j in range(4):
        sc[j] = row[s + j] & 63
        mn[j] = row[s + j + 4] & 63
    for j in range(4, 8):
        sc[j] = (row[s + j + 4] & 15) | ((row[s + j - 4] >> 6) << 4)
        mn[j] = (row[s + j + 4] >> 4) | ((row[s + j] >> 6) << 4)
