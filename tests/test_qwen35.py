"""qwen35 (Gated DeltaNet + gated attention): the tiny fixture against HF transformers, whole and in
pieces, its recurrent state carried and restored (the ops themselves: test_recurrent_ops.py)."""

import numpy as np
import pytest

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.forward import Model
from tests.conftest import EXACT_KV, FIXTURES, need, relative_error

TOLERANCE = 1e-4   # max |Δ| / max |logit|, the fixtures' float32 agreement


@pytest.fixture(scope="module")
def model() -> Model:
    return Model(GGUFFile(need(FIXTURES / "tiny-qwen35-f32.gguf")), NumpyBackend())


@pytest.fixture(scope="module")
def oracle() -> dict:
    return dict(np.load(need(FIXTURES / "tiny-qwen35.oracle.npz")))



def run_in_pieces(model: Model, ids: np.ndarray, sizes: list[int]) -> np.ndarray:
    assert sum(sizes) == len(ids)
    ctx = model.new_context(64, *EXACT_KV)
    bounds = np.cumsum([0] + sizes)
    return np.concatenate([model.forward_seq(ctx, ids[a:b], all_logits=True) for a, b in zip(bounds, bounds[1:])])


# ------------------------------------------------------------------ whole model
def test_fixture_is_hybrid(model):
    assert model.cfg.recurrent == (True, True, True, False)
    ctx = model.new_context(64, *EXACT_KV)
    assert [kv is None for kv in ctx.cache.kv] == [True, True, True, False]


@pytest.mark.parametrize("sizes", [[20], [1] * 20, [7, 1, 12]], ids=["prefill", "decode", "mixed"])
def test_logits_match_oracle(model, oracle, sizes):
    logits = run_in_pieces(model, oracle["ids"].astype(np.int32), sizes)
    assert logits.shape == oracle["logits"].shape
    assert relative_error(logits, oracle["logits"]) < TOLERANCE


def test_recurrent_state_carries_the_past(model, oracle):
    """Clearing the DeltaNet state between two pieces must change the second piece's logits."""
    ids = oracle["ids"].astype(np.int32)
    ctx = model.new_context(64, *EXACT_KV)
    model.forward_seq(ctx, ids[:10])
    ctx.cache.reset(0)
    logits = model.forward_seq(ctx, ids[10:], all_logits=True)
    assert relative_error(logits, oracle["logits"][10:]) > 1e-2


def test_a_snapshot_of_the_state_restores(model, oracle):
    ids = oracle["ids"].astype(np.int32)
    ctx = model.new_context(64, *EXACT_KV)
    model.forward_seq(ctx, ids[:8])
    snap = ctx.cache.snapshot(0)
    model.forward_seq(ctx, ids[8:12])                        # a reply we then throw away
    for _ in range(2):                                   # restoring works more than once
        ctx.cache.restore(0, snap)
        ctx.n_past = 8
        logits = model.forward_seq(ctx, ids[8:], all_logits=True)
        assert relative_error(logits, oracle["logits"][8:]) < TOLERANCE
