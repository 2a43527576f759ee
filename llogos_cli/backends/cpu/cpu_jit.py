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
import mmap
import os
import sys
import threading
from pathlib import Path

import numpy as np

from llogos_cli.gguf.file import advise
from llogos_cli.paths import optional_cache_dir


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("cpu_*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_folder = optional_cache_dir("numba", _sources_digest())
if _folder is not None:   # else numba falls back to __pycache__ or its own per-user folder
    os.environ.setdefault("NUMBA_CACHE_DIR", str(_folder))



def cache_folder() -> Path | None:
    """The folder numba caches these kernels in, if it is llogos' own."""
    return _folder if _folder is not None and os.environ.get("NUMBA_CACHE_DIR") == str(_folder) else None


import numba  # noqa: E402  (after NUMBA_CACHE_DIR is set)
from numba.np.ufunc import parallel as _parallel  # noqa: E402

from llogos_cli.backends.cpu.cpu_simd import float_from_bits  # noqa: E402

_MADV_PAGEOUT = getattr(mmap, "MADV_PAGEOUT", 21)   # Linux 5.4 on


def release_compiler_pages() -> None:
    """Hand back LLVM's resident pages (libllvmlite's, tens of MB once the kernels are loaded:
    docs/PERF.md). numba runs LLVM only to compile or load a kernel; in between, those
    pages are clean copies of the library's file, memory the model's weights could use. LLVM
    reads them back from the file if it runs again. Linux only; elsewhere, or where the kernel
    refuses, nothing happens."""
    if not sys.platform.startswith("linux"):
        return
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and Path(fields[5]).name.startswith("libllvmlite"):
                start, end = (int(a, 16) for a in fields[0].split("-"))
                advise(start, end, _MADV_PAGEOUT)


release_compiler_pages()   # what importing numba touched: the weights load next

# fastmath lets LLVM split float sums across SIMD lanes; the integer dot products are exact anyway.
# NumPy's error model: a float division by zero gives inf or nan, as NumPy's does, where Python's
# raises, whose check per division keeps a loop with one (SiLU's) from vectorizing.
kernel = numba.njit(cache=True, fastmath=True, nogil=True, error_model="numpy")
parallel_kernel = numba.njit(cache=True, fastmath=True, nogil=True, parallel=True, error_model="numpy")
# Helpers called once per block: inlined by numba itself, since LLVM leaves calls between separately
# compiled functions in place, and a call per 32 weights costs more than the weights.
helper = numba.njit(cache=True, fastmath=True, inline="always", error_model="numpy")
prange = numba.prange
SHARES = 4   # chunks of rows a product hands each thread (share_out, parts)


def share_out(chunks: int) -> None:
    """Make the next prange over `chunks` hand them out as threads come free, about SHARES per
    thread. On a shared machine a thread that loses its core for a time slice then holds up one
    share, not its whole part of the rows; each hand-out has a cost of its own (docs/PERF.md). The
    setting (numba's, per calling thread) is made only when it changes: through the threading
    layer's own functions once its threads run, since numba's public getter and setters check and
    start them on every call, most of a small product's time. (Inside a kernel, they would keep numba from caching it.) Every prange's caller in
    these modules calls this or split_evenly first."""
    _set_chunk_size(max(1, chunks // (SHARES * _threading_layer()[1]())))


def parts(units: int, threads: int) -> int:
    """How many parts to cut `units` of work into on `threads` threads, SHARES a thread (at most one
    a unit), with the next prange set to hand them out one at a time as threads come free: for
    kernels that take their part of the units as one range (the integer products: a part a call of
    the per-tile loop, where each prange iteration handed out has a cost of its own)."""
    _set_chunk_size(1)
    return max(1, min(units, SHARES * threads))


def split_evenly() -> None:
    """Make the next prange give each thread an equal part at once (numba's default)."""
    _set_chunk_size(0)


def _set_chunk_size(size: int) -> None:
    if getattr(_chunk_size, "now", None) != size:
        _threading_layer()[0](size)
        _chunk_size.now = size


_chunk_size = threading.local()   # the size share_out last set, by calling thread


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


@helper
def exp32(x):
    """e^x in float32 from operations that vectorize (LLVM has no vector expf to call): x clamped to
    [-87, 88], where e^x is a normal float, written 2^n e^r with |r| <= ln2 / 2, e^r by its Taylor
    series to r^6 (error below 2^-23 relative), 2^n put straight into the exponent bits. Below -87
    it gives 2^-126 rather than 0 or a subnormal; above 88, e^88 rather than inf."""
    x = min(max(x, np.float32(-87.0)), np.float32(88.0))
    n = np.floor(x * np.float32(1.4426950408889634) + np.float32(0.5))
    r = x - n * np.float32(0.693145751953125) - n * np.float32(1.4286068203094172e-06)   # ln 2 in two parts
    p = np.float32(1 / 720)
    p = p * r + np.float32(1 / 120)
    p = p * r + np.float32(1 / 24)
    p = p * r + np.float32(1 / 6)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1)
    p = p * r + np.float32(1)
    return p * float_from_bits((np.int32(n) + np.int32(127)) << np.int32(23))
