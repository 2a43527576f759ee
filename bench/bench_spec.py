"""Speculative decoding beside llama-server's: the same prompt token ids, greedy, a fixed number of
tokens, with and without n-gram drafts, llogos and llama-server in the same run.

    PYTHONPATH=. python bench/bench_spec.py [--llama-server PATH] [--model smollm2-135m]
        [--prompts bench/prompts/copy_passage.txt,bench/prompts/story.txt] [-n 192] [--rounds 2]
        [--spec-type ngram-simple,ngram-map-k,...] [--lookup]

Each prompt file is one user message, put through the model's chat template; the same ids go to
llama-server's /completion. Decode speed is each engine's own figure for the generated tokens
(llogos: its timings, as `--stats` reports; llama-server: `timings.predicted_per_second`), both at
-t 2. llogos' CPU-seconds (the process's, prompt and decode) are the figure to compare on a busy
host. The last column compares each run's ids with llogos' own without drafts: drafts never
change llogos' (greedy is exact), but llama-server's part from them where two tokens' logprobs are
a few hundredths apart (the engines' quantized arithmetic differs by about that much), and from
there the two engines write, and time, different text. Prints a Markdown table.
"""

import argparse
import json
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import llogos_cli  # noqa: F401  (before NumPy)

N_CTX = 2048
THREADS = 2


def load_llogos(model_name: str):
    from llogos_cli.model.loader import load
    return load(model_name, "cpu", n_ctx=N_CTX)


def llogos_runs(loaded, prompts: dict[str, list[int]], n: int, spec_type: str):
    from llogos_cli.engine.batch import Request
    from llogos_cli.engine.generation import Generation
    from llogos_cli.engine.sampling import SamplingParams
    from llogos_cli.engine.speculation import SpecParams
    from llogos_cli.engine.stops import StopCriteria
    out = {}
    for name, ids in prompts.items():
        gen = Generation.alone(loaded.model, loaded.tokenizer, N_CTX,
                               Request(0, ids, SamplingParams(temp=0.0), StopCriteria(n, ignore_eos=True)),
                               speculation=SpecParams(spec_type))
        cpu = time.process_time()
        for _ in gen:
            pass
        cpu = time.process_time() - cpu
        t = gen.timings
        out[name] = {"tok_s": t.predicted_n / t.predicted_ms * 1e3, "tokens": gen.result.tokens, "cpu_s": cpu,
                     "drafted": t.draft_n, "accepted": t.draft_n_accepted}
    return out


def prompt_ids(model_name: str, files: list[str]) -> dict[str, list[int]]:
    from llogos_cli.engine.conversation import Message, TemplateChoice
    from llogos_cli.model.loader import open_model
    mf = open_model(model_name)
    fmt = TemplateChoice().format(mf)
    return {Path(f).name: mf.tokenizer.encode(fmt.text([Message("user", Path(f).read_text().rstrip("\n"))]),
                                              add_bos=False) for f in files}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def llama_server_runs(exe: str, gguf: Path, prompts: dict[str, list[int]], n: int, spec_type: str):
    port = _free_port()
    cmd = [exe, "-m", str(gguf), "-t", str(THREADS), "-c", str(N_CTX), "--port", str(port), "-np", "1"]
    if spec_type != "none":
        cmd += ["--spec-type", spec_type]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        out = {}
        for name, ids in prompts.items():
            r = _post(port, "/completion", {"prompt": ids, "n_predict": n, "temperature": 0.0, "top_k": 1,
                                            "ignore_eos": True, "cache_prompt": False, "return_tokens": True})
            t = r["timings"]
            out[name] = {"tok_s": t["predicted_per_second"], "tokens": r.get("tokens", []),
                         "drafted": t.get("draft_n", 0), "accepted": t.get("draft_n_accepted", 0)}
        return out
    finally:
        proc.terminate()
        proc.wait()


def lookup_cost(kinds: list[str], contexts=(600, 4000), steps: int = 400) -> None:
    """CPU-us of a step's draft for a row that never matches (random ids), after a context of C
    tokens, each kind; and the first draft's, which indexes the context."""
    import numpy as np
    from llogos_cli.engine.batch import _speculator
    from llogos_cli.engine.speculation import Drafting, SpecParams
    from llogos_cli.engine.stops import StopCriteria

    class Completion:
        criteria, room, generated = StopCriteria(), 1 << 30, []

    class Row:
        def __init__(self, tokens):
            self.tokens, self.drafting, self.completion = tokens, Drafting(), Completion()
    print("| C | kind | CPU-us a step | first draft, CPU-ms |")
    print("|---|---|---|---|")
    for c in contexts:
        ids = np.random.default_rng(0).integers(0, 49152, c + steps).tolist()
        for kind in kinds:
            speculator, row = _speculator(SpecParams(kind), None, False, 1, 1 << 20), Row(ids[:c])
            t0 = time.process_time()
            speculator.draft(row)
            first = time.process_time() - t0
            t0 = time.process_time()
            for token in ids[c:]:
                row.tokens.append(token)
                speculator.draft(row)
            print(f"| {c} | {kind} | {(time.process_time() - t0) / steps * 1e6:.1f} | {first * 1e3:.1f} |", flush=True)


def _agreement(tokens: list[int], reference: list[int]) -> str:
    """"same", or how many leading ids agree before the first that differs."""
    if not tokens:
        return "n/a"
    if tokens == reference:
        return "same"
    return f"first {next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", help="llama.cpp's llama-server, for its figures on the same ids")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", default="bench/prompts/copy_passage.txt,bench/prompts/story.txt")
    ap.add_argument("-n", type=int, default=192, help="tokens generated")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--spec-type", default="ngram-simple", help="kinds to run beside none, comma-separated")
    ap.add_argument("--lookup", action="store_true", help="only the lookup's CPU cost a step, each kind, no model")
    args = ap.parse_args()
    if args.lookup:
        return lookup_cost(args.spec_type.split(","))
    from llogos_cli.model.registry import resolve_model
    gguf = resolve_model(args.model)[0]
    prompts = prompt_ids(args.model, args.prompts.split(","))
    print("| round | prompt | prompt tokens | engine | spec | decode tok/s | CPU-s (llogos: prompt and decode) "
          "| drafted / accepted | ids as llogos' without drafts |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rnd in range(args.rounds):
        loaded, mine = load_llogos(args.model), {}
        for spec in ("none", *args.spec_type.split(",")):
            mine[spec] = llogos_runs(loaded, prompts, args.n, spec)
            theirs = llama_server_runs(args.llama_server, gguf, prompts, args.n, spec) if args.llama_server else {}
            for name, ids in prompts.items():
                for engine, runs in (("llogos", mine[spec]), ("llama-server", theirs)):
                    if name in runs:
                        r = runs[name]
                        same = _agreement(r["tokens"], mine["none"][name]["tokens"])
                        cpu = f"{r['cpu_s']:.2f}" if "cpu_s" in r else ""
                        print(f"| {rnd} | {name} | {len(ids)} | {engine} | {spec} | {r['tok_s']:.1f} | {cpu} | "
                              f"{r['drafted']} / {r['accepted']} | {same} |", flush=True)


if __name__ == "__main__":
    main()
