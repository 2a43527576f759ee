"""CPU time per decode token on the CPU backend, whole and by backend op: a figure that holds on a
busy machine at one thread, where no thread waits for another (docs/PERF.md, fourteenth session).

    PYTHONPATH=. python bench/profile_token.py MODEL [--threads 1] [--tokens 48] [--ops] [--rest]

MODEL is a models.toml name or a .gguf path, loaded with --cpu-weights quantized. Three batches of
--tokens decode steps after a 17-token prompt, each batch's CPU ms and wall ms a token; with --ops,
one more batch with a timer around each backend op the forward pass calls (calls, wall and CPU a
token; matmul holds matmul_add's products, whose residual add is in no op's figure, and matmuls the
joined q/k/v and gate/up). With --rest, three more batches with the integer products' kernels
replaced by a fill of their outputs: CPU ms a token of all the rest, the part of a token that runs
on one thread however many the products share (the fill costs a little: the LM head's is a
vocabulary's floats).
"""

import argparse
import collections
import time

import llogos_cli  # noqa: F401  (before NumPy: llogos' thread settings)
import numpy as np

from llogos_cli.backends.cpu import cpu_quant_int8
from llogos_cli.model.loader import load

OPS = ("embed", "matmul", "matmuls", "rmsnorm", "rope_kv_store", "kv_store", "attention", "glu", "add",
       "batch_layout")
PROMPT = np.arange(3, 20, dtype=np.int32)
TOKEN = np.array([5], np.int32)


def started(model, n: int):
    """A fresh context of room for n more decode steps, the prompt and a first step run."""
    ctx = model.new_context(len(PROMPT) + n + 2)
    model.forward_seq(ctx, PROMPT)
    model.forward_seq(ctx, TOKEN)
    return ctx


def decode(model, ctx, n: int) -> tuple[float, float]:
    """CPU and wall ms a token over n decode steps."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        model.forward_seq(ctx, TOKEN)
    return (time.process_time() - cpu) / n * 1e3, (time.perf_counter() - wall) / n * 1e3


def timed_ops(model, n: int) -> dict:
    """{op: [calls, wall s, CPU s]} over n decode steps, each backend op wrapped in timers."""
    backend, stats = model.backend, collections.defaultdict(lambda: [0, 0.0, 0.0])

    def timed(name, op):
        def call(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.process_time()
            out = op(*args, **kwargs)
            entry = stats[name]
            entry[0] += 1
            entry[1] += time.perf_counter() - wall
            entry[2] += time.process_time() - cpu
            return out
        return call

    ctx = started(model, n)
    for name in OPS:
        setattr(backend, name, timed(name, getattr(backend, name)))
    try:
        decode(model, ctx, n)
    finally:
        for name in OPS:
            delattr(backend, name)
    return stats


def without_products(model, n: int) -> list[float]:
    """CPU ms a token over three batches of n decode steps, the integer products' kernels (one
    matrix's and several's) replaced by a fill of their outputs with a small normal float (not
    left as they come, which could hold NaN or subnormals that slow the steps after them)."""
    def one(raw, code, x, xq, dx, xs, out, *rest):
        out.fill(0.01)

    def several(raws, codes, firsts, x, xq, dx, xs, outs, *rest):
        for out in outs:
            out.fill(0.01)

    kept = cpu_quant_int8.matvec8_one, cpu_quant_int8.matvec8
    cpu_quant_int8.matvec8_one, cpu_quant_int8.matvec8 = one, several
    try:
        return [decode(model, started(model, n), n)[0] for _ in range(3)]
    finally:
        cpu_quant_int8.matvec8_one, cpu_quant_int8.matvec8 = kept


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--ops", action="store_true")
    parser.add_argument("--rest", action="store_true")
    args = parser.parse_args()
    model = load(args.model, "cpu", "quantized", n_ctx=len(PROMPT) + args.tokens + 8,
                 threads=(args.threads, args.threads)).model
    runs = [decode(model, started(model, args.tokens), args.tokens) for _ in range(3)]
    print(f"-t {args.threads}: CPU ms / token {' '.join(f'{c:.2f}' for c, _ in runs)}; "
          f"wall ms / token {' '.join(f'{w:.2f}' for _, w in runs)}")
    if args.ops:
        for name, (calls, wall, cpu) in sorted(timed_ops(model, args.tokens).items(), key=lambda kv: -kv[1][2]):
            n = args.tokens
            print(f"  {name:14s} {calls / n:6.1f} calls  wall {wall / n * 1e3:7.3f} ms  CPU {cpu / n * 1e3:7.3f} ms a token")
    if args.rest:
        print(f"-t {args.threads}: CPU ms / token but the integer products' kernels "
              f"{' '.join(f'{c:.2f}' for c in without_products(model, args.tokens))}")


if __name__ == "__main__":
    main()
