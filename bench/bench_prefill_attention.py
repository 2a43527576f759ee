"""One layer's attention over a whole prompt, step by step as the engine runs it: the compiled
(token, head) loop (cpu_attention) beside the tiles (cpu_prefill_attention), in CPU seconds of this
process (both threads), which a busy machine moves less than wall time.

    PYTHONPATH=. .venv/bin/python bench/bench_prefill_attention.py --heads 9 --kv-heads 3 --n 4096
"""

import argparse
import time

import numpy as np

from llogos_cli.backends.cpu.cpu_attention import attend_rows
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=9, help="query heads (SmolLM2: 9; Llama 3.2 1B: 32)")
    parser.add_argument("--kv-heads", type=int, default=3, help="KV heads (SmolLM2: 3; Llama 3.2 1B: 8)")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--n", type=int, default=4096, help="prompt tokens")
    parser.add_argument("--step", type=int, default=512, help="tokens of one engine step (-ub)")
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

    def tiles():
        for layout in steps:
            backend.attention(q[layout.pos], cache, layout, d ** -0.5, 0)

    def rows():
        for layout in steps:
            out = np.empty((len(layout.pos), H, d), np.float32)
            attend_rows(q[layout.pos], cache.k, cache.v, layout.blocks(cache), layout.pos, d ** -0.5, 0, 0.0,
                        np.empty(0, np.float32), out)

    tiles(), rows()   # compiled or loaded from the cache before timing
    best = {}
    for _ in range(args.rounds):
        for name, run in (("rows", rows), ("tiles", tiles)):
            start = time.process_time()
            run()
            best[name] = min(best.get(name, np.inf), time.process_time() - start)
    print(f"H {H} n_kv {n_kv} d {d}, {n} tokens in steps of {args.step}: (token, head) loop {best['rows']:.2f} CPU-s, "
          f"tiles {best['tiles']:.2f} CPU-s, {best['rows'] / best['tiles']:.2f}x")


if __name__ == "__main__":
    main()
