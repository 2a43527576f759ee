"""CUDA benchmark on synthetic models with the shapes and tensor types of real ones.

    python bench/bench_cuda.py [--models smollm2-135m,llama-1b,llama-8b] [--dir DIR] [--json FILE]

Each model is written once as a GGUF of random weights (under --dir), loaded on the GPU, and
measured: decode tok/s at batch 1 (eager, and replayed from a CUDA graph), prefill tok/s of a
512-token prompt, time to first token, the bandwidth decode achieves (weight bytes read per token
/ time per token) against the card's device-to-device copy bandwidth, and per-kernel GPU times of
one decode step and one prefill. Prints Markdown tables for docs/PERF.md.
"""

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q, GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llogos_cli.gguf_file import GGUFFile  # noqa: E402
from llogos_cli.model import Model  # noqa: E402

PROMPT_TOKENS = 512
DECODE_TOKENS = 128
FORMAT_VERSION = 1  # bump to regenerate cached files


@dataclass(frozen=True)
class Spec:
    name: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_kv: int
    n_ff: int
    rope_base: float
    tied: bool          # the LM head is token_embd
    mix: str            # "q4_1" (SmolLM2 as shipped) or "q4_k_m"

    def qtype(self, name: str, layer: int) -> Q:
        if self.mix == "q4_1":
            return Q.Q8_0 if name == "token_embd" else Q.Q4_1
        if name == "output" or (name == "token_embd" and self.tied):
            return Q.Q6_K
        # llama.cpp's Q4_K_M spends 6 bits on attn_v and ffn_down in the first and last eighth of
        # the layers and every third layer between.
        n = self.n_layer
        more_bits = layer < n // 8 or layer >= 7 * n // 8 or (layer - n // 8) % 3 == 2
        return Q.Q6_K if name in ("attn_v", "ffn_down") and more_bits else Q.Q4_K


SPECS = {
    "smollm2-135m": Spec("smollm2-135m", 49152, 576, 30, 9, 3, 1536, 100000.0, True, "q4_1"),
    "llama-1b": Spec("llama-1b", 128256, 2048, 16, 32, 8, 8192, 500000.0, True, "q4_k_m"),
    "llama-8b": Spec("llama-8b", 128256, 4096, 32, 32, 8, 14336, 500000.0, False, "q4_k_m"),
}

# Values of the float16 scale fields per block type (byte offset, value): weights of standard
# deviation ~0.02 centred near 0, like a trained model's, so activations stay finite.
_SCALES = {Q.Q8_0: ((0, 2.7e-4),), Q.Q4_0: ((0, 4.3e-3),), Q.Q4_1: ((0, 4.3e-3), (2, -0.032)),
           Q.Q5_0: ((0, 2.2e-3),), Q.Q5_1: ((0, 2.2e-3), (2, -0.034)), Q.Q4_K: ((0, 1.4e-4), (2, 1.0e-3)),
           Q.Q5_K: ((0, 7e-5), (2, 1.1e-3)), Q.Q6_K: ((208, 1.7e-5),)}


class RandomBytes:
    """Random bytes cut from one 64 MiB pool at random offsets: fast enough for 5 GB of weights."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.size = 64 << 20
        self.pool = np.tile(self.rng.integers(0, 256, self.size, dtype=np.uint8), 2)

    def take(self, n: int) -> np.ndarray:
        """n bytes, a copy (the pool repeats in tensors over 64 MiB)."""
        start = int(self.rng.integers(0, self.size))
        run = self.pool[start:start + min(n, self.size)]
        return run.copy() if n <= self.size else np.resize(run, n)


def random_matrix(src: RandomBytes, qtype: Q, rows: int, cols: int) -> np.ndarray:
    """GGUF bytes (rows, bytes per row) of random weights."""
    if qtype in (Q.F32, Q.F16):
        return (src.rng.standard_normal((rows, cols), np.float32) * 0.02).astype(
            np.float32 if qtype == Q.F32 else np.float16).view(np.uint8)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = src.take(rows * cols // block * size).reshape(-1, size)
    for offset, value in _SCALES[qtype]:
        raw[:, offset:offset + 2] = np.array([value], np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def write_model(spec: Spec, path: Path) -> Path:
    """Write spec's GGUF of random weights to path (atomically); return path."""
    head_dim = spec.n_embd // spec.n_head
    w = GGUFWriter(str(path) + ".tmp", "llama")
    w.add_name(f"synthetic {spec.name}")
    w.add_context_length(8192)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_kv)
    w.add_rope_freq_base(spec.rope_base)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(spec.n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"<t{i}>" for i in range(spec.n_vocab)])
    w.add_token_types([1] * spec.n_vocab)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)

    src = RandomBytes()

    def matrix(name: str, layer: int, rows: int, cols: int, prefix: str = ""):
        qtype = spec.qtype(name, layer)
        w.add_tensor(f"{prefix}{name}.weight", random_matrix(src, qtype, rows, cols), raw_dtype=qtype)

    def norm(name: str):
        w.add_tensor(name, (1 + 0.1 * src.rng.standard_normal(spec.n_embd)).astype(np.float32))

    matrix("token_embd", 0, spec.n_vocab, spec.n_embd)
    norm("output_norm.weight")
    if not spec.tied:
        matrix("output", 0, spec.n_vocab, spec.n_embd)
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight")
        norm(p + "ffn_norm.weight")
        for name, rows, cols in (("attn_q", spec.n_head * head_dim, spec.n_embd),
                                 ("attn_k", spec.n_kv * head_dim, spec.n_embd),
                                 ("attn_v", spec.n_kv * head_dim, spec.n_embd),
                                 ("attn_output", spec.n_embd, spec.n_head * head_dim),
                                 ("ffn_gate", spec.n_ff, spec.n_embd), ("ffn_up", spec.n_ff, spec.n_embd),
                                 ("ffn_down", spec.n_embd, spec.n_ff)):
            matrix(name, il, rows, cols, p)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(str(path) + ".tmp", path)
    return path


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


def bench_model(spec: Spec, folder: Path, bandwidth: float) -> dict:
    import cupy

    from llogos_cli.backends.cuda_backend import CudaBackend
    from llogos_cli.backends.cuda_graph import DecodeGraph

    path = folder / f"{spec.name}-v{FORMAT_VERSION}.gguf"
    if not path.is_file():
        t = time.perf_counter()
        write_model(spec, path)
        print(f"wrote {path} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
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
        logits = model.forward(ctx, ids[:PROMPT_TOKENS])
        b.synchronize()
        t1 = time.perf_counter()
        b.argmax(logits[-1])
        return t1 - t0, time.perf_counter() - t0

    def decode(graph: bool):
        ctx = model.new_context(n_ctx, "f16", "f16")
        token = b.argmax(model.forward(ctx, ids[:16])[-1])
        step = DecodeGraph(model, ctx).step if graph else (lambda tok: model.forward(ctx, np.array([tok], np.int32)))
        token = b.argmax(step(token)[-1])  # first step: capture, warm caches
        t0 = time.perf_counter()
        for _ in range(DECODE_TOKENS):
            token = b.argmax(step(token)[-1])  # one id to the host per token, as generation does
        return DECODE_TOKENS / (time.perf_counter() - t0)

    prefill()  # compile kernels, initialize cuBLAS
    prefill_s, ttft_s = min(prefill() for _ in range(3))
    eager, graphed = decode(False), decode(True)
    best = max(eager, graphed)

    ctx = model.new_context(n_ctx, "f16", "f16")
    model.forward(ctx, ids[:16])
    b.synchronize()
    with KernelTimes(b) as decode_kernels:
        t0 = time.perf_counter()
        model.forward(ctx, ids[16:17])
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
        "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(SPECS))
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "llogos-bench")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from llogos_cli.backends import cuda_available
    if not cuda_available():
        sys.exit("bench_cuda needs CuPy and a CUDA GPU")
    import cupy

    args.dir.mkdir(parents=True, exist_ok=True)
    bandwidth = copy_bandwidth(cupy)
    results = [bench_model(SPECS[name], args.dir, bandwidth) for name in args.models.split(",")]
    print(f"device: {results[0]['device']}, device-to-device copy: {bandwidth:.0f} GB/s\n")
    print("| model | weights GB | prefill 512 tok/s | TTFT ms | decode tok/s (eager / graph) | decode GB/s | of copy BW |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['model']} | {r['weights_GB']:.2f} | {r['prefill_tok_s']:.0f} | {r['ttft_ms']:.1f} | "
              f"{r['decode_tok_s_eager']:.0f} / {r['decode_tok_s_graph']:.0f} | {r['decode_GB_s']:.0f} | "
              f"{100 * r['decode_bandwidth_share']:.0f}% |")
    print("\nTargets on an H100: llama-8b decode at >= 50% of the copy bandwidth and prefill >= 3,000 tok/s; "
          "smollm2-135m decode >= 500 tok/s.")
    for r in results:
        for phase in ("decode", "prefill"):
            print(f"\n{r['model']}, {phase} kernels:\n\n| kernel | launches | ms |\n|---|---|---|")
            for name, count, ms in r[f"{phase}_kernels"][:15]:
                print(f"| {name} | {count} | {ms:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
