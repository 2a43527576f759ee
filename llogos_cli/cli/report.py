"""Timings in llama.cpp's shape, plus the memory bandwidth decode achieved."""

from llogos_cli.console import err
from llogos_cli.engine.completion import Timings
from llogos_cli.model.loader import Loaded


def print_stats(loaded: Loaded, t: Timings, seed: int | None = None) -> None:
    def per_token(ms: float, n: int) -> str:
        if n == 0 or ms <= 0:
            return ""
        return f" ({ms / n:8.2f} ms per token, {n / ms * 1e3:8.2f} tokens per second)"

    total_ms = loaded.load_ms + t.prompt_ms + t.predicted_ms
    decoded = max(t.predicted_n - 1, 0)   # the first token came with the prompt; with speculation a run makes several
    lines = [
        f"       load time = {loaded.load_ms:10.2f} ms",
        f"prompt eval time = {t.prompt_ms:10.2f} ms / {t.prompt_n:5d} tokens{per_token(t.prompt_ms, t.prompt_n)}",
        f"       eval time = {t.predicted_ms:10.2f} ms / {t.eval_runs:5d} runs  {per_token(t.predicted_ms, decoded)}",
        f"      total time = {total_ms:10.2f} ms / {t.prompt_n + t.predicted_n:5d} tokens",
    ]
    if loaded.compile_ms:   # a machine's first run: apart, as llama.cpp has nothing to compile
        lines.insert(0, f"    compile time = {loaded.compile_ms:10.2f} ms (CPU kernels, once on this machine; in no other time)")
    if seed is not None:
        lines.insert(0, f"    sampler seed = {seed}")
    if t.draft_n:   # llama-server's wording
        lines.append(f"draft acceptance = {t.draft_n_accepted / t.draft_n:10.5f} ({t.draft_n_accepted} accepted / "
                     f"{t.draft_n} generated)")
    if loaded.memory:
        lines.append(f"          memory = {loaded.memory}")
    weight_bytes = loaded.model.weight_bytes
    if t.eval_runs and t.predicted_ms > 0:
        gbps = weight_bytes * t.eval_runs / (t.predicted_ms / 1e3) / 1e9
        lines.append(f"decode bandwidth = {gbps:10.2f} GB/s ({weight_bytes / 1e6:.0f} MB of "
                     f"{loaded.model.backend.name} weights read per token)")
    err.print("\n" + "\n".join(lines), highlight=False, markup=False, soft_wrap=True)
