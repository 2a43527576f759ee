"""The families of tests/fixtures (gemma2, phi3, granite, olmo2, smollm3, lfm2, qwen3moe) batched
against alone, and what each family's own trait does to the logits (their logits against HF
transformers' float32 ones, one sequence, are in test_model_fixtures.py).

The fixtures and their oracles are made by tests/fixtures/make_fixtures.py (see its docstring).
"""

import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.sampling import SamplingParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.batch import Batch
from llogos_cli.model.forward import Model
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.conftest import EXACT_KV, copy_gguf, relative_error
from tests.test_model_fixtures import COMMITTED as FIXTURES
from tests.test_model_fixtures import FAMILIES, load

def prefill(model: Model, ids, n_ctx: int = 64, cache_types: tuple = (None, None)) -> np.ndarray:
    return model.forward_seq(model.new_context(n_ctx, *cache_types), np.asarray(ids, np.int32), all_logits=True)


@pytest.mark.parametrize("name", FAMILIES)
def test_batched_rows_equal_each_sequence_alone(name):
    """Two prompts of different lengths in one pass, then decode rows of both and a third prompt
    (float32 caches, EXACT_KV: the two routes' keys, a float32 step apart, may round to neighbouring
    f16 values, 3.5e-5 apart in the logits with OpenBLAS's Haswell kernels)."""
    model, _ = load(name)
    rng = np.random.default_rng(5)
    seqs = [rng.integers(0, model.cfg.n_vocab, n).astype(np.int32) for n in (13, 6, 4)]
    alone = [prefill(model, s, cache_types=EXACT_KV) for s in seqs]
    cache = model.new_cache(3, 32, *EXACT_KV)
    steps = [[(0, 0, 11), (1, 2, 5)], [(1, 2, 1), (2, 1, 4), (0, 0, 1)], [(0, 0, 1)]]
    done = [0, 0, 0]
    for step in steps:   # (sequence, slot, tokens)
        batch = Batch.join([Batch.run(seqs[i][done[i]:done[i] + n], slot, done[i], np.arange(n))
                            for i, slot, n in step])
        logits, row = model.forward(cache, batch), 0
        for i, _, n in step:
            assert relative_error(logits[row:row + n], alone[i][done[i]:done[i] + n]) < 1e-5, (step, i)
            done[i] += n
            row += n
    assert done == [13, 6, 4]


@pytest.mark.parametrize("name", FAMILIES)
def test_engine_generates_what_each_request_generates_alone(name):
    """The batch engine with more requests than slots: the greedy tokens of each request do not
    depend on the rows beside it."""
    f = GGUFFile(FIXTURES / f"{name}-q8_0.gguf")
    model, tok = Model(f, NumpyBackend(batched=True)), Tokenizer.from_gguf(f)
    rng = np.random.default_rng(6)
    requests = [Request(i, rng.integers(3, model.cfg.n_vocab, n).tolist(), SamplingParams(temp=0.0),
                        StopCriteria(k, ignore_eos=True)) for i, (n, k) in enumerate([(9, 5), (3, 7), (12, 4), (5, 6)])]
    together = {r.id: r.tokens for r in BatchEngine(model, tok, n_slots=3, n_ctx=32, step_tokens=6).generate(requests)}
    alone = {r.id: r.tokens for req in requests for r in BatchEngine(model, tok, 1, 32).generate([req])}
    assert together == alone and all(len(together[r.id]) == r.criteria.n_predict for r in requests)


@pytest.mark.parametrize("quant", ["f32", "q8_0"])
def test_contexts_past_the_original_length_take_phi3s_long_rope_factors(quant):
    """tiny-phi3-longrope was trained on 64 positions: a context of 64 turns by the short factors
    (the oracle above), one of 65 or more by the long ones (the oracle computed with them), as
    llama.cpp chooses by context size."""
    model, _ = load("tiny-phi3-longrope", quant)
    suffix = "" if quant == "f32" else f"-{quant}"
    long = np.load(FIXTURES / f"tiny-phi3-longrope-long{suffix}.oracle.npz")
    assert relative_error(prefill(model, long["ids"], 65, EXACT_KV), long["logits"]) < 1e-4
    assert relative_error(prefill(model, long["ids"], 64, EXACT_KV), long["logits"]) > 1e-2


# ------------------------------------------------------------------ each family's traits
def config(name: str):
    return Model(GGUFFile(FIXTURES / f"{name}-f32.gguf"), NumpyBackend()).cfg


def test_configs_read_each_familys_traits():
    gemma2, phi3, granite = config("tiny-gemma2"), config("tiny-phi3"), config("tiny-granite")
    olmo2, smollm3 = config("tiny-olmo2"), config("tiny-smollm3")
    assert (gemma2.window, gemma2.attn_softcap, gemma2.final_softcap) == ((8, 0, 8), 2.0, 3.0)
    assert gemma2.embed_scale == 8.0 and gemma2.post_norms and gemma2.gelu_ffn
    assert phi3.fused_qkv and phi3.fused_ffn and (phi3.rope_dims, phi3.head_dim_k) == (8, 16) and phi3.rope_neox
    longrope = config("tiny-phi3-longrope")
    assert (longrope.n_ctx_orig, longrope.rope_attn_factor) == (64, pytest.approx((1 + np.log(4) / np.log(64)) ** 0.5))
    assert (granite.embed_scale, granite.attn_scale, granite.residual_scale) == pytest.approx((3.0, 0.2, 0.6))
    assert granite.logit_scale == pytest.approx(1 / 2.5)
    assert not olmo2.pre_norms and olmo2.post_norms and olmo2.qk_norm == "all"
    assert smollm3.rope_layers == (True, True, True, False) and not smollm3.rope_neox
    qwen3moe = config("tiny-qwen3moe")
    assert (qwen3moe.n_expert, qwen3moe.n_expert_used, qwen3moe.n_ff_exp) == (4, 2, 64)
    lfm2 = config("tiny-lfm2")
    assert lfm2.recurrent == (True, False, True, True) and (lfm2.conv_kernel, lfm2.n_head_kv) == (3, 2)


# Each trait turned off in turn must move the logits well past the oracle's tolerance: the
# agreement above is not one the trait could be missing from.
TRAITS = {
    "attention soft-cap": ("tiny-gemma2", dict(attn_softcap=0.0)),
    "final soft-cap": ("tiny-gemma2", dict(final_softcap=0.0)),
    "gemma2 sliding window": ("tiny-gemma2", dict(window=(0, 0, 0))),
    "partial rotary": ("tiny-phi3", dict(rope_dims=16)),
    "phi3 long-context attention factor": ("tiny-phi3-longrope", dict(rope_attn_factor=1.0)),
    "granite embedding multiplier": ("tiny-granite", dict(embed_scale=1.0)),
    "granite attention multiplier": ("tiny-granite", dict(attn_scale=0.25)),
    "granite residual multiplier": ("tiny-granite", dict(residual_scale=1.0)),
    "granite logit scale": ("tiny-granite", dict(logit_scale=1.0)),
    "olmo2 q/k norms over the whole projection": ("tiny-olmo2", dict(qk_norm="")),
    "smollm3 unrotated layer": ("tiny-smollm3", dict(rope_layers=(True,) * 4)),
    "qwen3moe experts per token": ("tiny-qwen3moe", dict(n_expert_used=1)),
}


@pytest.mark.parametrize("trait", TRAITS)
def test_each_trait_changes_the_logits(trait):
    name, change = TRAITS[trait]
    model, oracle = load(name)
    model.cfg = dataclasses.replace(model.cfg, **change)
    assert relative_error(prefill(model, oracle["ids"]), oracle["logits"]) > 1e-2



# ------------------------------------------------------------------ the grouped expert product
def test_expert_product_streams_each_chosen_expert_once(monkeypatch):
    """A batch of 13 tokens routed to 2 of 4 experts each: every chosen expert's matrix is multiplied
    once, by all its tokens together, and each token gets what its own experts give it."""
    backend = NumpyBackend()
    rng = np.random.default_rng(8)
    n_expert, out, d, T, k = 4, 8, 32, 13, 2
    stacked = rng.standard_normal((n_expert * out, d)).astype(np.float32)
    w = backend.matrix(stacked.view(np.uint8), GGMLQuantizationType.F32, matmul=True)
    x = rng.standard_normal((T, d)).astype(np.float32)
    experts, weights = backend.route(rng.standard_normal((T, n_expert)).astype(np.float32), k)
    calls = []
    product = backend._expert_product
    monkeypatch.setattr(backend, "_expert_product", lambda *a: calls.append(a[2]) or product(*a))
    got = backend.matmul_experts(x, w, experts, n_expert, weights)
    blocks = stacked.reshape(n_expert, out, d)
    want = np.stack([sum(weights[t, j] * blocks[experts[t, j]] @ x[t] for j in range(k)) for t in range(T)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert sorted(calls) == [e * out for e in np.unique(experts)]
    assert np.allclose(weights.sum(axis=1), 1) and all(len(set(row)) == k for row in experts)


# ------------------------------------------------------------------ bad metadata
BAD_METADATA = {
    "KV heads differing between attention layers": ("tiny-lfm2", "lfm2.attention.head_count_kv", [0, 2, 1, 0],
                                                    "not one KV head count"),
    "no attention layer with KV heads": ("tiny-lfm2", "lfm2.attention.head_count_kv", [0, 0, 0, 0],
                                         "not one KV head count"),
    "a convolution of width 1": ("tiny-lfm2", "lfm2.shortconv.l_cache", 1, "shortconv.l_cache is 1"),
    "more experts used than there are": ("tiny-qwen3moe", "qwen3moe.expert_used_count", 5, "5 experts used of 4"),
    "a negative soft-cap": ("tiny-gemma2", "gemma2.attn_logit_softcapping", -1.0, "not a positive number"),
    "a window pattern for other layers": ("tiny-gemma2", "gemma2.attention.sliding_window_pattern", [True, False],
                                          "not one flag for each of the 3 layers"),
}


@pytest.mark.parametrize("case", BAD_METADATA)
def test_bad_family_metadata_is_one_line(tmp_path, case):
    name, key, value, message = BAD_METADATA[case]
    path = copy_gguf(FIXTURES / f"{name}-f32.gguf", tmp_path / "bad.gguf", meta={key: value})
    with pytest.raises(LlogosError, match=message) as e:
        Model(GGUFFile(path), NumpyBackend())
    assert "\n" not in str(e.value) and "bad.gguf" in str(e.value)
