"""The CPU's weights modes beside llama.cpp, on the same GGUF files: decode and prefill speed,
peak RSS and load time.

    PYTHONPATH=. python bench/bench_quant.py --llama-bench PATH [--models llama-1b,llama-8b,smollm2-135m,gemma3-270m]
                                [--modes quantized,auto] [--tg 16] [--reps 2] [--pp 128]

With --pp above 128 (long contexts), llama-bench runs `-p PP -n 0` and `-p 0 -n TG -d PP`: the
prompt from an empty cache and decode at depth PP, as llogos' run measures them (its decode follows
its prompt).

llama-1b and llama-8b are synthetic Q4_K_M files of those shapes (random weights), written once to
~/.cache/llogos/bench by bench/synthetic_gguf.py; the others are models.toml names. Each llogos run
is a process of its own, so that its peak RSS is its own. Prints a Markdown table.
"""

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import llogos_cli  # noqa: F401  (before NumPy, whose OpenBLAS reads llogos' settings as it loads)
import numpy as np

PROMPT_TOKENS = 128


def child(path: str, mode: str, n_tg: int, n_pp: int = PROMPT_TOKENS) -> dict:
    """One llogos run in this process: load, prefill n_pp tokens, decode n_tg, on the engine
    `llogos generate` runs (its timings: the steps' own time, as its --json summary reports)."""
    from llogos_cli.engine.batch import Request
    from llogos_cli.engine.generation import Generation
    from llogos_cli.engine.sampling import SamplingParams
    from llogos_cli.engine.stops import StopCriteria
    from llogos_cli.model.loader import load
    t = time.perf_counter()
    n_ctx = n_pp + n_tg + 8
    m = load(path, "cpu", mode, n_ctx=n_ctx)
    load_s = time.perf_counter() - t
    model = m.model
    ids = np.random.default_rng(0).integers(3, model.cfg.n_vocab, n_pp).tolist()

    def run(prompt: list[int], n: int):
        gen = Generation.alone(model, m.tokenizer, n_ctx, Request(0, prompt, SamplingParams(temp=0.0),
                                                                  StopCriteria(n, ignore_eos=True)))
        for _ in gen:
            pass
        return gen.timings

    run(ids[:2], 2)   # the kernels' first call loads them from numba's cache
    timings = run(ids, n_tg + 1)   # the first token comes from the prefill; n_tg decode steps follow
    pp = timings.prompt_n / timings.prompt_ms * 1e3
    tg = timings.eval_runs / timings.predicted_ms * 1e3
    return {"mode": model.backend.weights, "note": m.memory, "load_s": load_s, "pp": pp, "tg": tg,
            "weight_bytes": model.weight_bytes,
            "weights": sum(int(np.prod(t.shape)) for n, t in m.source.file.tensors.items()
                           if len(t.shape) == 2 and (n != "token_embd.weight" or model.cfg.output == n)),
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def llogos(path: Path, mode: str, n_tg: int, n_pp: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(path), mode, "--tg", str(n_tg), "--pp", str(n_pp)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def llama_bench(exe: str, path: Path, n_tg: int, reps: int, n_pp: int) -> dict:
    runs = [["-p", str(n_pp), "-n", str(n_tg)]] if n_pp <= PROMPT_TOKENS else \
        [["-p", str(n_pp), "-n", "0"], ["-p", "0", "-n", str(n_tg), "-d", str(n_pp)]]
    rows = []
    for run in runs:
        out = subprocess.run([exe, "-m", str(path), "-t", "2", *run, "-r", str(reps), "-o", "json"], check=True,
                             capture_output=True, text=True).stdout
        rows += json.loads(out)
    return {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in rows}


def model_file(name: str) -> Path:
    """A real model by name, or a synthetic shape (llama-1b, llama-8b, qwen3-30b-a3b, ...), in
    another type mix as SHAPE:MIX (llama-1b:iq4_xs)."""
    from bench.synthetic import SPECS
    shape, _, mix = name.partition(":")
    if shape in SPECS and SPECS[shape].mix != "q4_1":
        from bench.synthetic_gguf import write_model
        from llogos_cli.paths import cache_dir
        return write_model(shape, cache_dir("bench"), mix or None)
    from llogos_cli.model.registry import resolve_model
    return resolve_model(name)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench, for its figures on the same files")
    ap.add_argument("--models", default="llama-1b,llama-8b,smollm2-135m,gemma3-270m")
    ap.add_argument("--modes", default="quantized,auto")
    ap.add_argument("--tg", type=int, default=16, help="tokens decoded (8B: fewer is fine)")
    ap.add_argument("--reps", type=int, default=2, help="llama-bench repetitions")
    ap.add_argument("--pp", type=int, default=PROMPT_TOKENS, help="prompt tokens (decode follows at that depth)")
    ap.add_argument("--child", nargs=2, metavar=("PATH", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.tg, args.pp)))
        return
    print(f"## CPU weights modes, {date.today()}, {platform.processor() or platform.machine()}, "
          f"{Path('/proc/cpuinfo').read_text().count('processor')} threads\n")
    print(f"| model | file | llogos mode | load | pp{args.pp} tok/s | tg tok/s | decode GB/s, G weights/s | peak RSS "
          f"(x file) | llama.cpp pp{args.pp} / tg | llogos / llama.cpp pp, tg |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        path = model_file(name)
        size = path.stat().st_size
        ref = llama_bench(args.llama_bench, path, args.tg, args.reps, args.pp) if args.llama_bench else {}
        for mode in args.modes.split(","):
            r = llogos(path, mode, args.tg, args.pp)
            ratio = (f"{r['pp'] / ref['pp']:.2f}, {r['tg'] / ref['tg']:.2f}" if ref else "")
            print(f"| {name} | {size / 2**20:.0f} MiB | {mode} → {r['mode']} | {r['load_s']:.1f} s | {r['pp']:.1f} | "
                  f"{r['tg']:.2f} | {r['weight_bytes'] * r['tg'] / 1e9:.1f}, {r['weights'] * r['tg'] / 1e9:.1f} | "
                  f"{r['rss_mib']:.0f} MiB ({r['rss_mib'] * 2**20 / size:.2f}) | "
                  f"{ref.get('pp', float('nan')):.1f} / {ref.get('tg', float('nan')):.2f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
