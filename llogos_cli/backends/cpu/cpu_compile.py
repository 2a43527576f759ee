"""The CPU kernels compiled in a child process on a machine's first run, so that every run, that one
included, runs the code numba's cache holds.

numba's freshly compiled code and the code it writes to its cache for the same kernel can differ in
their last bits: where fastmath lets LLVM regroup a sum, the two builds vectorize it differently
(seen on an Intel Sapphire Rapids host: a decode step's attention, and greedy output that changed
from the first run to the second). Compiling in a child and then loading from the cache in the
process that runs the model makes the first run's answers those of every later run.
"""

import hashlib
import json
import os
import subprocess
import sys

from llogos_cli.backends.cpu import cpu_jit


def compile_in_child(weights: str, batched: bool, product_types: set, experts: bool = False) -> None:
    """Have a child process compile what NumpyBackend(weights, batched).warm_up(types, experts)
    compiles for matrices of these types, unless one already has since the kernels' sources last changed. Does
    nothing where numba's cache is not llogos' folder; on any failure the caller compiles itself."""
    folder = cpu_jit.cache_folder()
    if folder is None:
        return
    spec = json.dumps({"weights": weights, "batched": batched, "types": sorted(int(t) for t in product_types),
                       "experts": experts, "isa": os.environ.get("LLOGOS_CPU_ISA", "")}, sort_keys=True)
    done = folder / f"compiled-{hashlib.sha256(spec.encode()).hexdigest()[:16]}"
    if done.exists():
        return
    try:
        subprocess.run([sys.executable, "-m", "llogos_cli.backends.cpu.cpu_compile", spec], check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        done.touch()
    except (OSError, subprocess.CalledProcessError):
        pass


def _main(spec: str) -> None:
    from gguf import GGMLQuantizationType

    from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
    s = json.loads(spec)
    backend = NumpyBackend(s["weights"], batched=s["batched"])
    backend.warm_up({GGMLQuantizationType(t) for t in s["types"]}, s["experts"], here=True)


if __name__ == "__main__":
    _main(sys.argv[1])
