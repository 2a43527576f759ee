"""Tiny random-weight models of each family against HF transformers' float32 logits: those of
../shared/fixtures and those committed in tests/fixtures (made by tests/fixtures/make_fixtures.py;
their families' own traits are tested in test_model_families.py)."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.forward import Model
from tests.conftest import EXACT_KV, FIXTURES, copy_gguf, need, relative_error

COMMITTED = Path(__file__).resolve().parent / "fixtures"
FAMILIES = ["tiny-gemma2", "tiny-phi3", "tiny-phi3-longrope", "tiny-granite", "tiny-olmo2", "tiny-smollm3", "tiny-lfm2",
            "tiny-qwen3moe", "tiny-gpt-oss", "tiny-qwen2moe"]
CASES = [("tiny-llama", "f32"), ("tiny-llama", "q8_0"), ("tiny-qwen2", "f32"), ("tiny-qwen2", "q8_0"),
         ("tiny-qwen3", "f32"), ("tiny-gemma3", "f32"), ("tiny-gemma3", "q8_0"), ("tiny-qwen35", "f32"),
         *((name, quant) for name in FAMILIES for quant in ("f32", "q8_0")),
         ("tiny-gpt-oss", "mxfp4")]   # experts in MXFP4, as gpt-oss is published


def load(name: str, quant: str = "f32") -> tuple[Model, dict]:
    folder = COMMITTED if name in FAMILIES else FIXTURES
    model = Model(GGUFFile(need(folder / f"{name}-{quant}.gguf")), NumpyBackend())
    suffix = "" if quant == "f32" else f"-{quant}"
    return model, dict(np.load(need(folder / f"{name}{suffix}.oracle.npz")))



@pytest.mark.parametrize("name,quant", CASES)
def test_prefill_logits_match_oracle(name, quant):
    model, oracle = load(name, quant)
    logits = model.forward_seq(model.new_context(64, *EXACT_KV), oracle["ids"].astype(np.int32), all_logits=True)
    assert relative_error(logits, oracle["logits"]) < 1e-4


@pytest.mark.parametrize("name,quant", CASES)
def test_decode_one_token_at_a_time_matches_oracle(name, quant):
    model, oracle = load(name, quant)
    ctx = model.new_context(64, *EXACT_KV)
    rows = [model.forward_seq(ctx, oracle["ids"][i:i + 1].astype(np.int32))[0] for i in range(len(oracle["ids"]))]
    assert relative_error(np.stack(rows), oracle["logits"]) < 1e-4


@pytest.mark.parametrize("name,quant", CASES)
def test_greedy_continuation_matches_oracle(name, quant):
    model, oracle = load(name, quant)
    ctx = model.new_context(64, *EXACT_KV)
    logits = model.forward_seq(ctx, oracle["greedy_prefix"].astype(np.int32))[-1]
    generated = []
    for _ in range(len(oracle["greedy"])):
        generated.append(int(np.argmax(logits)))
        logits = model.forward_seq(ctx, np.array(generated[-1:], dtype=np.int32))[-1]
    assert generated == oracle["greedy"].tolist()


def test_sliding_window_changes_gemma3_logits():
    """The fixture's window (8) is shorter than its 20 ids, so ignoring it must change the output."""
    model, oracle = load("tiny-gemma3", "f32")
    assert set(model.cfg.window) == {8}
    model.cfg = dataclasses.replace(model.cfg, window=(0,) * model.cfg.n_layer)
    logits = model.forward_seq(model.new_context(64, *EXACT_KV), oracle["ids"].astype(np.int32), all_logits=True)
    assert relative_error(logits[:8], oracle["logits"][:8]) < 1e-4
    assert relative_error(logits[8:], oracle["logits"][8:]) > 1e-2


def test_rope_freqs_divide_each_pairs_frequency(tmp_path):
    """Llama 3.1+ GGUFs carry rope_freqs.weight, one divisor per rotated pair. Dividing every
    frequency by 2 is what linear rope scaling by 2 does, so the two files must agree."""
    src = need(FIXTURES / "tiny-llama-f32.gguf")
    ids = np.load(need(FIXTURES / "tiny-llama.oracle.npz"))["ids"].astype(np.int32)
    plain = Model(GGUFFile(src), NumpyBackend())
    half = plain.cfg.rope_dims // 2
    with_factors = copy_gguf(src, tmp_path / "factors.gguf",
                             tensors={"rope_freqs.weight": (np.full(half, 2.0, np.float32), None)})
    scaled = copy_gguf(src, tmp_path / "linear.gguf",
                       meta={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0})

    def logits(model: Model) -> np.ndarray:
        return model.forward_seq(model.new_context(32, *EXACT_KV), ids, all_logits=True)

    by_factors = logits(Model(GGUFFile(with_factors), NumpyBackend()))
    np.testing.assert_allclose(by_factors, logits(Model(GGUFFile(scaled), NumpyBackend())), rtol=1e-5, atol=1e-5)
    assert relative_error(by_factors, logits(plain)) > 1e-3
