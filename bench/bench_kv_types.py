"""CPU time per decode token with each KV cache type (-ctk/-ctv) at several depths, beside f32: what
the compiled attention's reading of f16, q8_0 and the 4-bit rows costs (docs/PERF.md, kvattn).

    PYTHONPATH=. python bench/bench_kv_types.py MODEL [--threads 1] [--tokens 24] [--depths 16,1536,4096]
    PYTHONPATH=. python bench/bench_kv_types.py MODEL --peak-rss 8192 [--types f32,f16]

MODEL is a models.toml name or a .gguf path, loaded with --cpu-weights quantized. The cache is
filled to each depth with random rows through the backend's own store (attention's cost depends on
how many positions it reads, not on what they hold, and a prompt of thousands of tokens would take
most of the run), then --tokens decode steps of each type are timed in turn, --rounds times; the
least CPU ms a token is printed, at one thread by default, where no thread waits for another and CPU time holds on a busy
machine.

--peak-rss CTX instead loads the model at -c CTX once for each type, in a process of its own,
fills the whole context the same way and decodes a token: the peak resident memory of each (the
CPU's cache pages are touched only as positions fill, so an emptier context would hide the cache).
"""

import argparse
import multiprocessing
import resource
import time

import llogos_cli  # noqa: F401  (before NumPy: llogos' thread settings)
import numpy as np

from llogos_cli.model.loader import load

TYPES = ("f32", "f16", "q8_0", "q4_0", "iq4_nl")
TOKEN = np.array([5], np.int32)


def filled(model, cache_type: str, depth: int, n: int):
    """A context of cache_type holding `depth` positions of random keys and values, room for n more."""
    ctx = model.new_context(depth + n + 2, cache_type, cache_type)
    backend, rng = model.backend, np.random.default_rng(0)
    layout = backend.batch_layout(np.zeros(depth, np.int32), np.arange(depth, dtype=np.int32))
    for kv in ctx.cache.kv:
        if kv is not None:
            n_kv = kv.k.shape[1]
            backend.kv_store(kv, rng.standard_normal((depth, n_kv, model.cfg.head_dim_k), dtype=np.float32),
                             rng.standard_normal((depth, n_kv, model.cfg.head_dim_v), dtype=np.float32), layout)
    ctx.n_past = depth
    model.forward_seq(ctx, TOKEN)   # compiles what this type needs, outside the timing
    return ctx


def cpu_ms(model, ctx, n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        model.forward_seq(ctx, TOKEN)
    return (time.process_time() - start) / n * 1e3


def peak_rss_mib(model_name: str, cache_type: str, n_ctx: int) -> float:
    """Peak resident MiB of this (fresh) process after a full context of cache_type."""
    model = load(model_name, "cpu", "quantized", n_ctx=n_ctx, cache_types=(cache_type, cache_type),
                 threads=(1, 1)).model
    filled(model, cache_type, n_ctx - 4, 2)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--depths", default="16,1536,4096")
    parser.add_argument("--types", default=",".join(TYPES), help="the first is the one the others are set beside")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peak-rss", type=int, metavar="CTX", help="peak RSS at a full -c CTX of each type instead")
    args = parser.parse_args()
    if args.peak_rss:
        with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
            for t in args.types.split(","):
                mib = pool.apply(peak_rss_mib, (args.model, t, args.peak_rss))
                print(f"| {t} | -c {args.peak_rss} full | {mib:.0f} MiB peak RSS |")
        return
    depths = [int(d) for d in args.depths.split(",")]
    model = load(args.model, "cpu", "quantized", n_ctx=max(depths) + args.tokens + 8,
                 threads=(args.threads, args.threads)).model
    print(f"-t {args.threads}, CPU ms a decode token (least of {args.rounds} x {args.tokens}); x {args.types.split(',')[0]}")
    print("| type | " + " | ".join(f"depth {d}" for d in depths) + " |")
    print("|---|" + "---|" * len(depths))
    rows = {t: [] for t in args.types.split(",")}
    for depth in depths:   # the types' steps taken in turn, so that a busy spell costs each alike
        contexts = {t: filled(model, t, depth, args.rounds * args.tokens) for t in rows}
        times = {t: [] for t in rows}
        for _ in range(args.rounds):
            for t in rows:
                times[t].append(cpu_ms(model, contexts[t], args.tokens))
        base = min(times[next(iter(rows))])
        for t in rows:
            rows[t].append(f"{min(times[t]):.2f} ({min(times[t]) / base:.2f}x)")
        del contexts
    for t, cells in rows.items():
        print(f"| {t} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
