"""Long contexts on the CUDA backend beside llama.cpp (issue 44): prefill of an 8192-token prompt
and decode at depth 8192, as `llama-bench -p 8192 -n 0 -fa 1` and `llama-bench -p 0 -n 32 -d 8192
-fa 1` measure them, on the synthetic GGUFs of bench/synthetic.py.

    python bench/bench_longctx.py [--models llama-1b,llama-8b] [--llama-cpp] [--dir DIR] [--json FILE]
                                  [--depth N] [--prefill-only]

The prompt goes in chunks of bench_cuda.PREFILL_BATCH tokens (llama.cpp's -b 2048); decode steps
replay the engine's CUDA graph, one token id to the host a step. Decode runs twice on the same
machine: with its attention split along the keys (cuda_attention.split_chunks chunks a query, the
default at this depth) and, captured again, unsplit (one block per query and head), the baseline.
Prefill runs twice too: with prompt attention in the flash kernel (attention_flash.cu, the
default from cuda_attention.FLASH_MIN_TOKENS queries on) and in the GEMM path (GEMMs around
softmax_lengths), the baseline. --depth 512 --prefill-only times a 512-token prompt alone
(llama-bench -p 512 -n 0 -fa 1 beside it).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import llama_cpp  # beside this script, as synthetic
import numpy as np
from bench_cuda import PREFILL_BATCH
from synthetic import SPECS, model_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llogos_cli.engine.decode_graph import decode_step  # noqa: E402
from llogos_cli.gguf.file import GGUFFile  # noqa: E402
from llogos_cli.model.forward import Model  # noqa: E402

DEPTH = 8192      # prompt tokens, and the depth decode starts at
DECODE_TOKENS = 32


def bench_model(path: Path, n_vocab: int, depth: int = DEPTH, prefill_only: bool = False) -> dict:
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend

    from llogos_cli.backends.cuda import cuda_attention

    backend = CudaBackend()
    model = Model(GGUFFile(path), backend)
    ids = np.random.default_rng(0).integers(2, n_vocab, depth + DECODE_TOKENS + 1).astype(np.int32)

    def prefill():
        ctx = model.new_context(depth + DECODE_TOKENS + 16, "f16", "f16")
        backend.synchronize()
        t0 = time.perf_counter()
        for start in range(0, depth, PREFILL_BATCH):
            logits = model.forward_seq(ctx, ids[start:start + PREFILL_BATCH])
        token = int(backend.argmax_rows(logits)[0])
        return time.perf_counter() - t0, ctx, token

    def timed_prefill():
        prefill()   # compile kernels, initialize cuBLAS
        return min((prefill() for _ in range(2)), key=lambda run: run[0])

    first, cuda_attention.FLASH_MIN_TOKENS = cuda_attention.FLASH_MIN_TOKENS, depth + 1   # the GEMM path
    try:
        gemm_seconds = timed_prefill()[0]
    finally:
        cuda_attention.FLASH_MIN_TOKENS = first
    seconds, ctx, token = timed_prefill()
    prefill_figures = {"prefill_tok_s": depth / seconds, "prefill_gemm_tok_s": depth / gemm_seconds}
    if prefill_only:
        return prefill_figures
    step, slot = decode_step(model, ctx.cache), np.zeros(1, np.int32)

    def one(token: int) -> int:
        logits = step(np.array([token], np.int32), slot, np.array([ctx.n_past], np.int32))
        ctx.n_past += 1
        return int(backend.argmax_rows(logits)[0])

    def decode(token: int) -> tuple[float, int]:
        token = one(token)   # capture
        t0 = time.perf_counter()
        for _ in range(DECODE_TOKENS):
            token = one(token)
        return DECODE_TOKENS / (time.perf_counter() - t0), token

    chunks = cuda_attention.split_chunks(next(kv for kv in ctx.cache.kv if kv is not None), 1, model.cfg.n_head)
    split_tok_s, token = decode(token)
    blocks, cuda_attention.SPLIT_BLOCKS = cuda_attention.SPLIT_BLOCKS, 0   # split_chunks: 1, never split
    try:
        step = decode_step(model, ctx.cache)
        unsplit_tok_s, _ = decode(token)
    finally:
        cuda_attention.SPLIT_BLOCKS = blocks
    return {**prefill_figures, "decode_tok_s": split_tok_s, "split_chunks": chunks,
            "decode_unsplit_tok_s": unsplit_tok_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama-1b,llama-8b")
    parser.add_argument("--llama-cpp", action="store_true", help="also run llama-bench from PATH")
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "llogos-bench")
    parser.add_argument("--json", type=Path, help="write the figures here, after every model")
    parser.add_argument("--depth", type=int, default=DEPTH, help="prompt tokens, and the depth decode starts at")
    parser.add_argument("--prefill-only", action="store_true", help="time the prompt alone, no decode")
    args = parser.parse_args()
    from llogos_cli.backends import cuda_available
    if not cuda_available():
        sys.exit("bench_longctx needs CuPy and a CUDA GPU")
    if args.llama_cpp and not llama_cpp.available():
        sys.exit("--llama-cpp: llama-bench is not on PATH (source llama-env.sh)")
    args.dir.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.models.split(","):
        spec = SPECS[name]
        path = model_file(spec, args.dir)
        reference = None
        if args.llama_cpp:
            reference = (llama_cpp.prompt(path, args.depth) if args.prefill_only
                         else llama_cpp.long_context(path, args.depth, DECODE_TOKENS))
        results.append({"model": name, "depth": args.depth, **bench_model(path, spec.n_vocab, args.depth,
                                                                          args.prefill_only), "llama_cpp": reference})
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    print(f"| model | prefill {args.depth} tok/s (llama.cpp) | GEMM attention | decode at {args.depth} tok/s "
          "(llama.cpp) | unsplit | chunks |\n|---|---|---|---|---|---|")
    for r in results:
        ref = r["llama_cpp"] or {}
        decode = (f"{r['decode_tok_s']:.1f} ({ref.get('decode_tok_s', 0):.1f}) | {r['decode_unsplit_tok_s']:.1f} | "
                  f"{r['split_chunks']}" if "decode_tok_s" in r else "- | - | -")
        print(f"| {r['model']} | {r['prefill_tok_s']:.0f} ({ref.get('prefill_tok_s', 0):.0f}) | "
              f"{r['prefill_gemm_tok_s']:.0f} | {decode} |")


if __name__ == "__main__":
    main()
