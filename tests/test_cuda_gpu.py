"""The CUDA backend on a GPU: the operation and whole-model checks shared with the emulated tests
(emu/op_suite.py, emu/model_suite.py), and synthetic models of real shapes against the CPU
backend. Skipped without CuPy and a GPU."""

import dataclasses

import numpy as np
import pytest

from llogos_cli.backends import cuda_available
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.forward import Batch, Model
from tests.emu.model_suite import *  # noqa: F401,F403 (the shared whole-model tests)
from tests.emu.model_suite import load_bench, relative
from tests.emu.op_suite import *  # noqa: F401,F403 (the shared operation tests)
from tests.emu.op_suite import CPU

pytestmark = pytest.mark.skipif(not cuda_available(), reason="needs CuPy and a CUDA GPU")


@pytest.fixture(scope="module")
def backend():
    from llogos_cli.backends.cuda_backend import CudaBackend
    return CudaBackend()


@pytest.fixture(scope="module")
def real_shapes(tmp_path_factory) -> dict:
    """SmolLM2-135M as shipped (Q4_1, Q8_0 embeddings), and two layers of Llama-3.1-8B in Q4_K_M."""
    bench, folder = load_bench(), tmp_path_factory.mktemp("models")
    specs = {"smollm2-135m": bench.SPECS["smollm2-135m"],
             "llama-8b-2-layers": dataclasses.replace(bench.SPECS["llama-8b"], n_layer=2)}
    return {name: GGUFFile(bench.write_model(spec, folder / f"{name}.gguf")) for name, spec in specs.items()}


@pytest.mark.parametrize("name", ["smollm2-135m", "llama-8b-2-layers"])
def test_real_shapes_match_the_cpu_backend(backend, real_shapes, name):
    f = real_shapes[name]
    cpu, gpu = Model(f, CPU), Model(f, backend)
    ids = np.random.default_rng(5).integers(2, cpu.cfg.n_vocab, 45).astype(np.int32)
    c_ctx, g_ctx = cpu.new_context(64), gpu.new_context(64, "f32", "f32")  # f32 caches on both
    # A long prompt (f16 GEMMs), then single tokens and a short batch (matrix-vector kernels).
    for chunk, tolerance in ((ids[:40], 3e-3), (ids[40:41], 3e-3), (ids[41:45], 3e-3)):
        want = cpu.forward_seq(c_ctx, chunk, all_logits=True)
        got = backend.to_host(gpu.forward_seq(g_ctx, chunk, all_logits=True))
        assert np.all(np.isfinite(got)) and relative(got, want) < tolerance, len(chunk)
    # Decoding over a prompt that went through the matrix-vector path agrees to float32 accuracy.
    c_ctx, g_ctx = cpu.new_context(64), gpu.new_context(64, "f32", "f32")
    for t in range(6):
        want = cpu.forward_seq(c_ctx, ids[t:t + 1])
        got = backend.to_host(gpu.forward_seq(g_ctx, ids[t:t + 1]))
        assert relative(got, want) < 1e-4, t


@pytest.mark.parametrize("rows", [5, 64])  # decode rows through matrix-vector kernels; through f16 GEMMs
def test_batched_decode_of_real_shapes_matches_the_cpu_backend(backend, real_shapes, rows):
    """Rows of sequences of different lengths, prompts run as one batch (f16 GEMMs), then decode
    steps from the CUDA graph of their bucket with the rows in changing order."""
    f = real_shapes["smollm2-135m"]
    cpu, gpu = Model(f, CPU), Model(f, backend)
    rng = np.random.default_rng(9)
    lengths = rng.integers(1, 12, rows)
    prompts = Batch.join([Batch.run(rng.integers(2, cpu.cfg.n_vocab, n), slot, 0, [n - 1])
                          for slot, n in enumerate(lengths)])
    c_cache, g_cache = cpu.new_cache(rows, 32), gpu.new_cache(rows, 32, "f32", "f32")
    want = cpu.forward(c_cache, prompts)
    assert relative(backend.to_host(gpu.forward(g_cache, prompts)), want) < 3e-3
    step = backend.decoder(gpu, g_cache)
    for _ in range(3):
        slots = rng.permutation(rows).astype(np.int32)
        tokens = rng.integers(2, cpu.cfg.n_vocab, rows).astype(np.int32)
        pos = lengths[slots].astype(np.int32)
        want = cpu.forward_rows(c_cache, tokens, slots, pos)
        got = backend.to_host(step(tokens, slots, pos))
        assert np.all(np.isfinite(got)) and relative(got, want) < 3e-3
        lengths[slots] += 1


def test_greedy_generation_matches_the_cpu_backend_but_for_near_ties(backend, real_shapes):
    f = real_shapes["smollm2-135m"]
    cpu, gpu = Model(f, CPU), Model(f, backend)
    c_ctx, g_ctx = cpu.new_context(64, "f16", "f16"), gpu.new_context(64, "f16", "f16")
    prompt = np.array([2, 300, 4000, 12345], np.int32)
    c_logits, g_logits = cpu.forward_seq(c_ctx, prompt)[-1], gpu.forward_seq(g_ctx, prompt)
    step, slot = backend.decoder(gpu, g_ctx.cache), np.zeros(1, np.int32)
    for n in range(24):
        want, got = int(np.argmax(c_logits)), int(backend.argmax_rows(g_logits)[0])
        if got != want:  # allowed only where the CPU's best two are within float error
            top2 = np.sort(c_logits)[-2:]
            assert top2[1] - top2[0] < 1e-3 * np.abs(c_logits).max(), n
            break
        c_logits = cpu.forward_seq(c_ctx, np.array([want], np.int32))[-1]
        g_logits = step(np.array([got], np.int32), slot, np.array([len(prompt) + n], np.int32))
