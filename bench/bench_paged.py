"""Decode through the paged KV cache against slots of n_ctx positions, and the KV memory of many slots.

Speed: for each number of rows R, R prompts of PP random tokens are prefilled and TG tokens decoded
for all R rows at once, once with today's contiguous slots (Model.new_cache(R, n_ctx)) and once with
a paged pool whose block tables are laid out as the batch engine hands blocks out (each prompt's
blocks in turn, then one block per row, interleaved, as the rows cross a block boundary together).
The two alternate REPEATS times; the best of each and the median of the pairs' ratios are reported. Memory: what -np N slots of -c n_ctx
cost the memory guard and the cache before (N x n_ctx) and after (the blocks that rows of short
prompts take), for this model's KV cache.

    python bench/bench_paged.py [-m smollm2-135m] [--rows 1,16] [-c 512] [--pp 64] [--tg 64]
"""

import argparse
import time

import numpy as np

from llogos_cli.engine.decode_graph import decode_step
from llogos_cli.engine.prefix_cache import BLOCK_SIZE
from llogos_cli.model import memory
from llogos_cli.model.batch import Batch
from llogos_cli.model.loader import load

MiB = 1 << 20


def engine_tables(n_rows: int, n_ctx: int, pp: int, tg: int) -> np.ndarray:
    """Block tables as the engine's block manager fills them: prompts first, then growth interleaved."""
    tables = np.zeros((n_rows + 1, -(-n_ctx // BLOCK_SIZE)), np.int32)
    n_prompt = -(-pp // BLOCK_SIZE)
    tables[:n_rows, :n_prompt] = np.arange(n_rows * n_prompt).reshape(n_rows, n_prompt)
    next_block = n_rows * n_prompt
    for j in range(n_prompt, -(-(pp + tg) // BLOCK_SIZE)):
        tables[:n_rows, j] = np.arange(next_block, next_block + n_rows)
        next_block += n_rows
    return tables


def decode_tok_s(model, n_rows: int, n_ctx: int, pp: int, tg: int, paged: bool, rng) -> float:
    if paged:
        cache = model.new_cache(n_rows, n_ctx, n_blocks=n_rows * -(-(pp + tg) // BLOCK_SIZE), block_size=BLOCK_SIZE)
        cache.block_tables[:] = engine_tables(n_rows, n_ctx, pp, tg)
    else:
        cache = model.new_cache(n_rows, n_ctx)
    prompts = rng.integers(0, model.cfg.n_vocab, (n_rows, pp)).astype(np.int32)
    batch = Batch.join([Batch.run(prompts[r], r, 0, [pp - 1]) for r in range(n_rows)])
    tokens = model.backend.argmax_rows(model.forward(cache, batch)).astype(np.int32)
    decode = decode_step(model, cache)
    slots = np.arange(n_rows, dtype=np.int32)
    t0 = time.perf_counter()
    for i in range(tg):
        tokens = model.backend.argmax_rows(decode(tokens, slots, np.full(n_rows, pp + i, np.int32))).astype(np.int32)
    return n_rows * tg / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("--pp", type=int, default=64)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slots", type=int, default=64, help="-np for the memory figures")
    ap.add_argument("--memory-ctx", type=int, default=4096, help="-c for the memory figures")
    ap.add_argument("--short", type=int, default=200, help="tokens per row (prompt + reply) for the memory figures")
    args = ap.parse_args()

    m = load(args.model, "cpu", "auto", args.ctx_size, n_slots=max(map(int, args.rows.split(","))))
    model, rng = m.model, np.random.default_rng(0)
    for n_rows in map(int, args.rows.split(",")):
        best, ratios = {"slots": 0.0, "paged": 0.0}, []
        for _ in range(args.repeats):   # pairs run back to back: their ratio drifts less with the load
            pair = {kind: decode_tok_s(model, n_rows, args.ctx_size, args.pp, args.tg, kind == "paged", rng)
                    for kind in best}
            ratios.append(pair["paged"] / pair["slots"])
            best = {kind: max(best[kind], pair[kind]) for kind in best}
        print(f"rows {n_rows:3d}  decode tok/s (best of {args.repeats})  slots {best['slots']:8.1f}  "
              f"paged {best['paged']:8.1f}  paged/slots: best {best['paged'] / best['slots']:.3f}, "
              f"median of pairs {float(np.median(ratios)):.3f}")

    per_position = memory.kv_bytes_per_position(model.cfg, "cpu", "f32", "f32")
    before = args.slots * args.memory_ctx * per_position
    used = args.slots * -(-args.short // BLOCK_SIZE) * BLOCK_SIZE * per_position
    guard = args.memory_ctx * per_position
    print(f"-np {args.slots} -c {args.memory_ctx}, rows of {args.short} tokens, f32 KV: slots reserve "
          f"{before / MiB:.0f} MiB (the guard's need before); the pool's rows take {used / MiB:.1f} MiB; "
          f"the guard now needs {guard / MiB:.0f} MiB (one context)")


if __name__ == "__main__":
    main()
