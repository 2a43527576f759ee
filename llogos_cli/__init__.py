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

# LLOGOS_CPU_ISA=avx2 (or avxvnni) on a CPU that has more: compile every kernel for a CPU that has
# only that set, as a desktop or cloud AVX2 CPU would run them. LLVM otherwise takes the host's
# AVX-512 for the vector code it writes itself, even inside the AVX2 kernels (two 256-bit halves
# become one 512-bit op, masks become mask registers): those kernels ran 0.55x the instructions of an
# AVX2 CPU's (docs/PERF.md). numba reads these as it loads; values already set are kept.
_AS_CPU = {"avx2": ("haswell", "+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+popcnt,+lzcnt,+movbe"),
           "avxvnni": ("alderlake", "+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+popcnt,+lzcnt,+movbe,+avxvnni")}
if os.environ.get("LLOGOS_CPU_ISA") in _AS_CPU and "NUMBA_CPU_NAME" not in os.environ:
    os.environ["NUMBA_CPU_NAME"], os.environ["NUMBA_CPU_FEATURES"] = _AS_CPU[os.environ["LLOGOS_CPU_ISA"]]
