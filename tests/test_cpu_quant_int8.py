"""Products with 8-bit activations (cpu_quant_int8): the two-byte quantization of the activations,
and every plain block type's product on each instruction set this CPU has (AVX2 forced on a VNNI
machine too), against float64: equal to the weights times the quantized activations up to float32
rounding, and within the quantization's bound of the float32 product."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import quants as gguf_quants

from bench.synthetic_gguf import random_rows
from llogos_cli.backends import cpu_quant, cpu_quant_int8
from llogos_cli.backends.cpu_quant import choose_isa
from llogos_cli.backends.cpu_simd_int8 import ISA_ARG, host_isa
from llogos_cli.errors import LlogosError
from llogos_cli.model.loader import load
from tests.conftest import FIXTURES, need, relative_error

BLOCK = cpu_quant_int8.BLOCK
ISAS = [isa for isa in ISA_ARG if host_isa() == "vnni" or (host_isa() == "avx2" and isa == "avx2")]


def _quantize(x: np.ndarray):
    n_blocks = x.shape[1] // BLOCK
    xq = np.empty((x.shape[0], 2 * x.shape[1]), np.int8)
    dx, sx = np.empty((x.shape[0], n_blocks), np.float32), np.empty((x.shape[0], n_blocks), np.float32)
    xl = np.empty((x.shape[0], x.shape[1] // cpu_quant_int8.LANE), np.int32)
    cpu_quant_int8.quantize_blocks(x, xq, dx, sx, xl)
    return xq, dx, sx, xl


def _dequantized(xq, dx) -> np.ndarray:
    """What the two bytes of each element stand for, in float64."""
    blocks = xq.reshape(xq.shape[0], -1, 2, BLOCK).astype(np.float64)
    return ((blocks[:, :, 0] + blocks[:, :, 1] / 254) * dx[:, :, None]).reshape(xq.shape[0], -1)


def test_activations_are_held_within_a_508th_of_a_step():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 8 * BLOCK)).astype(np.float32) * np.float32(4)
    x[1, :BLOCK] = 0                           # an all-zero block
    x[2, 5] = 3000                             # an outlier, as Gemma's activations have
    x[0, BLOCK:2 * BLOCK] = np.float32(1e-30)  # tiny values keep their scale
    xq, dx, sx, xl = _quantize(x)
    assert dx[1, 0] == 0 and (xq[1, :2 * BLOCK] == 0).all() and sx[1, 0] == 0
    back = _dequantized(xq, dx)
    step = np.repeat(dx.astype(np.float64), BLOCK, axis=1)
    assert (np.abs(back - x) <= step / 508 * 1.0001).all()
    hi = xq.reshape(3, -1, 2, BLOCK)[:, :, 0]
    assert np.abs(hi).max() == 127 and np.abs(xq).max() <= 127
    np.testing.assert_allclose(sx, back.reshape(3, -1, BLOCK).sum(axis=2), rtol=1e-6, atol=1e-30)
    whole = (254 * xq.reshape(3, -1, 2, BLOCK)[:, :, 0].astype(np.int64) + xq.reshape(3, -1, 2, BLOCK)[:, :, 1])
    assert (xl == whole.reshape(3, -1, cpu_quant_int8.LANE).sum(axis=2)).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n_tok", [1, cpu_quant.INT8_MAX_TOKENS])
@pytest.mark.parametrize("qtype", sorted(cpu_quant_int8.TYPES, key=int), ids=lambda t: t.name)
def test_products_are_the_quantized_activations_times_the_weights(qtype, n_tok, isa):
    rng = np.random.default_rng(int(qtype) * 10 + n_tok)
    rows, cols = 37, 3 * GGML_QUANT_SIZES[qtype][0] * (3 if GGML_QUANT_SIZES[qtype][0] == BLOCK else 1)   # odd block counts
    raw = random_rows(qtype, rows, cols, rng)
    raw.flags.writeable = False                        # as memory-mapped weights are
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    x[0, :BLOCK] *= 50                                  # blocks of very different scales
    w = gguf_quants.dequantize(raw, qtype).astype(np.float64)
    ours = cpu_quant.QuantMatmul(isa)(x, raw, qtype)
    assert ours.shape == (n_tok, rows) and ours.dtype == np.float32
    xq, dx, _, _ = _quantize(x)
    assert relative_error(ours, _dequantized(xq, dx) @ w.T) < 1e-5          # float32 rounding only
    bound = np.abs(w) @ np.repeat(dx.astype(np.float64), BLOCK, axis=1).T / 508   # (rows, T)
    exact = x.astype(np.float64) @ w.T
    assert (np.abs(ours - exact) <= bound.T + 1e-5 * np.abs(exact).max()).all()


@pytest.mark.parametrize("isa", ISAS)
def test_instruction_sets_agree(isa):
    rng = np.random.default_rng(11)
    qtype = sorted(cpu_quant_int8.TYPES, key=int)[0]
    raw = random_rows(qtype, 20, 4 * BLOCK, rng)
    x = rng.standard_normal((2, 4 * BLOCK)).astype(np.float32)
    theirs = cpu_quant.QuantMatmul("float")(x, raw, qtype)
    assert relative_error(cpu_quant.QuantMatmul(isa)(x, raw, qtype), theirs) < 1e-3


def test_the_instruction_set_can_be_chosen_and_is_checked(monkeypatch):
    assert choose_isa(None) == (host_isa() or "float")
    assert choose_isa("float") == "float"
    with pytest.raises(LlogosError, match="not one of"):
        choose_isa("sse9")
    monkeypatch.setenv("LLOGOS_CPU_ISA", "float")
    assert cpu_quant.QuantMatmul().isa == "float"


def test_stats_say_which_products_decode(monkeypatch):
    tiny = str(need(FIXTURES / "tiny-llama-q8_0.gguf"))
    for isa, words in (("float", "float32 products"), *((i, "integer products") for i in ISAS)):
        monkeypatch.setenv("LLOGOS_CPU_ISA", isa)
        assert words in load(tiny, "cpu", "quantized", n_ctx=64).memory
    assert "products" not in load(tiny, "cpu", "f32", n_ctx=64).memory
