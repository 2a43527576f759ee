"""The CPU's quantized matmul: kernels against gguf.quants.dequantize and a float64 product, and
whole models run from their blocks against the float32 path (the reference)."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType
from gguf import quants as gguf_quants

from bench.synthetic_gguf import random_rows
from llogos_cli.backends.cpu import cpu_quant, cpu_rows
from llogos_cli.backends.cpu.cpu_quant_dequant import TYPES
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.engine.perplexity import perplexity
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.forward import Model
from llogos_cli.model.loader import open_model
from tests.conftest import FIXTURES, REFERENCE, model_path, need, reference, relative_error

# Token counts that take the matvec kernels (1, DOT_MAX_TOKENS) and the expanded tiles.
TOKENS = (1, cpu_quant.DOT_MAX_TOKENS, cpu_quant.DOT_MAX_TOKENS + 3)


def _cols(qtype: QType) -> int:
    """Row lengths off every power of two: three blocks (5 blocks of 32 for the plain types), or
    37 elements for the float types, which have no blocks."""
    block = GGML_QUANT_SIZES[qtype][0]
    return 37 if block == 1 else block * (3 if block == 256 else 5)


@pytest.mark.parametrize("n_tok", TOKENS)
@pytest.mark.parametrize("qtype", sorted(TYPES, key=int), ids=lambda t: t.name)
def test_product_matches_dequantize_and_float64(qtype, n_tok, monkeypatch):
    monkeypatch.setattr(cpu_quant, "TILE_ELEMENTS", 7 * _cols(qtype))   # several tiles, the last one short
    monkeypatch.setattr(cpu_rows, "MIN_WEIGHTS", 0)                      # tiles of any size to cpu_rows
    rng = np.random.default_rng(int(qtype) * 10 + n_tok)
    rows, cols = 37, _cols(qtype)    # rows: more than one kernel chunk (16), not a multiple of it
    raw = random_rows(qtype, rows, cols, rng)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    expected = x.astype(np.float64) @ gguf_quants.dequantize(raw, qtype).astype(np.float64).T
    ours = cpu_quant.QuantMatmul("float")(x, raw, qtype)   # the 8-bit activations' products: test_cpu_quant_int8
    assert ours.shape == (n_tok, rows) and ours.dtype == np.float32
    assert relative_error(ours, expected) < 1e-5


def test_int16_parts_hold_the_activations_to_float32_precision():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 512)).astype(np.float32) * np.float32(5)
    x[1, :256] = 0                                   # an all-zero block keeps zero scales
    x[2, 3] = 4000                                   # an outlier, as Gemma's activations have
    q, scale = cpu_quant.quantize_rows(x)
    assert q.dtype == np.int16 and q.shape == (3, 2, 512) and scale.shape == (3, 2, 2)
    assert (scale[1, :, 0] == 0).all() and np.abs(q[:, 0]).max() == 32767
    back = (q.reshape(3, 2, 2, 256).astype(np.float64) * scale[:, :, :, None]).sum(axis=1)
    largest = np.abs(x.reshape(3, 2, 256)).max(axis=2, keepdims=True)
    assert (np.abs(back - x.reshape(3, 2, 256)) <= largest * 2.0 ** -30).all()


# ------------------------------------------------------------------ whole models

def _both(path) -> tuple[Model, Model]:
    f = GGUFFile(path)
    return Model(f, NumpyBackend("f32")), Model(f, NumpyBackend("quantized"))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_q8_0_fixtures_quantized_match_f32_path(name, monkeypatch):
    """With float32 activations (LLOGOS_CPU_ISA=float) the products of the weights in their blocks
    are the f32 path's up to rounding, prompt and decode; with the integer products every decisive
    choice of the next token (a lead of 0.5 or more) stays the same."""
    path = need(FIXTURES / f"{name}-q8_0.gguf")
    f32, integer = _both(path)
    monkeypatch.setenv("LLOGOS_CPU_ISA", "float")
    exact = Model(GGUFFile(path), NumpyBackend("quantized"))
    ids = np.load(need(FIXTURES / f"{name}-q8_0.oracle.npz"))["ids"].astype(np.int32)
    prefill = [m.forward_seq(m.new_context(64), ids, all_logits=True) for m in (f32, exact, integer)]
    assert relative_error(prefill[1], prefill[0]) < 1e-3
    top2 = np.sort(prefill[0], axis=-1)[:, -2:]
    decisive = top2[:, 1] - top2[:, 0] >= 0.5
    assert (prefill[2].argmax(-1) == prefill[0].argmax(-1))[decisive].all()
    ctx = [m.new_context(64) for m in (f32, exact, integer)]
    decode = [np.stack([m.forward_seq(c, ids[i:i + 1])[0] for i in range(len(ids))])
              for m, c in zip((f32, exact, integer), ctx)]
    assert relative_error(decode[1], decode[0]) < 1e-3
    assert (decode[2].argmax(-1) == decode[0].argmax(-1))[decisive].all()


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def real(request):
    name = request.param
    return name, *_both(model_path(name)), open_model(name).tokenizer, reference(name)


@pytest.fixture(scope="module")
def float_activations(real):
    """The quantized weights' products with float32 activations (LLOGOS_CPU_ISA=float)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLOGOS_CPU_ISA", "float")
        return Model(GGUFFile(model_path(real[0])), NumpyBackend("quantized"))


def test_real_models_quantized_match_f32_path(real, float_activations):
    """With float32 activations the quantized weights' products are the f32 path's up to rounding;
    with the integer products (8-bit activations, the default where the CPU has them) every
    decisive choice of the next token (a lead of 0.5 or more) stays the same."""
    name, f32, quantized, _, ref = real
    for case in ref["generation"][:2]:
        ids = np.asarray(case["prompt_ids"] + case["llamacpp"]["generated_ids"], np.int32)
        a = f32.forward_seq(f32.new_context(256), ids, all_logits=True)
        top2 = np.sort(a, axis=-1)[:, -2:]
        decisive = top2[:, 1] - top2[:, 0] >= 0.5
        b = quantized.forward_seq(quantized.new_context(256), ids, all_logits=True)
        assert (a.argmax(-1) == b.argmax(-1))[decisive].all(), (name, case["id"])
        ctx = quantized.new_context(256)   # the decode kernels, one token at a time
        quantized.forward_seq(ctx, ids[:-3])
        steps = np.stack([quantized.forward_seq(ctx, ids[i:i + 1])[0] for i in range(len(ids) - 3, len(ids))])
        assert (a[-3:].argmax(-1) == steps.argmax(-1))[decisive[-3:]].all(), (name, case["id"])
        b = float_activations.forward_seq(float_activations.new_context(256), ids, all_logits=True)
        assert relative_error(b, a) < 1e-3, (name, case["id"])
        ctx = float_activations.new_context(256)
        float_activations.forward_seq(ctx, ids[:-3])
        steps = np.stack([float_activations.forward_seq(ctx, ids[i:i + 1])[0] for i in range(len(ids) - 3, len(ids))])
        assert relative_error(steps, a[-3:]) < 1e-3, (name, case["id"])


# How far the default products' perplexity may be from the exact path's over reference/ppl.txt
# (n_ctx 128, the whole text): 8-bit activations round a value to the other side of a step when
# anything before them rounds differently, so the figure moves with BLAS' kernels (Gemma 3 270M:
# +0.19% with OpenBLAS' Zen kernels, +0.54% with OPENBLAS_CORETYPE=Haswell); llama.cpp's own
# activations put its perplexity 0.61% above the exact one on this text.
PPL_TOLERANCE = 0.01


def test_real_models_perplexity_close_to_the_exact_path(real):
    name, f32, quantized, tok, _ = real
    text = need(REFERENCE / "ppl.txt").read_text(encoding="utf-8")
    ppl = [perplexity(m, tok, text, 128).ppl for m in (f32, quantized)]
    assert abs(ppl[1] / ppl[0] - 1) < PPL_TOLERANCE, (name, ppl)
