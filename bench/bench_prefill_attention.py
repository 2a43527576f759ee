"""One layer's attention over a whole prompt, step by step as the engine runs it, in CPU seconds of
this process (both threads), which a busy machine moves less than wall time: cpu_attention's items
a (token, head) at a time, as decode rows go, beside tiles of prompt positions of a few sizes.

    PYTHONPATH=. .venv/bin/python bench/bench_prefill_attention.py --heads 9 --kv-heads 3 --n 4096
"""

import argparse
import time

import numpy as np

from llogos_cli.backends.cpu.cpu_attention import attend
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=9, help="query heads (SmolLM2: 9; Llama 3.2 1B: 32)")
    parser.add_argument("--kv-heads", type=int, default=3, help="KV heads (SmolLM2: 3; Llama 3.2 1B: 8)")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--n", type=int, default=4096, help="prompt tokens")
    parser.add_argument("--step", type=int, default=512, help="tokens of one engine step (-ub)")
    parser.add_argument("--tiles", default="16,32,64", help="tile sizes to time beside the (token, head) items")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    H, n_kv, d, n = args.heads, args.kv_heads, args.head_dim, args.n
    backend = NumpyBackend("f32", batched=True)
    rng = np.random.default_rng(0)
    cache = backend.kv_cache(1, n, n_kv, d, d, "f32", "f32")
    q = rng.standard_normal((n, H, d), dtype=np.float32)
    steps = [backend.batch_layout(np.zeros(min(args.step, n - a), np.int32), np.arange(a, min(a + args.step, n), dtype=np.int32))
             for a in range(0, n, args.step)]
    for layout in steps:
        backend.kv_store(cache, rng.standard_normal((len(layout.pos), n_kv, d), dtype=np.float32),
                         rng.standard_normal((len(layout.pos), n_kv, d), dtype=np.float32), layout)
    sizes = {"(token, head)": n + 1, **{f"tile {t}": int(t) for t in args.tiles.split(",")}}

    def run(tile: int) -> None:
        for layout in steps:
            out = np.empty((len(layout.pos), H, d), np.float32)
            attend(q[layout.pos], cache.k, cache.v, layout.blocks(cache), layout.pos, layout.items(tile, H, n_kv),
                   d ** -0.5, 0, 0.0, np.empty(0, np.float32), out)

    run(1)   # compiled or loaded from the cache before timing
    best = {}
    for _ in range(args.rounds):
        for name, tile in sizes.items():
            start = time.process_time()
            run(tile)
            best[name] = min(best.get(name, np.inf), time.process_time() - start)
    print(f"H {H} n_kv {n_kv} d {d}, {n} tokens in steps of {args.step}, CPU-s: "
          + ", ".join(f"{name} {s:.2f}" for name, s in best.items()))


if __name__ == "__main__":
    main()
