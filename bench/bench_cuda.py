"""CUDA benchmark on synthetic models with the shapes and tensor types of real ones.

    python bench/bench_cuda.py [--models smollm2-135m,llama-1b,llama-8b] [--batch-sizes 1,4,16,64]
                               [--llama-cpp] [--dir DIR] [--json FILE]

Each model is written once as a GGUF of random weights (under --dir), loaded on the GPU, and
measured: decode tok/s of one sequence (eager, and replayed from a CUDA graph), prefill tok/s of a
512-token prompt, time to first token, the bandwidth decode achieves (weight bytes read per token
/ time per token) against the card's device-to-device copy bandwidth, per-kernel GPU times of one
decode step and one prefill, and batched decoding as llama-batched-bench runs it: B sequences of
128 prompt tokens each, then 128 steps of B rows (aggregate tok/s). With --llama-cpp, llama-bench
and llama-batched-bench (on PATH) run on the same files. Prints Markdown tables for docs/PERF.md.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import llama_cpp  # beside this script, as synthetic
import numpy as np
from synthetic import SPECS, Spec, model_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llogos_cli.gguf.file import GGUFFile  # noqa: E402
from llogos_cli.model.forward import Batch, Model  # noqa: E402

PROMPT_TOKENS = 512
DECODE_TOKENS = 128
BATCH_PROMPT, BATCH_DECODE = 128, 128  # per sequence, as llama-batched-bench -npp 128 -ntg 128
PREFILL_BATCH = 2048                    # prompt tokens per forward pass, as llama.cpp's -b 2048


# ------------------------------------------------------------------ measuring
def copy_bandwidth(cupy) -> float:
    """GB/s of a 1 GiB device-to-device copy (bytes read + written): decode's ceiling."""
    n = 1 << 30
    a, b = cupy.ones(n, np.uint8), cupy.empty(n, np.uint8)
    b.data.copy_from_device(a.data, n)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(10):
        b.data.copy_from_device(a.data, n)
    end.record()
    end.synchronize()
    return 2 * n * 10 / (cupy.cuda.get_elapsed_time(start, end) / 1e3) / 1e9


class KernelTimes:
    """GPU time per kernel name over the launches made inside `with`, from CUDA events."""

    def __init__(self, backend):
        self.k, self.records = backend.k, []

    def __enter__(self):
        import cupy
        self._function, self._gemm = self.k.function, self.k.gemm_f16

        def timed(name, launch):
            def run(*args, **kwargs):
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                start.record()
                launch(*args, **kwargs)
                end.record()
                self.records.append((name, start, end))
            return run

        self.k.function = lambda module, name: timed(name, self._function(module, name))
        self.k.gemm_f16 = timed("gemm_f16 (cuBLAS)", self._gemm)
        return self

    def __exit__(self, *exc):
        del self.k.function, self.k.gemm_f16  # back to the class's methods
        import cupy
        cupy.cuda.get_current_stream().synchronize()

    def table(self, total_ms: float) -> list[tuple[str, int, float]]:
        import cupy
        ms, count = defaultdict(float), defaultdict(int)
        for name, start, end in self.records:
            ms[name] += cupy.cuda.get_elapsed_time(start, end)
            count[name] += 1
        rows = sorted(((n, count[n], ms[n]) for n in ms), key=lambda r: -r[2])
        # Wall time not inside a timed kernel: CuPy's own ops, launch overhead (timing adds some).
        return rows + [("(rest of the wall time)", 0, total_ms - sum(ms.values()))]


def bench_model(spec: Spec, path: Path, bandwidth: float, batch_sizes: list[int]) -> dict:
    import cupy

    from llogos_cli.backends.cuda_backend import CudaBackend

    b = CudaBackend()
    t = time.perf_counter()
    model = Model(GGUFFile(path), b)
    b.synchronize()
    load_s = time.perf_counter() - t
    ids = np.random.default_rng(0).integers(2, spec.n_vocab, PROMPT_TOKENS + DECODE_TOKENS).astype(np.int32)
    n_ctx = PROMPT_TOKENS + DECODE_TOKENS + 16

    def prefill():
        ctx = model.new_context(n_ctx, "f16", "f16")
        b.synchronize()
        t0 = time.perf_counter()
        logits = model.forward_seq(ctx, ids[:PROMPT_TOKENS])
        b.synchronize()
        t1 = time.perf_counter()
        b.argmax_rows(logits)
        return t1 - t0, time.perf_counter() - t0

    def decode(graph: bool):
        ctx = model.new_context(n_ctx, "f16", "f16")
        token = int(b.argmax_rows(model.forward_seq(ctx, ids[:16]))[0])
        step, slot = b.decoder(model, ctx.cache), np.zeros(1, np.int32)

        def one(token: int) -> int:  # one id to the host per token, as generation does
            if graph:
                logits = step(np.array([token], np.int32), slot, np.array([ctx.n_past], np.int32))
                ctx.n_past += 1
            else:
                logits = model.forward_seq(ctx, np.array([token], np.int32))
            return int(b.argmax_rows(logits)[0])

        token = one(token)  # first step: capture, warm caches
        t0 = time.perf_counter()
        for _ in range(DECODE_TOKENS):
            token = one(token)
        return DECODE_TOKENS / (time.perf_counter() - t0)

    prefill()  # compile kernels, initialize cuBLAS
    prefill_s, ttft_s = min(prefill() for _ in range(3))
    eager, graphed = decode(False), decode(True)
    best = max(eager, graphed)

    ctx = model.new_context(n_ctx, "f16", "f16")
    model.forward_seq(ctx, ids[:16])
    b.synchronize()
    with KernelTimes(b) as decode_kernels:
        t0 = time.perf_counter()
        model.forward_seq(ctx, ids[16:17])
        b.synchronize()
        decode_ms = (time.perf_counter() - t0) * 1e3
    with KernelTimes(b) as prefill_kernels:
        timed_prefill_s, _ = prefill()
    return {
        "model": spec.name, "weights_GB": model.weight_bytes / 1e9, "load_s": load_s,
        "prefill_tok_s": PROMPT_TOKENS / prefill_s, "ttft_ms": ttft_s * 1e3,
        "decode_tok_s_eager": eager, "decode_tok_s_graph": graphed,
        "decode_GB_s": model.weight_bytes * best / 1e9, "decode_bandwidth_share": model.weight_bytes * best / 1e9 / bandwidth,
        "decode_kernels": decode_kernels.table(decode_ms),
        "prefill_kernels": prefill_kernels.table(timed_prefill_s * 1e3),
        "batched": [bench_batched(model, n) for n in batch_sizes],
        "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
    }


def bench_batched(model: Model, n: int) -> dict:
    """n sequences of BATCH_PROMPT tokens each, prefilled in batches of whole prompts up to
    PREFILL_BATCH tokens, then BATCH_DECODE greedy steps of n rows from the decoder's CUDA graphs;
    aggregate tok/s of each phase (llama-batched-bench's S_PP and S_TG)."""
    b = model.b
    rng = np.random.default_rng(n)
    cache = model.new_cache(n, BATCH_PROMPT + BATCH_DECODE + 1, "f16", "f16")
    prompts = [Batch.run(rng.integers(2, model.cfg.n_vocab, BATCH_PROMPT), s, 0, [BATCH_PROMPT - 1]) for s in range(n)]
    per_pass = max(1, PREFILL_BATCH // BATCH_PROMPT)
    step, slots = b.decoder(model, cache), np.arange(n, dtype=np.int32)
    # Capture this bucket before the clock starts (the prompts then overwrite position 0).
    step(np.zeros(n, np.int32), slots, np.zeros(n, np.int32))
    b.synchronize()
    t0 = time.perf_counter()
    tokens = np.concatenate([b.argmax_rows(model.forward(cache, Batch.join(prompts[i:i + per_pass])))
                             for i in range(0, n, per_pass)]).astype(np.int32)
    t1 = time.perf_counter()
    for i in range(BATCH_DECODE):
        tokens = b.argmax_rows(step(tokens, slots, np.full(n, BATCH_PROMPT + i, np.int32))).astype(np.int32)
    t2 = time.perf_counter()
    return {"B": n, "prefill_tok_s": n * BATCH_PROMPT / (t1 - t0), "decode_tok_s": n * BATCH_DECODE / (t2 - t1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(SPECS))
    parser.add_argument("--batch-sizes", default="1,4,16,64", help="sequences decoded at once (batched figures)")
    parser.add_argument("--llama-cpp", action="store_true", help="also run llama-bench and llama-batched-bench from PATH")
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "llogos-bench")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    batch_sizes = [int(n) for n in args.batch_sizes.split(",") if n]
    from llogos_cli.backends import cuda_available
    if not cuda_available():
        sys.exit("bench_cuda needs CuPy and a CUDA GPU")
    import cupy

    if args.llama_cpp and not llama_cpp.available():
        sys.exit("--llama-cpp: llama-bench and llama-batched-bench are not on PATH (source llama-env.sh)")
    args.dir.mkdir(parents=True, exist_ok=True)
    bandwidth = copy_bandwidth(cupy)
    results = []
    for name in args.models.split(","):
        path = model_file(SPECS[name], args.dir)
        reference = None
        if args.llama_cpp:  # first, while llogos holds no GPU memory
            try:
                reference = {"single": llama_cpp.single(path, PROMPT_TOKENS, DECODE_TOKENS),
                             "batched": llama_cpp.batched(path, BATCH_PROMPT, BATCH_DECODE, batch_sizes)}
            except (OSError, RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
                print(f"llama.cpp on {name}: {e}", file=sys.stderr)  # llogos' own figures still count
        results.append({**bench_model(SPECS[name], path, bandwidth, batch_sizes), "llama_cpp": reference})
        cupy.get_default_memory_pool().free_all_blocks()
        if args.json:  # after every model, so that a run cut short keeps what it measured
            args.json.write_text(json.dumps(results, indent=1))
    report(results, bandwidth)


def report(results: list[dict], bandwidth: float) -> None:
    def num(value) -> str:
        return "-" if value is None else f"{value:.0f}"

    print(f"device: {results[0]['device']}, device-to-device copy: {bandwidth:.0f} GB/s\n")
    print("| model | weights GB | prefill 512 tok/s (llama.cpp) | TTFT ms | decode tok/s eager / graph (llama.cpp) "
          "| decode GB/s | of copy BW |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        theirs = (r["llama_cpp"] or {}).get("single", {})
        print(f"| {r['model']} | {r['weights_GB']:.2f} | {r['prefill_tok_s']:.0f} ({num(theirs.get('prefill_tok_s'))}) "
              f"| {r['ttft_ms']:.1f} | {r['decode_tok_s_eager']:.0f} / {r['decode_tok_s_graph']:.0f} "
              f"({num(theirs.get('decode_tok_s'))}) | {r['decode_GB_s']:.0f} | {100 * r['decode_bandwidth_share']:.0f}% |")
    print(f"\nBatched: B sequences of {BATCH_PROMPT} prompt tokens, then {BATCH_DECODE} steps of B rows; "
          "aggregate tok/s, llama-batched-bench's in brackets.\n")
    print("| model | B | prefill tok/s | decode tok/s |\n|---|---|---|---|")
    for r in results:
        theirs = {row["B"]: row for row in (r["llama_cpp"] or {}).get("batched", [])}
        for row in r["batched"]:
            other = theirs.get(row["B"], {})
            print(f"| {r['model']} | {row['B']} | {row['prefill_tok_s']:.0f} ({num(other.get('prefill_tok_s'))}) "
                  f"| {row['decode_tok_s']:.0f} ({num(other.get('decode_tok_s'))}) |")
    print("\nTargets on an H100: llama-8b decode at >= 50% of the copy bandwidth and prefill >= 3,000 tok/s; "
          "smollm2-135m decode >= 500 tok/s.")
    for r in results:
        for phase in ("decode", "prefill"):
            print(f"\n{r['model']}, {phase} kernels:\n\n| kernel | launches | ms |\n|---|---|---|")
            for name, count, ms in r[f"{phase}_kernels"][:15]:
                print(f"| {name} | {count} | {ms:.3f} |")


if __name__ == "__main__":
    main()
