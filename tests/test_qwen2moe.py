"""Qwen2-MoE's own traits on tests/fixtures/tiny-qwen2moe (its logits against transformers' are in
test_model_fixtures.py): the chosen experts' router probabilities used as they are (not
renormalised), and a shared expert every token takes, gated by a sigmoid. Each is shown to matter."""

import dataclasses

import numpy as np
import pytest

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from tests.conftest import relative_error
from tests.test_model_fixtures import load


def prefill(model, ids) -> np.ndarray:
    return model.forward_seq(model.new_context(64), np.asarray(ids, np.int32), all_logits=True)


def test_config_reads_qwen2moe():
    c = load("tiny-qwen2moe")[0].cfg
    assert (c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_ff_shexp) == (4, 2, 64, 96) and not c.expert_norm


@pytest.mark.parametrize("change", [dict(expert_norm=True), dict(n_ff_shexp=0)], ids=["renormalised", "no shared expert"])
def test_each_trait_changes_the_logits(change):
    model, oracle = load("tiny-qwen2moe")
    model.cfg = dataclasses.replace(model.cfg, **change)
    assert relative_error(prefill(model, oracle["ids"]), oracle["logits"]) > 1e-2


def test_shared_expert_gate_is_per_token():
    backend = NumpyBackend()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    gate = np.array([[0.5], [0.0], [2.0]], np.float32)
    np.testing.assert_array_equal(backend.scale_rows(x, gate), x * [[0.5], [0.0], [2.0]])


def test_router_leaves_probabilities_unnormalised_when_asked():
    backend = NumpyBackend()
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4]], np.float32))
    experts, weights = backend.route(logits, 2, normalize=False)
    assert experts.tolist() == [[3, 2]]
    np.testing.assert_allclose(weights, [[0.4, 0.3]], rtol=1e-6)
    np.testing.assert_allclose(backend.route(logits, 2)[1], [[4 / 7, 3 / 7]], rtol=1e-6)
