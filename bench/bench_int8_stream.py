"""CPU time of the one-token integer products (cpu_quant_int8 through QuantMatmul) per MB of
weights, one thread: a set of matrices of one type walked in turn (--mb of them: over the
last-level cache streams from memory, under it from cache) and one matrix called again and again
(in L2). CPU time (time.process_time), so that a busy machine's other processes count less.

    PYTHONPATH=. python bench/bench_int8_stream.py q4_1:1536x576 q4_k:8192x2048 q6_k:2048x8192 --mb 64
"""

import argparse
import time

import numpy as np
from gguf import GGMLQuantizationType as Q

from llogos_cli.backends.cpu.cpu_quant import QuantMatmul
from synthetic import RandomBytes, random_matrix  # beside this script


def cpu_ms_per_mb(mm, x, mats, qtype, reps: int) -> float:
    """Least CPU time of reps walks over mats, in ms per MB of their packed bytes."""
    routes = [mm.route([(m, qtype)]) for m in mats]
    nbytes = sum(m.nbytes for m in mats)
    best = float("inf")
    for _ in range(reps):
        t0 = time.process_time()
        for r in routes:
            mm.run(x, r)
        best = min(best, time.process_time() - t0)
    return best * 1e3 / (nbytes / 1e6)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+", help="type:rowsxcols")
    ap.add_argument("--mb", type=float, default=64.0, help="MB of weights walked in turn")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--isa", default=None)
    args = ap.parse_args()
    mm = QuantMatmul(args.isa)
    mm.threads = 1
    src = RandomBytes()
    print(f"isa {mm.isa}; CPU ms per MB of packed weights, one thread, least of {args.reps}")
    for spec in args.specs:
        name, shape = spec.split(":")
        rows, cols = (int(v) for v in shape.split("x"))
        qtype = Q[name.upper()]
        one = mm.pack(random_matrix(src, qtype, rows, cols), qtype)
        n = max(1, int(args.mb * 1e6 / one.nbytes))
        mats = [one] + [mm.pack(random_matrix(src, qtype, rows, cols), qtype) for _ in range(n - 1)]
        x = np.random.default_rng(0).standard_normal((1, cols), dtype=np.float32)
        mm.run(x, mm.route([(one, qtype)]))   # compiles
        hot = cpu_ms_per_mb(mm, x, [one] * n, qtype, args.reps)
        walk = cpu_ms_per_mb(mm, x, mats, qtype, args.reps)
        print(f"{spec}: {one.nbytes / 1e6:.2f} MB a matrix, {n} walked ({n * one.nbytes / 1e6:.0f} MB): "
              f"walked {walk:.3f}, one matrix again {hot:.3f} ms/MB ({1 / walk:.1f}, {1 / hot:.1f} GB/s)")


if __name__ == "__main__":
    main()
