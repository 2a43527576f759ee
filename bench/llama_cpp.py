"""llama.cpp's CUDA tools on a GGUF, for figures beside llogos' (bench_cuda.py --llama-cpp).

Runs llama-bench (one sequence: pp512, tg128) and llama-batched-bench (B sequences of PP prompt
tokens each, then TG steps of B tokens) from PATH, as /work/shared/gpu/llama-env.sh puts them
there, with every layer on the GPU and flash attention on, and returns their figures in tokens/s.
"""

import json
import shutil
import subprocess

_TIMEOUT_S = 300


def available() -> bool:
    return all(shutil.which(tool) for tool in ("llama-bench", "llama-batched-bench"))


def _run(cmd: list[str]) -> tuple[str, str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout, done.stderr


def single(path, n_prompt: int, n_gen: int, n_first: int, reps: int = 3) -> dict:
    """{"prefill_tok_s", "decode_tok_s", "ttft_ms", "build"} of one sequence, f16 KV cache (llama-bench's
    default); ttft_ms is the time of an n_first-token prompt (llama-bench's pp<n_first>): it ends
    with the first token's logits."""
    out, _ = _run(["llama-bench", "-m", str(path), "-ngl", "99", "-fa", "1", "-p", f"{n_prompt},{n_first}",
                   "-n", str(n_gen), "-r", str(reps), "-o", "json"])
    rows = json.loads(out)
    pick = {(r["n_prompt"], r["n_gen"]): r for r in rows}
    return {"prefill_tok_s": pick[(n_prompt, 0)]["avg_ts"], "decode_tok_s": pick[(0, n_gen)]["avg_ts"],
            "ttft_ms": pick[(n_first, 0)]["avg_ns"] / 1e6, "build": rows[0].get("build_commit")}


def long_context(path, depth: int, n_gen: int, reps: int = 2) -> dict:
    """{"prefill_tok_s", "decode_tok_s"}: a depth-token prompt (llama-bench -p DEPTH -n 0) and n_gen
    tokens decoded after depth cached ones (-p 0 -n N_GEN -d DEPTH), flash attention on."""
    prefill = prompt(path, depth, reps)
    decode = json.loads(_run([*_bench_fa(path, reps), "-p", "0", "-n", str(n_gen), "-d", str(depth)])[0])[0]
    return {**prefill, "decode_tok_s": decode["avg_ts"]}


def prompt(path, n_prompt: int, reps: int = 2) -> dict:
    """{"prefill_tok_s", "build"}: an n_prompt-token prompt alone (llama-bench -p N -n 0), flash attention on."""
    prefill = json.loads(_run([*_bench_fa(path, reps), "-p", str(n_prompt), "-n", "0"])[0])[0]
    return {"prefill_tok_s": prefill["avg_ts"], "build": prefill.get("build_commit")}


def _bench_fa(path, reps: int) -> list[str]:
    return ["llama-bench", "-m", str(path), "-ngl", "99", "-fa", "1", "-r", str(reps), "-o", "json"]


def batched(path, n_prompt: int, n_gen: int, batch_sizes: list[int]) -> list[dict]:
    """Per batch size B: {"B", "prefill_tok_s" (B*PP/T_PP), "decode_tok_s" (B*TG/T_TG)}."""
    n_ctx = max(batch_sizes) * (n_prompt + n_gen) + 16
    # The table goes to stdout or to stderr depending on the version.
    out = "\n".join(_run(["llama-batched-bench", "-m", str(path), "-ngl", "99", "-fa", "1", "-c", str(n_ctx),
                          "-b", "2048", "-ub", "512", "-npp", str(n_prompt), "-ntg", str(n_gen),
                          "-npl", ",".join(map(str, batch_sizes))]))
    table = [line.strip().strip("|").split("|") for line in out.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in table[0]]
    rows = [dict(zip(header, (float(c) for c in cells))) for cells in table[2:]]  # past the header and its rule
    return [{"B": int(r["B"]), "prefill_tok_s": r["S_PP t/s"], "decode_tok_s": r["S_TG t/s"]} for r in rows]
