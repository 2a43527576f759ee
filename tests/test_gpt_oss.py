"""gpt-oss's own traits on tests/fixtures/tiny-gpt-oss (its logits against transformers' are in
test_model_fixtures.py): attention sinks, YaRN, the clamped SwiGLU, biases on every projection and
expert, alternating sliding windows. Each is shown to matter: without it the logits move far past
the oracle's tolerance."""

import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from llogos_cli.backends.cpu.numpy_attention import batch_layout
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.config import ModelConfig
from llogos_cli.model.forward import Model
from llogos_cli.model.yarn import yarn_rotation
from tests.conftest import EXACT_KV, assert_decisive_choices_kept, copy_gguf, relative_error
from tests.test_model_fixtures import COMMITTED, load


def prefill(model, ids) -> np.ndarray:   # against the float32 oracle: float32 keys and values
    return model.forward_seq(model.new_context(64, *EXACT_KV), np.asarray(ids, np.int32), all_logits=True)


def test_config_reads_gpt_oss():
    model, _ = load("tiny-gpt-oss")
    c = model.cfg
    assert c.window == (8, 0, 8) and c.rope_neox and c.rope_yarn and c.rope_freq_scale == (0.25,) * 3
    assert (c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_ctx_orig) == (4, 2, 128, 64)
    assert (c.swiglu_limit, c.swiglu_alpha, c.ffn_norm) == (7.0, 1.702, "post_attention_norm")
    assert all(f"blk.{il}.attn_sinks.weight" in model.w for il in range(c.n_layer))


def _drop(suffix: str):
    def drop(model):
        for name in [n for n in model.w if n.endswith(suffix)]:
            del model.w[name]
    return drop


TRAITS = {
    "attention sinks": dict(mutate=_drop(".attn_sinks.weight")),
    "experts' biases": dict(mutate=_drop("_exps.bias")),
    "router bias": dict(mutate=_drop("ffn_gate_inp.bias")),
    "output projection bias": dict(mutate=_drop("attn_output.bias")),
    "YaRN (linear scaling instead)": dict(mutate=lambda model: setattr(model, "_yarn", None)),
    "SwiGLU clamp": dict(change=dict(swiglu_limit=1e9)),
    "SwiGLU alpha": dict(change=dict(swiglu_alpha=1.0)),
    "sliding window": dict(change=dict(window=(0, 0, 0))),
}


@pytest.mark.parametrize("trait", TRAITS)
def test_each_trait_changes_the_logits(trait):
    model, oracle = load("tiny-gpt-oss")
    how = TRAITS[trait]
    if "change" in how:
        model.cfg = dataclasses.replace(model.cfg, **how["change"])
    if "mutate" in how:
        how["mutate"](model)
    assert relative_error(prefill(model, oracle["ids"]), oracle["logits"]) > 1e-2


# ------------------------------------------------------------------ the ops
def test_sinks_join_the_softmax_denominator():
    """A sink s of head h scales that head's output by sum(e) / (sum(e) + e^s): without a sink (or
    with s = -inf) the output is plain attention; prompt runs and decode rows agree."""
    backend = NumpyBackend()
    rng = np.random.default_rng(3)
    T, H, n_kv, d = 6, 4, 2, 8
    q, k, v = (rng.standard_normal((T, h, d)).astype(np.float32) for h in (H, n_kv, n_kv))
    cache = backend.kv_cache(1, 16, n_kv, d, d, "f32", "f32")
    run = batch_layout(np.zeros(T, np.int32), np.arange(T, dtype=np.int32))
    backend.kv_store(cache, k, v, run)
    sinks = np.array([0.5, -1.0, 2.0, -np.inf], np.float32)
    plain = backend.attention(q, cache, run, 0.3, 0)
    sunk = backend.attention(q, cache, run, 0.3, 0, sinks=sinks)
    scores = np.einsum("thd,hnd->thn", q, np.repeat(k.transpose(1, 0, 2), H // n_kv, axis=0)) * 0.3
    scores[np.triu_indices(T, 1)[0], :, np.triu_indices(T, 1)[1]] = -np.inf
    total = np.exp(scores).sum(-1)                                                   # (T, H)
    np.testing.assert_allclose(sunk, plain * (total / (total + np.exp(sinks)))[..., None], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(sunk[:, 3], plain[:, 3])
    last = batch_layout(np.zeros(1, np.int32), np.array([T - 1], np.int32))   # a decode row
    np.testing.assert_allclose(backend.attention(q[-1:], cache, last, 0.3, 0, sinks=sinks), sunk[-1:], rtol=1e-5, atol=1e-6)


def test_clamped_swiglu():
    backend = NumpyBackend()
    gate = np.array([-100.0, -1.0, 0.0, 2.0, 9.0], np.float32)
    up = np.array([-9.0, -0.5, 3.0, 8.0, 1.0], np.float32)
    got = backend.swiglu_oai(gate, up, 1.702, 7.0)
    g, u = np.minimum(gate, 7.0), np.clip(up, -7.0, 7.0)
    np.testing.assert_allclose(got, g / (1 + np.exp(-1.702 * g.astype(np.float64))) * (u + 1), rtol=1e-6, atol=1e-30)
    assert np.all(np.isfinite(got))


def test_expert_bias_is_each_experts_own():
    backend = NumpyBackend()
    rng = np.random.default_rng(4)
    n_expert, out, d = 3, 4, 32
    stacked = rng.standard_normal((n_expert * out, d)).astype(np.float32)
    w = backend.matrix(stacked.view(np.uint8), GGMLQuantizationType.F32, matmul=True)
    bias = rng.standard_normal(n_expert * out).astype(np.float32)
    x = rng.standard_normal((2, d)).astype(np.float32)
    experts, weights = np.array([[2, 0], [1, 2]], np.int32), np.array([[0.25, 0.75], [0.5, 0.5]], np.float32)
    got = backend.matmul_experts(x, w, experts, n_expert, weights, bias)
    blocks, biases = stacked.reshape(n_expert, out, d), bias.reshape(n_expert, out)
    want = [sum(weights[t, j] * (blocks[e] @ x[t] + biases[e]) for j, e in enumerate(experts[t])) for t in range(2)]
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-5, atol=1e-6)


def test_yarn_keeps_fast_pairs_and_scales_slow_ones():
    """Pairs that turn often over the original context keep their frequency, slow ones are scaled
    by freq_scale, those between are blended; without scaling nothing changes."""
    divisors, scale = yarn_rotation(64, 10000.0, 0.25, 4096)
    assert divisors[0] == 1 and divisors[-1] == pytest.approx(4) and np.all(np.diff(divisors) >= 0)
    assert 1 < divisors[15] < 4 and scale == pytest.approx(1 + 0.1 * np.log(4))
    divisors, scale = yarn_rotation(64, 10000.0, 1.0, 4096)
    assert np.all(divisors == 1) and scale == 1


# ------------------------------------------------------------------ bad files
@pytest.mark.parametrize("meta, tensors, message", [
    ({"gpt-oss.rope.scaling.type": "longrope"}, {}, "unsupported rope scaling"),
    ({}, {"rope_freqs.weight": (np.ones(8, np.float32), None)}, "YaRN scaling with per-pair rope factors"),
    ({}, {"blk.1.attn_sinks.weight": (np.ones(3, np.float32), None)}, r"attn_sinks.weight has shape \[3\]"),
])
def test_bad_files_are_one_line_errors(tmp_path, meta, tensors, message):
    bad = copy_gguf(COMMITTED / "tiny-gpt-oss-f32.gguf", tmp_path / "bad.gguf", meta=meta, tensors=tensors)
    with pytest.raises(LlogosError, match=message):
        ModelConfig.from_gguf(GGUFFile(bad))


@pytest.mark.parametrize("isa", ["float", None])
def test_mxfp4_experts_in_their_blocks_match_the_oracle(isa, monkeypatch):
    """As gpt-oss runs on the CPU: the MXFP4 experts multiplied from their blocks in the memory map
    (--cpu-weights quantized), each chosen expert's rows once per step; with float32 activations
    (LLOGOS_CPU_ISA=float) within float32 rounding of the oracle, with 8-bit ones (the default
    where the CPU has integer products) every decisive choice of the next token (a lead of 0.5 or
    more) the oracle's."""
    if isa:
        monkeypatch.setenv("LLOGOS_CPU_ISA", isa)
    else:
        monkeypatch.delenv("LLOGOS_CPU_ISA", raising=False)
    oracle = dict(np.load(COMMITTED / "tiny-gpt-oss-mxfp4.oracle.npz"))
    model = Model(GGUFFile(COMMITTED / "tiny-gpt-oss-mxfp4.gguf"), NumpyBackend(weights="quantized"))
    assert model.w["blk.0.ffn_up_exps.weight"].dense is None
    got, want = prefill(model, oracle["ids"]), oracle["logits"]
    if isa:
        assert relative_error(got, want) < 1e-4
    else:
        assert_decisive_choices_kept(got, want)
