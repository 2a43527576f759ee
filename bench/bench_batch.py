"""Batched throughput, measured as llama.cpp's llama-batched-bench does, with llama.cpp beside it.

For each number of rows B: B prompts of PP random tokens are prefilled (at most 2048 tokens per
forward pass, as llama-batched-bench's default batch), then TG tokens are decoded for all B rows
at once. Reported: prompt tok/s (B*PP / prefill time), generation tok/s summed over rows
(B*TG / decode time) and total tok/s, plus the peak RSS. Then the end-to-end throughput of
`llogos batch` on a file of prompts, start-up included.

    python bench/bench_batch.py [-m smollm2-135m] [--npl 1,4,16,64] [--cpu-weights auto] [--llama-batched-bench PATH]
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from llogos_cli.engine.decode_graph import decode_step
from llogos_cli.model.batch import Batch
from llogos_cli.model.loader import load
from llogos_cli.model.registry import resolve_model

PREFILL_CHUNK = 2048


def llogos_rows(model, n_rows: int, pp: int, tg: int, rng) -> dict:
    cache = model.new_cache(n_rows, pp + tg)
    prompts = rng.integers(0, model.cfg.n_vocab, (n_rows, pp)).astype(np.int32)
    t0 = time.perf_counter()
    logits = []
    rows_per_pass = max(1, PREFILL_CHUNK // pp)
    for r0 in range(0, n_rows, rows_per_pass):
        rows = range(r0, min(n_rows, r0 + rows_per_pass))
        batch = Batch.join([Batch.run(prompts[r], r, 0, [pp - 1]) for r in rows])
        logits.append(model.backend.argmax_rows(model.forward(cache, batch)))
    tokens = np.concatenate(logits).astype(np.int32)
    t_pp = time.perf_counter() - t0
    decode = decode_step(model, cache)
    slots = np.arange(n_rows, dtype=np.int32)
    t0 = time.perf_counter()
    for i in range(tg):
        tokens = model.backend.argmax_rows(decode(tokens, slots, np.full(n_rows, pp + i, np.int32))).astype(np.int32)
    t_tg = time.perf_counter() - t0
    return {"rows": n_rows, "pp_tok_s": n_rows * pp / t_pp, "tg_tok_s": n_rows * tg / t_tg,
            "total_tok_s": n_rows * (pp + tg) / (t_pp + t_tg),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def llama_cpp(binary: str, gguf: Path, npl: list[int], pp: int, tg: int, threads: int) -> dict:
    cmd = [binary, "-m", str(gguf), "-c", str(max(npl) * (pp + tg) + 64), "-b", "2048", "-ub", "512",
           "-npp", str(pp), "-ntg", str(tg), "-npl", ",".join(map(str, npl)), "-t", str(threads), "--output-format", "jsonl"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            rows[r["pl"]] = {"pp_tok_s": r["speed_pp"], "tg_tok_s": r["speed_tg"], "total_tok_s": r["speed"]}
    return rows


def end_to_end(model_name: str, n_prompts: int, n_predict: int, parallel: int) -> dict:
    words = "the of a river city music light story garden winter machine letter".split()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "prompts.jsonl"
        src.write_text("".join(json.dumps({"id": i, "prompt": " ".join(rng.choice(words, 12))}) + "\n"
                               for i in range(n_prompts)))
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "llogos_cli", "batch", "-m", model_name, "-i", str(src),
                            "-o", str(Path(d) / "out.jsonl"), "-np", str(parallel), "-n", str(n_predict),
                            "--ignore-eos", "--temp", "0", "--backend", "cpu"], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if r.returncode:
            raise SystemExit(r.stderr)
        tokens = sum(len(json.loads(line)["tokens"]) for line in (Path(d) / "out.jsonl").read_text().splitlines())
    return {"prompts": n_prompts, "parallel": parallel, "wall_s": wall, "prompts_per_s": n_prompts / wall,
            "gen_tok_s": tokens / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--npl", default="1,4,16,64")
    ap.add_argument("--npp", type=int, default=128)
    ap.add_argument("--ntg", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpu-weights", default="auto", help="f32, quantized or auto (llogos' --cpu-weights)")
    ap.add_argument("--llama-batched-bench", help="path to an already built llama-batched-bench")
    ap.add_argument("--e2e-prompts", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    npl = [int(x) for x in a.npl.split(",")]
    m = load(a.model, "cpu", a.cpu_weights, n_ctx=a.npp + a.ntg, n_slots=max(npl))   # batched: the few-row kernel
    rng = np.random.default_rng(0)
    llogos_rows(m.model, 2, 8, 2, rng)   # warm-up
    report = {"model": a.model, "date": time.strftime("%Y-%m-%d"), "npp": a.npp, "ntg": a.ntg,
              "llogos": [llogos_rows(m.model, n, a.npp, a.ntg, rng) for n in npl]}
    if a.llama_batched_bench:
        report["llamacpp"] = llama_cpp(a.llama_batched_bench, resolve_model(a.model)[0], npl, a.npp, a.ntg, a.threads)
    if a.e2e_prompts:
        report["batch_cli"] = end_to_end(a.model, a.e2e_prompts, a.ntg, min(max(npl), 64))
    if a.json:
        print(json.dumps(report, indent=1))
        return
    print(f"{a.model}: PP={a.npp} TG={a.ntg}, tok/s (llama.cpp in brackets)")
    print(f"{'rows':>5} {'prompt':>16} {'generation':>16} {'total':>16} {'peak RSS':>10}")
    for row in report["llogos"]:
        ref = report.get("llamacpp", {}).get(row["rows"], {})
        cells = [f"{row[k]:7.1f} [{ref[k]:6.1f}]" if k in ref else f"{row[k]:7.1f}"
                 for k in ("pp_tok_s", "tg_tok_s", "total_tok_s")]
        print(f"{row['rows']:>5} " + " ".join(f"{c:>16}" for c in cells) + f" {row['peak_rss_mib']:>7.0f} MiB")
    if "batch_cli" in report:
        e = report["batch_cli"]
        print(f"llogos batch: {e['prompts']} prompts x {a.ntg} tokens at -np {e['parallel']}: {e['wall_s']:.1f} s, "
              f"{e['prompts_per_s']:.2f} prompts/s, {e['gen_tok_s']:.1f} generated tok/s (start-up included)")


if __name__ == "__main__":
    main()
