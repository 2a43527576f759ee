"""CPU benchmark in llama-bench's terms (pp128, tg64) plus start-up, time to first token and RSS.

    python bench/bench_cpu.py [-m smollm2-135m] [--reps 3]

Prints a Markdown table to paste into docs/PERF.md.
"""

import argparse
import platform
import resource
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

from llogos_cli.model.loader import load

PROMPT = "The capital of France is"


def median(xs):
    return float(np.median(xs))


def stream_bandwidth() -> float:
    """GB/s of a float32 matrix-vector product too large for any cache: the decode ceiling."""
    w = np.ones((16384, 8192), np.float32)
    x = np.ones(8192, np.float32)
    w @ x
    t = time.perf_counter()
    for _ in range(5):
        w @ x
    return w.nbytes * 5 / (time.perf_counter() - t) / 1e9


def in_process(model_name: str, reps: int) -> dict:
    m = load(model_name, "cpu")
    model = m.model
    rng = np.random.default_rng(0)
    pp, tg, ttft = [], [], []
    for _ in range(reps):
        ctx = model.new_context(512)
        ids = rng.integers(0, model.cfg.n_vocab, 128).astype(np.int32)
        t = time.perf_counter()
        model.forward_seq(ctx, ids)
        pp.append(128 / (time.perf_counter() - t))

        ctx = model.new_context(512)
        model.forward_seq(ctx, ids[:1])
        t = time.perf_counter()
        for i in range(64):
            model.forward_seq(ctx, ids[i % 128:i % 128 + 1])
        tg.append(64 / (time.perf_counter() - t))

        ctx = model.new_context(512)
        prompt = np.asarray(m.tokenizer.encode(PROMPT), np.int32)
        t = time.perf_counter()
        int(np.argmax(model.forward_seq(ctx, prompt)[-1]))
        ttft.append((time.perf_counter() - t) * 1e3)
    return {"load_ms": m.load_ms, "pp128": median(pp), "tg64": median(tg), "ttft_ms": median(ttft),
            "weight_mb": model.weight_bytes / 1e6, "prompt_tokens": len(prompt)}


def cli_run(model_name: str, n: int = 32) -> tuple[float, float]:
    """Wall time and peak RSS (of all runs so far) of `llogos generate` for the prompt and n new tokens."""
    cmd = [sys.executable, "-m", "llogos_cli", "generate", "-m", model_name, "-p", PROMPT, "-n", str(n),
           "--temp", "0", "--ignore-eos"]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, peak_kb / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    cli_run(args.model)  # warm the header/tokenizer caches and the page cache
    wall, rss = cli_run(args.model)
    first = min(cli_run(args.model, 1)[0] for _ in range(3))
    r = in_process(args.model, args.reps)
    bw = stream_bandwidth()
    bound = bw * 1e3 / r["weight_mb"]
    print(f"## {args.model} on CPU, {date.today()}, {platform.processor() or platform.machine()}, "
          f"{Path('/proc/cpuinfo').read_text().count('processor')} threads\n")
    print("| metric | llogos | target (SmolLM2-135M) |")
    print("|---|---|---|")
    print(f"| prefill pp128 | {r['pp128']:.0f} tok/s | >= 300 |")
    print(f"| decode tg64 | {r['tg64']:.1f} tok/s | >= 30 |")
    print(f"| time to first token ({r['prompt_tokens']}-token prompt, model loaded) | {r['ttft_ms']:.0f} ms | |")
    print(f"| model load (in process) | {r['load_ms']:.0f} ms | |")
    print(f"| `llogos generate` wall time, 5-token prompt + 32 tokens | {wall:.2f} s | < 5 s |")
    print(f"| `llogos generate -n 1` wall time: start-up to first token, caches warm | {first:.2f} s | < 3 s |")
    print(f"| peak RSS of that run | {rss:.0f} MiB | <= 1024 MiB |")
    print(f"| weights streamed per decoded token | {r['weight_mb']:.0f} MB | |")
    print(f"| measured streaming bandwidth (large f32 GEMV) | {bw:.1f} GB/s | |")
    print(f"| decode bound = bandwidth / bytes per token | {bound:.1f} tok/s | |")
    print(f"| decode achieved fraction of that bound | {r['tg64'] / bound:.0%} | |")


if __name__ == "__main__":
    main()
