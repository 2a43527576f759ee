"""How many threads the CPU backend computes on: numba's compiled kernels and OpenBLAS.

llama.cpp's pair of settings: `threads` for a step of one token (decode of one sequence),
`threads_batch` for a step of several (prompt chunks, batches). 0 means "auto": the cores this
process may use, less those other processes keep busy, counted again every RECOUNT_S seconds.
A product split over a core that another process holds ends waiting for the descheduled share,
every product, hundreds of times a token; on the cores that are free it just runs (docs/PERF.md
has the figures, beside llama.cpp's under the same load).
"""

import os
import sys
import time

from llogos_cli.console import warn

RECOUNT_S = 2.0   # how often auto looks again at what other processes use
FIRST_COUNT_S = 0.1   # the first step counts over loading the model, if it took this long
_TICKS = os.sysconf("SC_CLK_TCK")


def available_cores() -> int:
    """The cores this process may run on (its affinity mask; a container's CPU set)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class CpuThreads:
    """Applies the thread count a step wants to numba (when loaded) and OpenBLAS, from the thread
    that runs the forward pass (numba's count is per calling thread)."""

    def __init__(self, threads: int = 0, threads_batch: int = 0):
        if threads < 0 or threads_batch < 0:
            raise ValueError("thread counts are positive, or 0 for auto")
        self.threads, self.threads_batch = threads, threads_batch
        self._cores = available_cores()
        for flag, n in (("-t", threads), ("-tb", threads_batch)):
            if n > self._cores:   # llama.cpp takes it silently; here it ran 15x slower than -t 1 beside other work
                warn(f"{flag} {n} is more threads than the {self._cores} cores this process may run on: "
                     "the extra threads wait for a core, which makes every step slower, not faster")
        self._free = self._cores
        self._sample = _busy_sample()
        self._counted = False
        self._applied: int | None = None
        self._blas = None

    @property
    def load_threads(self) -> int:
        """Threads for preparing weights at load time."""
        return self.threads_batch or self._free

    def for_step(self, n_tokens: int) -> int:
        """Set and return the thread count for a forward pass over n_tokens tokens."""
        wanted = self.threads if n_tokens == 1 else self.threads_batch
        n = wanted or self._auto()
        if n != self._applied:
            self._apply(n)
        return n

    def _auto(self) -> int:
        elapsed = time.monotonic() - self._sample[0]
        if elapsed >= RECOUNT_S or (not self._counted and elapsed >= FIRST_COUNT_S):
            self._counted = True
            sample = _busy_sample()
            self._free = free_cores(self._sample, sample, self._cores)
            self._sample = sample
        return self._free

    def _apply(self, n: int) -> None:
        numba = sys.modules.get("numba")   # only the quantized and batched paths load it
        if numba is not None:
            numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
        for lib in self._openblas():
            lib.set_num_threads(n)
        self._applied = n

    def _openblas(self) -> list:
        if self._blas is None:
            from threadpoolctl import ThreadpoolController
            self._blas = ThreadpoolController().select(internal_api="openblas").lib_controllers
        return self._blas


def _busy_sample() -> tuple[float, float, float]:
    """(wall seconds, CPU seconds every process spent, CPU seconds this process spent)."""
    wall = time.monotonic()
    mine = sum(os.times()[:2])
    mask = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    busy = 0.0
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *fields = line.split()
                if not name.startswith("cpu") or name == "cpu":
                    continue
                if mask is not None and int(name[3:]) not in mask:
                    continue
                ticks = [int(v) for v in fields[:8]]
                busy += (sum(ticks) - ticks[3] - ticks[4]) / _TICKS   # all but idle and iowait
    except (OSError, ValueError):   # not Linux: nothing known about the others
        busy = mine
    return wall, busy, mine


TAKEN = 0.75   # the share of a core other processes must use for it to count as theirs


def free_cores(before: tuple[float, float, float], after: tuple[float, float, float], cores: int) -> int:
    """The cores other processes left free between two samples, at least one. A core counts as
    taken once others use TAKEN of it: a light neighbour (a daemon, a mostly idle process) leaves
    all the cores in use, since a thread that shares its core for brief moments loses less than
    the core is worth."""
    wall = after[0] - before[0]
    others = (after[1] - before[1]) - (after[2] - before[2])
    if wall <= 0:
        return cores
    return max(1, min(cores, cores - int(others / wall + 1 - TAKEN)))
