"""Instructions the integer products issue per tile-block (TILE rows times one block, one token),
read from the assembly of each kernel compiled alone: a figure that does not depend on how busy the
machine is (docs/PERF.md). A set this CPU lacks compiles for a CPU that has it, e.g. AVX-VNNI with
NUMBA_CPU_NAME=alderlake NUMBA_CPU_FEATURES=+avx2,+avxvnni,+fma,+f16c,+bmi2 (nothing is run); on a
CPU with AVX-512, give LLOGOS_CPU_ISA=avx2 for an AVX2 CPU's code (else LLVM uses AVX-512 inside it).

    python -m bench.kernel_asm avx2 q4_1 q8_0 q4_k q6_k
"""

import argparse
import re

import llogos_cli  # noqa: F401  (before numba: LLOGOS_CPU_ISA=avx2 compiles for an AVX2 CPU)
import numba
import numpy as np

from llogos_cli.backends.cpu.cpu_simd_int8 import ISA_ARG, K_TILED, k_tile_dot8, tile_dot8

GROUP_PAIRS = 4   # trips of a K kernel's inner loop per block (its groups, two at a time)
COUNTED = ("vpmaddubsw", "vpmaddwd", "vpdpbusd", "vpmulld")


def _array(dtype: str, dims: int, readonly: bool = False):
    return numba.types.Array(numba.from_dtype(np.dtype(dtype)), dims, "C", readonly=readonly)


def kernel_asm(name: str, isa: str) -> str:
    dot = (k_tile_dot8 if name in K_TILED else tile_dot8)(name, 1)

    def product(rows, c, xq, dx, xs, t, isa_arg, sums):
        dot(rows, c, xq, dx, xs, t, isa_arg, sums)
    kernel = numba.njit(product)
    sig = (_array("u1", 2, True), numba.int64, _array("i1", 2), _array("f4", 2), _array("i4", 2), numba.int64,
           numba.typeof(ISA_ARG[isa]), _array("f4", 1))
    kernel.compile(sig)
    return kernel.inspect_asm(sig)


def per_tile_block(asm: str, k_type: bool) -> tuple[int, dict]:
    """Instructions of the block loop (a K kernel's inner loop counted GROUP_PAIRS times), and of
    each COUNTED one among them."""
    code, labels = [], {}
    for line in asm.splitlines():
        line = re.sub(r"^\{vex\}\s*", "", line.strip())
        if re.match(r"^[.\w$]+:", line):
            labels[line.split(":")[0]] = len(code)
        elif line and not line.startswith((".", "#")):
            code.append(line)
    loops = []
    for i, line in enumerate(code):
        jump = re.match(r"^j\w+\s+(\S+)", line)
        if jump and labels.get(jump.group(1), i + 1) <= i:
            loops.append((labels[jump.group(1)], i + 1))
    inner = min((lp for lp in loops if any(re.match(r"vpmaddubsw|vpdpbusd", x) for x in code[slice(*lp)])),
                key=lambda lp: lp[1] - lp[0])
    outers = [lp for lp in loops if lp != inner and lp[0] <= inner[0] and inner[1] <= lp[1]]
    trips = {inner: GROUP_PAIRS if k_type and outers else 1}   # LLVM may unroll the groups' loop whole
    if k_type and outers:
        trips[min(outers, key=lambda lp: lp[1] - lp[0])] = 1
    total, counts = 0, dict.fromkeys(COUNTED, 0)
    for i, line in enumerate(code):
        n = max((t for lp, t in trips.items() if lp[0] <= i < lp[1]), default=0)
        total += n
        op = line.split()[0]
        if op in counts:
            counts[op] += n
    return total, counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("isa", choices=list(ISA_ARG))
    ap.add_argument("names", nargs="+")
    args = ap.parse_args()
    for name in args.names:
        total, counts = per_tile_block(kernel_asm(name, args.isa), name in K_TILED)
        print(f"{args.isa} {name}: {total} instructions per tile-block,",
              ", ".join(f"{op} {n}" for op, n in counts.items()))


if __name__ == "__main__":
    main()
