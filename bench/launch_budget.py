"""The CUDA backend's launch budget: kernel launches and bytes moved by one decode step (batch 1),
counted under the CPU emulator (tests/emu), for each family fixture and, where cheap, the shapes
of bench/synthetic.py (one layer of each kind, a 256-token vocabulary: a layer's launches and bytes
do not depend on the vocabulary; the LM head's bytes are scaled to the real one).

    python bench/launch_budget.py [--shapes smollm2-135m,llama-1b,qwen35-0.8b] [--json FILE]

Bytes are what each launch's arrays hold, by kind: weights (whole matrices for products; the rows
a lookup reads; an expert matrix's used share), the KV cache (keys and values up to the step's
position, its new row; a recurrent layer's state read and written) and activations (every other
array a launch takes, inputs and outputs alike). Beside each family's launches per layer stand the
ggml graph nodes per layer that llama.cpp's graph build emits for a decode step of that
architecture (LLAMA_CPP_NODES), with and without flash attention.
"""

import argparse
import dataclasses
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llogos_cli.backends.cuda.cuda_backend import CudaBackend  # noqa: E402
from llogos_cli.gguf.file import GGUFFile  # noqa: E402
from llogos_cli.model.forward import Model  # noqa: E402
from tests.conftest import FIXTURES  # noqa: E402
from tests.emu.emulator import EmuKernels  # noqa: E402

REPO_FIXTURES = ROOT / "tests" / "fixtures"
FAMILY_FIXTURES = ["tiny-llama-q8_0", "tiny-qwen2-q8_0", "tiny-qwen3-f32", "tiny-gemma3-q8_0", "tiny-qwen35-f32",
                   "tiny-gemma2-q8_0", "tiny-phi3-q8_0", "tiny-granite-q8_0", "tiny-olmo2-q8_0", "tiny-smollm3-q8_0",
                   "tiny-lfm2-q8_0", "tiny-qwen3moe-q8_0", "tiny-gpt-oss-q8_0", "tiny-qwen2moe-q8_0"]
SHAPES = ["smollm2-135m", "llama-1b", "qwen35-0.8b"]   # llama-8b and the MoE shapes: minutes a layer emulated
DEPTH = 8            # tokens in the cache before the counted step
BUDGET_VOCAB = 256
# Compute nodes per layer of a one-token decode graph in llama.cpp (src/models/<arch>.cpp through
# llm_graph_context's build_norm/build_qkv/build_attn/build_ffn), views (reshape, view, permute,
# transpose) left out as ggml's backends skip them: (flash attention on, off). Llama: rms_norm and
# mul (attn_norm), 3 mul_mat (q, k, v), 2 rope, 2 set_rows (the K and V stores), flash_attn_ext
# (off: mul_mat, soft_max, mul_mat, cont), mul_mat (wo), add, rms_norm and mul (ffn_norm), 2 mul_mat
# (gate, up), glu, mul_mat (down), add = 19 (22). Qwen3 adds q_norm and k_norm (rms_norm and mul
# each) = 23 (26); Gemma 3 adds to that the scale of Q and post_attention_norm and post_ffw_norm
# (rms_norm and mul each) = 28 (31). ggml-cuda then fuses some of them at launch (rms_norm+mul,
# rope+set_rows, the gate and up mul_mat with their glu): Llama's 19 are about 14 launches.
LLAMA_CPP_NODES = {"llama": (19, 22), "qwen3": (23, 26), "gemma3": (28, 31)}


class CountingKernels(EmuKernels):
    """The emulator's provider, keeping each launch's kernel name and arrays."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, list[np.ndarray]]] = []

    def function(self, module: str, name: str):
        launch = super().function(module, name)

        def counted(grid, block, args, shared_mem=0):
            self.calls.append((name, [a for a in args if isinstance(a, np.ndarray)]))
            launch(grid, block, args, shared_mem)
        return counted


@dataclasses.dataclass
class Budget:
    name: str
    arch: str
    n_layer: int
    launches: int            # the whole step
    layer_launches: int      # the layers' (all of them)
    weights: int             # bytes, the whole step
    activations: int
    cache: int
    layer_weights: int       # bytes, the layers' (all of them)
    layer_activations: int
    layer_cache: int
    kernels: dict            # kernel name -> launches in the step

    def per_layer(self, total: int) -> float:
        return total / self.n_layer


def fixture(name: str) -> Path:
    """A family fixture's GGUF: the repository's, else the shared fixtures' (tests/conftest.py)."""
    path = REPO_FIXTURES / f"{name}.gguf"
    return path if path.is_file() else FIXTURES / f"{name}.gguf"


def _within(a: np.ndarray, arrays: list) -> bool:
    return any(np.may_share_memory(a, b) for b in arrays)


def _weight_bytes(name: str, a: np.ndarray, cfg) -> int:
    if name.startswith("get_rows"):    # the embedding table: one row a token
        return a.shape[1]
    if name.startswith("matvec_experts"):
        return a.nbytes * cfg.n_expert_used // cfg.n_expert
    return a.nbytes


def _kv_bytes(cfg, cache, depth: int) -> int:
    """Keys and values an attention step reads up to its position (depth + 1 of them, its window's
    at most) and the row it writes, over the layers with a KV cache."""
    total = 0
    for il in range(cfg.n_layer):
        if cfg.recurrent[il]:
            continue
        kv = cache.kv[il]
        seen = min(depth + 1, cfg.window[il]) if cfg.window[il] else depth + 1
        total += kv.k.shape[1] * (seen + 1) * (kv.k.shape[3] + kv.v.shape[3])
    return total


def budget(path: Path, name: str, depth: int = DEPTH, head_scale: float = 1.0) -> Budget:
    """One decode step of the model at path, one token at position depth, counted."""
    kernels = CountingKernels()
    backend = CudaBackend(kernels)   # the default products, as on a GPU
    model = Model(GGUFFile(path), backend)
    cfg = model.cfg
    cache = model.new_cache(1, depth + 8)
    model.forward_rows(cache, np.arange(depth, dtype=np.int32) % cfg.n_vocab, np.zeros(depth, np.int32),
                       np.arange(depth, dtype=np.int32))
    marks = {}
    embed, decode = backend.embed, model._decode

    def embed_marked(*args):
        out = embed(*args)
        marks["layers"] = len(kernels.calls) + (cfg.embed_scale != 1.0)
        return out

    def decode_marked(*args):
        out = decode(*args)
        marks["end"] = len(kernels.calls)
        return out

    backend.embed, model._decode = embed_marked, decode_marked
    kernels.calls.clear()
    model.forward_rows(cache, np.array([1], np.int32), np.array([0], np.int32), np.array([depth], np.int32))
    weights = [getattr(w, "raw", w) for w in model.w.values()]
    head = getattr(model.w.get(cfg.output), "raw", None)
    state = [getattr(s, f.name) for s in cache.state if s is not None for f in dataclasses.fields(s)]
    stores = [a for kv in cache.kv if kv is not None for a in (kv.k, kv.v)]
    totals = np.zeros((2, 3), np.int64)   # (step, layers) x (weights, activations, cache)
    for i, (kernel, arrays) in enumerate(kernels.calls):
        in_layers = marks["layers"] <= i < marks["end"]
        for a in arrays:
            if _within(a, stores):
                continue
            if _within(a, state):
                kind, n = 2, 2 * a.nbytes
            elif _within(a, weights):
                kind, n = 0, _weight_bytes(kernel, a, cfg)
                if head is not None and not in_layers and np.may_share_memory(a, head) and not kernel.startswith("get_rows"):
                    n = int(n * head_scale)
            else:
                kind, n = 1, a.nbytes
            totals[0, kind] += n
            totals[1, kind] += n * in_layers
    kv = _kv_bytes(cfg, cache, depth)
    totals[:, 2] += kv
    names = [kernel for kernel, _ in kernels.calls]
    return Budget(name, cfg.arch, cfg.n_layer, len(names), marks["end"] - marks["layers"], *map(int, totals[0]),
                  *map(int, totals[1]), {n: names.count(n) for n in sorted(set(names))})


def _synthetic():
    spec = importlib.util.spec_from_file_location("synthetic", ROOT / "bench" / "synthetic.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shape_budget(shape: str, folder: Path) -> tuple[Budget, int]:
    """A synthetic shape's budget with a layer of each kind (a hybrid's four, gpt-oss's two) and a
    small vocabulary; -> (budget, the real model's layer count)."""
    synthetic = _synthetic()
    spec = synthetic.SPECS[shape]
    layers = spec.hybrid.interval if spec.hybrid else 2 if spec.sliding_window else 1
    small = dataclasses.replace(spec, n_layer=layers, n_vocab=BUDGET_VOCAB)
    path = synthetic.write_model(small, folder / f"{shape}-budget.gguf")
    return budget(path, shape, head_scale=spec.n_vocab / BUDGET_VOCAB), spec.n_layer


def _mb(n: float) -> str:
    return f"{n / 1e6:.3f}"


def table(rows: list[tuple[Budget, int]]) -> str:
    """Markdown: per layer and per step (the real layer count) beside llama.cpp's nodes per layer."""
    out = ["| model | arch | launches / layer | llama.cpp nodes / layer (FA on, off) | launches / step "
           "| weights MB / layer | activations KB / layer | KV KB / layer | weights MB / step |",
           "|---|---|---|---|---|---|---|---|---|"]
    for b, n_layer in rows:
        outside = b.launches - b.layer_launches
        step_launches = outside + b.layer_launches * n_layer / b.n_layer
        step_weights = b.weights - b.layer_weights + b.layer_weights * n_layer / b.n_layer
        nodes = LLAMA_CPP_NODES.get(b.arch)
        out.append(f"| {b.name} | {b.arch} | {b.per_layer(b.layer_launches):.2f} | "
                   f"{f'{nodes[0]}, {nodes[1]}' if nodes else '-'} | {step_launches:.0f} | "
                   f"{_mb(b.per_layer(b.layer_weights))} | {b.per_layer(b.layer_activations) / 1e3:.1f} | "
                   f"{b.per_layer(b.layer_cache) / 1e3:.1f} | {_mb(step_weights)} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="bench/synthetic.py shapes, comma-separated ('' for none)")
    parser.add_argument("--families", default=",".join(FAMILY_FIXTURES), help="family fixtures, comma-separated")
    parser.add_argument("--json", type=Path, help="also write every budget (kernel counts included) here")
    args = parser.parse_args()
    rows = []
    for name in filter(None, args.families.split(",")):
        b = budget(fixture(name), name)
        rows.append((b, b.n_layer))
        print(f"{name}: {b.layer_launches} launches in {b.n_layer} layers", file=sys.stderr)
    with tempfile.TemporaryDirectory() as folder:
        for shape in filter(None, args.shapes.split(",")):
            rows.append(shape_budget(shape, Path(folder)))
            print(f"{shape}: {rows[-1][0].kernels}", file=sys.stderr)
    print(f"Decode step, batch 1, at depth {DEPTH}, under the CUDA emulator (default products):\n")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([dict(dataclasses.asdict(b), real_layers=n) for b, n in rows], indent=1))


if __name__ == "__main__":
    main()
