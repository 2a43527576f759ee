"""Decode speed when the cores are shared: llogos (-t auto, every core, one) beside llama-bench
(-t every core, one) on the same model, quiet, beside a spinning process, and beside a second
llogos decoding on every core.

    python bench/bench_threads.py --llama-bench /path/to/llama-bench [-m smollm2-135m] [-n 64]

llama.cpp's tools are built outside this repository (docs/PERF.md says how). Prints a Markdown
table for docs/PERF.md: tokens/s of decode, the median of --reps runs.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date

from llogos_cli.backends.cpu.cpu_threads import available_cores
from llogos_cli.model.registry import resolve_model

PROMPT = "The history of the city begins"
SETTLE_S = 3.0   # lets a neighbour finish loading before a measurement starts


def llogos(*args: str) -> list[str]:
    return [sys.executable, "-m", "llogos_cli", *args]


def neighbours(kind: str, model: str) -> list[subprocess.Popen]:
    if kind == "quiet":
        return []
    if kind == "spinning":
        return [subprocess.Popen([sys.executable, "-c", "while True: pass"])]
    # a second llogos decoding on every core, for longer than any measurement
    cores = str(available_cores())
    return [subprocess.Popen(llogos("generate", "-m", model, "-p", PROMPT, "-n", "100000", "--ignore-eos",
                                    "-c", "8192", "--allow-long-ctx", "-t", cores, "-tb", cores),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]


def llogos_decode(model: str, n: int, threads: list[str]) -> float:
    done = subprocess.run(llogos("generate", "-m", model, "-p", PROMPT, "-n", str(n), "--ignore-eos", "--temp", "0",
                                 "--json", *threads), capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])["timings"]["predicted_per_second"]


def llama_decode(tool: str, path, n: int, threads: int) -> float:
    done = subprocess.run([tool, "-m", str(path), "-p", "0", "-n", str(n), "-t", str(threads), "-r", "1",
                           "-o", "json"], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)[0]["avg_ts"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-n", type=int, default=64, help="tokens to decode")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--llama-bench", required=True, help="path to llama.cpp's llama-bench")
    args = ap.parse_args()
    path, _ = resolve_model(args.model, install=True)
    cores = available_cores()
    runs = {
        "llogos -t auto": lambda: llogos_decode(args.model, args.n, []),
        f"llogos -t {cores}": lambda: llogos_decode(args.model, args.n, ["-t", str(cores), "-tb", str(cores)]),
        "llogos -t 1": lambda: llogos_decode(args.model, args.n, ["-t", "1", "-tb", "1"]),
        f"llama.cpp -t {cores}": lambda: llama_decode(args.llama_bench, path, args.n, cores),
        "llama.cpp -t 1": lambda: llama_decode(args.llama_bench, path, args.n, 1),
    }
    conditions = ("quiet", "spinning", "second llogos")
    table = {}
    for condition in conditions:
        others = neighbours(condition.split()[-1], args.model)
        try:
            time.sleep(SETTLE_S if others else 0)
            for name, run in runs.items():
                table[name, condition] = statistics.median(run() for _ in range(args.reps))
                print(f"{name:>16} {condition:>14}: {table[name, condition]:7.1f} tok/s", file=sys.stderr)
        finally:
            for p in others:
                p.kill()
                p.wait()
    print(f"{args.model}, decode {args.n} tokens after a {len(PROMPT.split())}-word prompt, tok/s "
          f"(median of {args.reps}); {date.today()}, {platform.processor() or platform.machine()}, {cores} cores, "
          f"NUMBA_NUM_THREADS={os.environ.get('NUMBA_NUM_THREADS', 'unset')}\n")
    print("| | " + " | ".join(conditions) + " |")
    print("|---|" + "---:|" * len(conditions))
    for name in runs:
        print(f"| {name} | " + " | ".join(f"{table[name, c]:.1f}" for c in conditions) + " |")


if __name__ == "__main__":
    main()
