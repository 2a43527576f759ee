"""llogos: run GGUF language models from the command line."""

import os

__version__ = "0.1.0"

# How long idle worker threads wait for more work by spinning. llogos alternates OpenBLAS calls
# (attention, float32 tiles) with numba's kernels (OpenMP threads) on the same cores, and threads
# spinning beside the other pool's take its cores: prompts ran at 0.3-0.6 times their speed. OpenBLAS
# then spins 2^4 cycles instead of 2^28 (it sleeps at once); OpenMP 30000 spins instead of 300000,
# enough to catch decode's next product (a few µs of Python away) and short of a prompt's BLAS call
# (docs/PERF.md has both measured). Read as the libraries load, so set here, before anything of
# llogos imports NumPy or numba; a value already in the environment is kept.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("GOMP_SPINCOUNT", "30000")
