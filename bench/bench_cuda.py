"""CUDA benchmark on synthetic models with the shapes and tensor types of real ones.

    python bench/bench_cuda.py [--models smollm2-135m,llama-1b,llama-8b,qwen35-0.8b]
                               [--batch-sizes 1,4,16,64] [--llama-cpp] [--products] [--dir DIR] [--json FILE]

Each model is written once as a GGUF of random weights (under --dir), loaded on the GPU, and
measured: decode tok/s of one sequence (eager, and replayed from a CUDA graph), prefill tok/s of a
512-token prompt, time to first token of a 5-token prompt, the bandwidth decode achieves (weight
bytes read per token / time per token) against the card's device-to-device copy bandwidth, where
a decode step's time goes (per-kernel GPU times, graph replay, host), per-kernel GPU times of one
prefill, and batched decoding as llama-batched-bench runs it: B sequences of 128 prompt tokens
each, then 128 steps of B rows (aggregate tok/s). With --llama-cpp, llama-bench and
llama-batched-bench (on PATH) run on the same files. Prints Markdown tables for docs/PERF.md;
--json writes the record that is committed as bench/results/cuda-h100.json.
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import llama_cpp  # beside this script, as synthetic
import numpy as np
from gguf import GGMLQuantizationType as Q
from synthetic import SPECS, RandomBytes, Spec, model_file, random_matrix

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llogos_cli.engine.decode_graph import decode_step, prompt_rows  # noqa: E402
from llogos_cli.gguf.file import GGUFFile  # noqa: E402
from llogos_cli.model.batch import Batch  # noqa: E402
from llogos_cli.model.forward import Model  # noqa: E402

PROMPT_TOKENS = 512
DECODE_TOKENS = 128
TTFT_TOKENS = 5                         # time to first token is taken for a prompt this long
BATCH_PROMPT, BATCH_DECODE = 128, 128  # per sequence, as llama-batched-bench -npp 128 -ntg 128
EXPERT_KERNELS = ("moe_", "matvec_experts_")   # the mixture-of-experts kernels by name (router, products, sums)
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
        self.k, self.records = backend.kernels, []

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


# Llama-3.1-8B's ffn_up, attn_q/attn_output and attn_k/attn_v; Llama-3.2-1B's attn_q and attn_k.
PRODUCT_SHAPES = ((14336, 4096), (4096, 4096), (1024, 4096), (2048, 2048), (512, 2048))
L2_ROTATION_BYTES = 200e6  # copies of a matrix taken in turn cover this much: 4x the H100's L2


def bench_products(bandwidth: float, tokens: tuple[int, ...] = (1, 4, 8), shapes=PRODUCT_SHAPES,
                   reps: int = 40, backend=None, rotation_bytes: float = L2_ROTATION_BYTES) -> list[dict]:
    """The matrix-vector kernels alone, per weight type and shape: median GPU time of a launch over
    copies of the matrix in turn (so that the weights come from memory, not from the 50 MB L2), the
    weight bytes streamed per second, and that as a fraction of the copy bandwidth. 1 token is
    decode, timed with each number of rows a warp (1, 2; the launcher's choice is
    cuda_matmul.rows_per_warp) and, for cuda_matmul.INT8_TYPES, with 8-bit activations too; 4 and
    8 tokens a short batch, on the first shape only."""
    import cupy

    from llogos_cli.backends.cuda import cuda_matmul
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend

    b, src = backend or CudaBackend(), RandomBytes(1)
    out = []
    for qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.F16):
        for shape_index, (rows, cols) in enumerate(shapes):
            first = b.matrix(random_matrix(src, qtype, rows, cols), qtype, True)
            copies = [first] + [dataclasses.replace(first, raw=first.raw.copy())
                                for _ in range(max(3, int(rotation_bytes / first.raw.nbytes)))]
            int8 = qtype in cuda_matmul.INT8_TYPES
            # (tokens, rows a warp, activations): one token with float32 activations and, for the
            # types that have them, 8-bit ones (quantized once before the timed launches).
            variants = ([(1, r, "float") for r in (1, 2)] + [(1, r, "int8") for r in (1, 2) if int8]
                        + [(n, 1, "float") for n in tokens if n > 1 and shape_index == 0])
            for n, per_warp, activations in variants:
                x = cupy.asarray(src.rng.standard_normal((n, cols), np.float32))
                y = cupy.empty((n, rows), np.float32)
                x8 = cuda_matmul.quantize_q8(b.kernels, x) if activations == "int8" else None

                def launch(i, x=x, y=y, x8=x8, per_warp=per_warp):
                    w, choose = copies[i % len(copies)], (lambda _: per_warp)
                    if x8 is None:
                        cuda_matmul.matvec(b.kernels, x, w, y, rows_per_warp=choose)
                    else:
                        cuda_matmul.matvec_q8(b.kernels, x8, w, y, rows_per_warp=choose)
                # The first round of the copies compiles and warms up.
                ms = median_gpu_ms(launch, reps, warmup=len(copies))
                gb_s = first.raw.nbytes / ms / 1e6
                chosen = n > 1 or (per_warp == cuda_matmul.rows_per_warp(first, activations)
                                   and activations == (b.products if int8 else "float"))
                out.append({"type": qtype.name, "rows": rows, "cols": cols, "tokens": n, "rows_per_warp": per_warp,
                            "activations": activations, "chosen": chosen,
                            "us": 1e3 * ms, "GB_s": gb_s, "bandwidth_fraction": gb_s / bandwidth})
            first = copies = None  # before the next shape is made
            cupy.get_default_memory_pool().free_all_blocks()
    return out


def rows_first_token_s(model: Model, prompt: np.ndarray, n_ctx: int, reps: int) -> float | None:
    """The least of reps times to the first token of the prompt on the host as the engine runs a
    short one: as rows of one slot through the decode step (one graph replay; its bucket captured
    first, as an engine captures it once); None where the model does not take its prompts so
    (decode_graph.prompt_rows). The slot's positions are rewritten each time, as a fresh context's."""
    n = len(prompt)
    if n > prompt_rows(model):
        return None
    b = model.backend
    step = decode_step(model, model.new_context(n_ctx, "f16", "f16").cache)
    rows = prompt, np.zeros(n, np.int32), np.arange(n, dtype=np.int32)
    step(*rows)   # capture
    times = []
    for _ in range(reps):
        b.synchronize()
        t0 = time.perf_counter()
        b.argmax_rows(step(*rows)[n - 1:])
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_model(spec: Spec, path: Path, bandwidth: float, batch_sizes: list[int], backend=None) -> dict:
    import cupy

    from llogos_cli.backends.cuda.cuda_backend import CudaBackend

    b = backend or CudaBackend()
    t = time.perf_counter()
    model = Model(GGUFFile(path), b)
    b.synchronize()
    load_s = time.perf_counter() - t
    ids = np.random.default_rng(0).integers(2, spec.n_vocab, PROMPT_TOKENS + DECODE_TOKENS).astype(np.int32)
    n_ctx = PROMPT_TOKENS + DECODE_TOKENS + 16

    def prefill(n: int) -> float:
        """Seconds from a fresh context to the first token of an n-token prompt on the host."""
        ctx = model.new_context(n_ctx, "f16", "f16")
        b.synchronize()
        t0 = time.perf_counter()
        b.argmax_rows(model.forward_seq(ctx, ids[:n]))
        return time.perf_counter() - t0

    def decode(graph: bool):
        ctx = model.new_context(n_ctx, "f16", "f16")
        token = int(b.argmax_rows(model.forward_seq(ctx, ids[:16]))[0])
        step, slot = decode_step(model, ctx.cache), np.zeros(1, np.int32)

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
        tok_s = DECODE_TOKENS / (time.perf_counter() - t0)
        if not graph:
            return tok_s, None
        # One graph replay's GPU time, its input copies included.
        tokens, pos = np.array([token], np.int32), np.array([ctx.n_past], np.int32)
        return tok_s, median_gpu_ms(lambda i: step(tokens, slot, pos), 50)

    prefill(PROMPT_TOKENS)  # compile kernels, initialize cuBLAS
    prefill_tok_s = PROMPT_TOKENS / min(prefill(PROMPT_TOKENS) for _ in range(3))
    ttft_ms_eager = 1e3 * min(prefill(TTFT_TOKENS) for _ in range(5))
    rows_s = rows_first_token_s(model, ids[:TTFT_TOKENS], n_ctx, 5)
    ttft_ms = ttft_ms_eager if rows_s is None else 1e3 * rows_s
    (eager, _), (graphed, replay) = decode(False), decode(True)
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
        prefill_ms = prefill(PROMPT_TOKENS) * 1e3
    kernels, prefill_table = decode_kernels.table(decode_ms), prefill_kernels.table(prefill_ms)
    return {
        "model": spec.name, "weights_GB": model.weight_bytes / 1e9, "load_s": load_s,
        "prefill_tok_s": prefill_tok_s, "ttft_ms": ttft_ms, "ttft_ms_eager": ttft_ms_eager,
        "decode_tok_s": best, "decode_tok_s_eager": eager, "decode_tok_s_graph": graphed,
        "decode_GB_s": model.weight_bytes * best / 1e9, "bandwidth_fraction": model.weight_bytes * best / 1e9 / bandwidth,
        # Where a decode step's time goes: the kernels' own GPU time (eager, one event pair each), the
        # weight products' share of it, one graph replay's GPU time, and the wall time per token
        # either way (host work between).
        "decode_step_ms": {"kernels_gpu": sum(ms for _, count, ms in kernels if count),
                           "matvec_gpu": sum(ms for name, _, ms in kernels if name.startswith("matvec")),
                           "graph_replay_gpu": replay, "graph_wall": 1e3 / graphed, "eager_wall": 1e3 / eager},
        "decode_kernels": kernels,
        "prefill_kernels": prefill_table,
        # A prompt's time: its wall time, the GPU time of the mixture-of-experts kernels (router,
        # grouping, gather, tiles, scatter, bias, sums; the pair-by-pair product) and of the prompt
        # products (f16 GEMMs, which the experts with many tokens share, and int8 tensor-core tiles).
        "prefill_step_ms": {"wall": prefill_ms,
                            "experts_gpu": sum(ms for name, _, ms in prefill_table if name.startswith(EXPERT_KERNELS)),
                            "gemm_gpu": sum(ms for name, _, ms in prefill_table if name.startswith(("gemm_f16", "matmul_q8_mma")))},
        "batched": [batched_or_error(model, n) for n in batch_sizes],
        "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
    }


def median_gpu_ms(run, reps: int, warmup: int = 0) -> float:
    """Median GPU time of run(i) over reps calls after warmup ones, each between two CUDA events."""
    import cupy
    times = []
    for i in range(warmup + reps):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        run(i)
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(cupy.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def batched_or_error(model: Model, n: int) -> dict:
    """bench_batched, or what stopped it: the single-sequence figures before it still count."""
    try:
        return bench_batched(model, n)
    except Exception as e:  # noqa: BLE001 (any failure on the GPU is a finding to record)
        print(f"batched decode of {n} rows: {type(e).__name__}: {e}", file=sys.stderr)
        return {"B": n, "error": f"{type(e).__name__}: {e}"}


def bench_batched(model: Model, n: int) -> dict:
    """n sequences of BATCH_PROMPT tokens each, prefilled in batches of whole prompts up to
    PREFILL_BATCH tokens, then BATCH_DECODE greedy steps of n rows from the decoder's CUDA graphs;
    aggregate tok/s of each phase (llama-batched-bench's S_PP and S_TG)."""
    b = model.backend
    rng = np.random.default_rng(n)
    cache = model.new_cache(n, BATCH_PROMPT + BATCH_DECODE + 1, "f16", "f16")
    prompts = [Batch.run(rng.integers(2, model.cfg.n_vocab, BATCH_PROMPT), s, 0, [BATCH_PROMPT - 1]) for s in range(n)]
    per_pass = max(1, PREFILL_BATCH // BATCH_PROMPT)
    step, slots = decode_step(model, cache), np.arange(n, dtype=np.int32)
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
    parser.add_argument("--models", default=",".join(name for name, spec in SPECS.items() if not spec.experts))
    parser.add_argument("--batch-sizes", default="1,4,16,64", help="sequences decoded at once (batched figures)")
    parser.add_argument("--llama-cpp", action="store_true", help="also run llama-bench and llama-batched-bench from PATH")
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "llogos-bench")
    parser.add_argument("--products", action="store_true", help="first, the product kernels alone per weight type")
    parser.add_argument("--json", type=Path, help="write the record (see record()) here, after every model")
    parser.add_argument("--commit", default=os.environ.get("LLOGOS_COMMIT"), help="llogos commit measured (default: git's HEAD)")
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
    products = bench_products(bandwidth) if args.products else []
    results = []
    for name in args.models.split(","):
        if SPECS[name].experts:   # stacked experts: written a tensor at a time
            from bench.synthetic_gguf import write_model
            path = write_model(name, args.dir)
        else:
            path = model_file(SPECS[name], args.dir)
        reference = None
        if args.llama_cpp:  # first, while llogos holds no GPU memory
            try:
                reference = {"single": llama_cpp.single(path, PROMPT_TOKENS, DECODE_TOKENS, TTFT_TOKENS),
                             "batched": llama_cpp.batched(path, BATCH_PROMPT, BATCH_DECODE, batch_sizes)}
            except (OSError, RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
                print(f"llama.cpp on {name}: {e}", file=sys.stderr)  # llogos' own figures still count
        results.append({**bench_model(SPECS[name], path, bandwidth, batch_sizes), "llama_cpp": reference})
        cupy.get_default_memory_pool().free_all_blocks()
        if args.json:  # after every model, so that a run cut short keeps what it measured
            args.json.write_text(json.dumps(record(results, products, bandwidth, args.commit or git_commit()), indent=1))
    report(results, products, bandwidth)


def git_commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False,
                          cwd=Path(__file__).parent)
    return done.stdout.strip() or None


def record(results: list[dict], products: list[dict], bandwidth: float, commit: str | None) -> dict:
    """The machine-readable record (bench/results/cuda-h100.json): per model, llogos' and
    llama.cpp's decode tok/s at batch 1, prefill tok/s of 512 tokens, time to first token of a
    TTFT_TOKENS prompt and decode bandwidth as a fraction of the copy bandwidth, then the detail;
    and the product kernels alone per weight type (bench_products)."""
    models = {}
    for r in results:
        theirs = (r["llama_cpp"] or {}).get("single")
        llamacpp = None if theirs is None else {
            "decode_tok_s": theirs["decode_tok_s"], "prefill_tok_s": theirs["prefill_tok_s"],
            "ttft_ms": theirs["ttft_ms"], "build": theirs["build"],
            "bandwidth_fraction": r["weights_GB"] * theirs["decode_tok_s"] / bandwidth}
        batched_theirs = {row["B"]: row for row in (r["llama_cpp"] or {}).get("batched", [])}
        models[r["model"]] = {
            "weights_GB": r["weights_GB"],
            "llogos": {key: r[key] for key in ("decode_tok_s", "prefill_tok_s", "ttft_ms", "ttft_ms_eager",
                                               "bandwidth_fraction",
                                               "decode_tok_s_eager", "decode_tok_s_graph", "decode_GB_s", "load_s",
                                               "decode_step_ms", "prefill_step_ms")},
            "llamacpp": llamacpp,
            "batched": [{"B": row["B"], "llogos": row, "llamacpp": batched_theirs.get(row["B"])} for row in r["batched"]],
            "decode_kernels": r["decode_kernels"], "prefill_kernels": r["prefill_kernels"],
        }
    return {"gpu": results[0]["device"], "date": time.strftime("%Y-%m-%d"), "commit": commit,
            "copy_bandwidth_GB_s": bandwidth, "prompt_tokens": PROMPT_TOKENS, "decode_tokens": DECODE_TOKENS,
            "ttft_prompt_tokens": TTFT_TOKENS, "models": models, "products": products}


def report(results: list[dict], products: list[dict], bandwidth: float) -> None:
    def num(value, digits: int = 0) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    print(f"device: {results[0]['device']}, device-to-device copy: {bandwidth:.0f} GB/s; llama.cpp's figures in brackets\n")
    print(f"| model | weights GB | prefill {PROMPT_TOKENS} tok/s | TTFT {TTFT_TOKENS} tok ms | decode tok/s "
          "eager / graph | of copy BW |")
    print("|---|---|---|---|---|---|")
    for r in results:
        theirs = (r["llama_cpp"] or {}).get("single", {})
        share = None if "decode_tok_s" not in theirs else 100 * r["weights_GB"] * theirs["decode_tok_s"] / bandwidth
        print(f"| {r['model']} | {r['weights_GB']:.2f} | {r['prefill_tok_s']:.0f} ({num(theirs.get('prefill_tok_s'))}) "
              f"| {r['ttft_ms']:.1f} ({num(theirs.get('ttft_ms'), 1)}) | {r['decode_tok_s_eager']:.0f} / "
              f"{r['decode_tok_s_graph']:.0f} ({num(theirs.get('decode_tok_s'))}) "
              f"| {100 * r['bandwidth_fraction']:.0f}% ({num(share)}%) |")
    print(f"\nTTFT {TTFT_TOKENS} tok ms above: the prompt as rows of the decode step's graph where the model takes "
          "them (engine/decode_graph.py, prompt_rows); by the eager prompt pass: "
          + ", ".join(f"{r['model']} {r['ttft_ms_eager']:.1f}" for r in results))
    print("\nA decode step, ms: its kernels' GPU time (eager), the weight products' share (and the weight bytes "
          "they stream per second), one graph replay's GPU time, wall time per token from the graph and eagerly.\n\n"
          "| model | kernels | products | graph replay | graph wall | eager wall |\n|---|---|---|---|---|---|")
    for r in results:
        t = r["decode_step_ms"]
        print(f"| {r['model']} | {t['kernels_gpu']:.3f} | {t['matvec_gpu']:.3f} ({r['weights_GB'] / t['matvec_gpu'] * 1e3:.0f} GB/s) "
              f"| {t['graph_replay_gpu']:.3f} | {t['graph_wall']:.3f} | {t['eager_wall']:.3f} |")
    print(f"\nA prompt of {PROMPT_TOKENS} tokens, ms: wall time, the mixture-of-experts kernels' GPU time "
          f"({', '.join(p + '*' for p in EXPERT_KERNELS)}), the f16 GEMMs' (experts' and the rest).\n\n"
          "| model | wall | expert kernels | GEMMs |\n|---|---|---|---|")
    for r in results:
        t = r["prefill_step_ms"]
        print(f"| {r['model']} | {t['wall']:.1f} | {t['experts_gpu']:.1f} | {t['gemm_gpu']:.1f} |")
    print(f"\nBatched: B sequences of {BATCH_PROMPT} prompt tokens, then {BATCH_DECODE} steps of B rows; "
          "aggregate tok/s, llama-batched-bench's in brackets.\n")
    print("| model | B | prefill tok/s | decode tok/s |\n|---|---|---|---|")
    for r in results:
        theirs = {row["B"]: row for row in (r["llama_cpp"] or {}).get("batched", [])}
        for row in r["batched"]:
            other = theirs.get(row["B"], {})
            if "error" in row:
                print(f"| {r['model']} | {row['B']} | {row['error']} | |")
                continue
            print(f"| {r['model']} | {row['B']} | {row['prefill_tok_s']:.0f} ({num(other.get('prefill_tok_s'))}) "
                  f"| {row['decode_tok_s']:.0f} ({num(other.get('decode_tok_s'))}) |")
    if products:
        print("\nThe product kernels alone: us a launch, weight GB/s (share of the copy bandwidth); one token "
              "with each number of rows a warp (* the launcher's choice), then more tokens.\n")
        def label(p):
            if p["tokens"] > 1:
                return f"{p['tokens']} tokens"
            return f"1 token, {p.get('activations', 'float')}, {p['rows_per_warp']} row{'s' * (p['rows_per_warp'] > 1)} a warp"
        columns = list(dict.fromkeys(label(p) for p in products))
        by_shape = defaultdict(dict)
        for p in products:
            by_shape[(p["type"], p["rows"], p["cols"])][label(p)] = (
                f"{p['us']:.1f} us, {p['GB_s']:.0f} GB/s ({100 * p['bandwidth_fraction']:.0f}%){'*' * (p['chosen'] and p['tokens'] == 1)}")
        print("| type | rows x cols | " + " | ".join(columns) + " |\n" + "|---" * (2 + len(columns)) + "|")
        for (name, rows, cols), cells in by_shape.items():
            print(f"| {name} | {rows} x {cols} | " + " | ".join(cells.get(c, "-") for c in columns) + " |")
    print("\nTargets on an H100, against llama.cpp in the same run: decode >= 1.0x on every model and >= 75% of "
          "the bandwidth on llama-8b; prefill >= 1.0x on llama-1b and llama-8b; TTFT < 20 ms on llama-1b.")
    for r in results:
        for phase in ("decode", "prefill"):
            print(f"\n{r['model']}, {phase} kernels:\n\n| kernel | launches | ms |\n|---|---|---|")
            for name, count, ms in r[f"{phase}_kernels"][:15]:
                print(f"| {name} | {count} | {ms:.3f} |")


if __name__ == "__main__":
    main()
