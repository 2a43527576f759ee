"""Whole-model checks of the CUDA backend against the NumPy backend, on the tiny fixture models,
run under the CPU emulator (test_cuda_emulated.py) and on a GPU (test_cuda_gpu.py), which import
these tests and supply the `backend` fixture."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from llogos_cli.backends import cuda_matmul
from llogos_cli.backends.cuda_graph import DecodeGraph
from llogos_cli.backends.numpy_backend import NumpyBackend
from llogos_cli.gguf_file import GGUFFile
from llogos_cli.model import Model
from tests.conftest import FIXTURES, need

MODELS = ["tiny-llama-f32", "tiny-llama-q8_0", "tiny-qwen2-q8_0", "tiny-qwen3-f32", "tiny-gemma3-q8_0",
          "tiny-qwen35-f32"]
# Both backends round cache entries identically, but activations an f32 rounding apart can round
# to neighbouring f16 values: with f16 caches the two agree to about an f16 step.
CACHE_TOLERANCE = {"f32": 2e-5, "f16": 5e-4}


def model_pair(name: str, backend) -> tuple[Model, Model]:
    f = GGUFFile(need(FIXTURES / f"{name}.gguf"))
    return Model(f, NumpyBackend()), Model(f, backend)


def load_bench():
    """bench/bench_cuda.py as a module, for its synthetic models of real shapes."""
    spec = importlib.util.spec_from_file_location("bench_cuda", Path(__file__).resolve().parents[2] / "bench" / "bench_cuda.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def relative(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("cache", CACHE_TOLERANCE)
def test_model_logits_match_the_cpu_backend(backend, name, cache):
    cpu, gpu = model_pair(name, backend)
    ids = np.random.default_rng(2).integers(0, cpu.cfg.n_vocab, 24)
    c_ctx, g_ctx = cpu.new_context(32, cache, cache), gpu.new_context(32, cache, cache)
    for chunk in (ids[:19], ids[19:20], ids[20:24]):  # prompt (GEMM attention), decode, short batch
        want = cpu.forward(c_ctx, chunk, all_logits=True)
        got = backend.to_host(gpu.forward(g_ctx, chunk, all_logits=True))
        assert relative(got, want) < CACHE_TOLERANCE[cache], len(chunk)


@pytest.mark.parametrize("cache", ["f32", "q8_0"])
def test_long_prompt(backend, cache):
    """Past GEMM_MIN_TOKENS the products go through f16 GEMMs: agreement to ~1e-3, and q8_0 caches
    then round some entries to the neighbouring step."""
    cpu, gpu = model_pair("tiny-gemma3-q8_0", backend)  # head size 32 (q8_0 cache), sliding window
    ids = np.random.default_rng(3).integers(0, cpu.cfg.n_vocab, cuda_matmul.GEMM_MIN_TOKENS + 8)
    got = backend.to_host(gpu.forward(gpu.new_context(64, cache, cache), ids, all_logits=True))
    want = cpu.forward(cpu.new_context(64, cache, cache), ids, all_logits=True)
    assert relative(got, want) < {"f32": 3e-3, "q8_0": 2e-2}[cache]
    assert np.mean(got.argmax(1) == want.argmax(1)) > 0.9


@pytest.mark.parametrize("name", ["tiny-llama-q8_0", "tiny-qwen2-f32", "tiny-gemma3-f32", "tiny-qwen35-f32"])
def test_greedy_generation_matches_the_oracle(backend, name):
    family, quant = name.rsplit("-", 1)
    oracle = np.load(need(FIXTURES / (f"{family}.oracle.npz" if quant == "f32" else f"{name}.oracle.npz")))
    _, gpu = model_pair(name, backend)
    ctx = gpu.new_context(64)
    logits = gpu.forward(ctx, oracle["greedy_prefix"].astype(np.int32))
    out = []
    for _ in range(len(oracle["greedy"])):
        out.append(backend.argmax(logits[-1]))
        logits = gpu.forward(ctx, np.array(out[-1:], np.int32))
    assert out == oracle["greedy"].tolist()


@pytest.mark.parametrize("name", ["tiny-llama-f32", "tiny-qwen3-f32", "tiny-gemma3-q8_0"])
def test_decode_graph_replays_eager_decoding(backend, name):
    _, gpu = model_pair(name, backend)
    ids = np.random.default_rng(4).integers(0, gpu.cfg.n_vocab, 12).astype(np.int32)
    eager_ctx, graph_ctx = gpu.new_context(32, "f16", "f16"), gpu.new_context(32, "f16", "f16")
    gpu.forward(eager_ctx, ids[:5])
    gpu.forward(graph_ctx, ids[:5])
    graph = DecodeGraph(gpu, graph_ctx)
    for i in range(5, 12):  # positions 5..11; the window of gemma3's local layers (8) starts sliding
        want = backend.to_host(gpu.forward(eager_ctx, ids[i:i + 1]))
        got = backend.to_host(graph.step(int(ids[i])))
        np.testing.assert_array_equal(got, want)
        assert graph_ctx.n_past == eager_ctx.n_past == i + 1


def test_engine_greedy_generation_matches_the_cpu_backend(backend):
    """The engine's path on this backend: its decode step (a CUDA graph) and the argmax where the
    logits are, so only token ids cross to the host."""
    from llogos_cli.engine import Generation, Session, StopCriteria
    from llogos_cli.sampling import Sampler, SamplingParams
    from llogos_cli.tokenizer import Tokenizer

    f = GGUFFile(need(FIXTURES / "tiny-llama-q8_0.gguf"))
    oracle = np.load(need(FIXTURES / "tiny-llama-q8_0.oracle.npz"))
    runs = []
    for b in (NumpyBackend(), backend):
        session = Session(Model(f, b), 64, ("f32", "f32"))
        gen = Generation(session, Tokenizer.from_gguf(f), oracle["greedy_prefix"].tolist(),
                         Sampler(SamplingParams(temp=0.0), 64),
                         StopCriteria(n_predict=len(oracle["greedy"]), ignore_eos=True))
        runs.append([t.id for t in gen])
    assert runs[0] == runs[1] == oracle["greedy"].tolist()
