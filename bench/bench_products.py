"""Float32 products of a few rows, OpenBLAS against backends/cpu/cpu_rows, on one decode step's shapes.

    PYTHONPATH=. python bench/bench_products.py [--rows 1,4,16,32,64] [--reps 10]

The matrices are SmolLM2-135M's (30 layers of q, k, v, o, gate, up, down, then the 49152 x 576 LM
head), random float32, 540 MB in all: more than the last-level cache of the development machine,
so each step streams them from memory as a decode step does. For each row count: the best of
--reps steps, layers and LM head apart, for OpenBLAS (`(W·xᵀ)ᵀ`, its faster operand order at these
sizes; a GEMV at one row) and for cpu_rows. Prints a Markdown table.
"""

import argparse
import platform
import time
from datetime import date

import numpy as np

from llogos_cli.backends.cpu.cpu_rows import MAX_ROWS, matmul_rows

N_LAYER, N_EMBD, N_FF, N_KV, N_VOCAB = 30, 576, 1536, 192, 49152
LAYER_SHAPES = ((N_EMBD, N_EMBD), (N_KV, N_EMBD), (N_KV, N_EMBD), (N_EMBD, N_EMBD),
                (N_FF, N_EMBD), (N_FF, N_EMBD), (N_EMBD, N_FF))


def blas(x, w):
    return x @ w.T if x.shape[0] == 1 else (w @ x.T).T


def best_step(product, layers, head, xs, reps: int) -> tuple[float, float]:
    """Best time of the layers' products and of the LM head over reps steps, in ms."""
    best_layers = best_head = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for w in layers:
            product(xs[w.shape[1]], w)
        t1 = time.perf_counter()
        product(xs[N_EMBD], head)
        t2 = time.perf_counter()
        best_layers, best_head = min(best_layers, t1 - t0), min(best_head, t2 - t1)
    return best_layers * 1e3, best_head * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,4,16,32,64")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    layers = [rng.standard_normal(shape, dtype=np.float32) for _ in range(N_LAYER) for shape in LAYER_SHAPES]
    head = rng.standard_normal((N_VOCAB, N_EMBD), dtype=np.float32)
    print(f"{date.today()}, {platform.processor() or platform.machine()}; ms per decode step, best of {args.reps}\n")
    print("| rows | OpenBLAS layers | OpenBLAS LM head | cpu_rows layers | cpu_rows LM head | step ratio |")
    print("|---|---|---|---|---|---|")
    for n in (int(r) for r in args.rows.split(",")):
        assert 1 <= n <= MAX_ROWS, f"rows must be 1..{MAX_ROWS}"
        xs = {k: rng.standard_normal((n, k), dtype=np.float32) for k in (N_EMBD, N_FF)}
        matmul_rows(xs[N_EMBD], layers[0])   # compiles, or loads from numba's cache
        b = best_step(blas, layers, head, xs, args.reps)
        c = best_step(matmul_rows, layers, head, xs, args.reps)
        print(f"| {n} | {b[0]:.1f} | {b[1]:.1f} | {c[0]:.1f} | {c[1]:.1f} | {sum(b) / sum(c):.2f}× |")


if __name__ == "__main__":
    main()
