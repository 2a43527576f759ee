"""Sampling: llama.cpp's chain of penalties, truncation, temperature and seeded draws."""

import math
from collections import Counter

import numpy as np
import pytest

from llogos_cli.engine.sampling import (
    Sampler,
    SamplingParams,
    log_softmax,
    top_logprobs,
)
from llogos_cli.engine.samplers import penalize
from llogos_cli.errors import LlogosError


def draws(params: SamplingParams, logits: np.ndarray, n: int = 200) -> list[int]:
    sampler = Sampler(params, n_ctx=100)
    return [sampler.sample(logits) for _ in range(n)]


def test_greedy_takes_the_argmax():
    logits = np.array([0.1, 3.0, 2.9, -1.0], np.float32)
    assert set(draws(SamplingParams(temp=0.0), logits, 5)) == {1}


def test_same_seed_same_draws_and_different_seeds_differ():
    logits = np.random.default_rng(0).standard_normal(500).astype(np.float32)
    params = SamplingParams(temp=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=42)
    assert draws(params, logits) == draws(params, logits)
    other = SamplingParams(temp=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=43)
    assert draws(params, logits) != draws(other, logits)


def test_top_k_limits_the_candidates():
    logits = np.arange(10, dtype=np.float32)
    seen = set(draws(SamplingParams(temp=5.0, top_k=3, top_p=1.0, min_p=0.0, seed=1), logits, 500))
    assert seen == {7, 8, 9}


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probs).astype(np.float32)
    seen = set(draws(SamplingParams(temp=1.0, top_k=0, top_p=0.8, min_p=0.0, seed=3), logits, 500))
    assert seen == {0, 1}
    seen = set(draws(SamplingParams(temp=1.0, top_k=0, top_p=0.81, min_p=0.0, seed=3), logits, 500))
    assert seen == {0, 1, 2}


def test_min_p_is_relative_to_the_best_token_before_temperature():
    probs = np.array([0.6, 0.3, 0.07, 0.03])
    logits = np.log(probs).astype(np.float32)
    # 0.07 / 0.6 > 0.1 survives, 0.03 / 0.6 < 0.1 does not, however high the temperature.
    seen = set(draws(SamplingParams(temp=50.0, top_k=0, top_p=1.0, min_p=0.1, seed=5), logits, 1000))
    assert seen == {0, 1, 2}


def test_temperature_flattens_the_distribution():
    logits = np.array([2.0, 0.0], np.float32)
    cold = draws(SamplingParams(temp=0.3, top_k=0, top_p=1.0, min_p=0.0, seed=9), logits, 2000)
    hot = draws(SamplingParams(temp=3.0, top_k=0, top_p=1.0, min_p=0.0, seed=9), logits, 2000)
    assert cold.count(1) < hot.count(1)
    expected_hot = 1 / (1 + math.exp(2.0 / 3.0))
    assert abs(hot.count(1) / 2000 - expected_hot) < 0.04


def test_repeat_presence_and_frequency_penalties_follow_llama_cpp():
    params = SamplingParams(temp=0.0, repeat_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25,
                            repeat_last_n=3)
    sampler = Sampler(params, n_ctx=100)
    for t in [0, 1, 1, 2]:   # the window of 3 sees 1, 1, 2: token 0 has left it
        sampler.accept(t)
    logits = np.array([4.0, 4.0, -1.0, 0.0], np.float32)
    penalized = penalize(np.arange(4), logits, Counter([1, 1, 2]), 2.0, 0.25, 0.5)
    assert penalized.tolist() == [4.0, 4.0 / 2 - 2 * 0.25 - 0.5, -1.0 * 2 - 0.25 - 0.5, 0.0]
    assert sampler.sample(logits) == 0


def test_penalties_can_change_the_greedy_choice():
    sampler = Sampler(SamplingParams(temp=0.0, repeat_penalty=1.5), n_ctx=100)
    sampler.accept(0)
    assert sampler.sample(np.array([3.0, 2.5], np.float32)) == 1


def test_logprobs_are_the_top_of_the_full_log_softmax():
    logits = np.array([1.0, 3.0, 2.0, 0.5], np.float32)
    top = top_logprobs(logits, 2)
    expected = log_softmax(logits)
    assert [i for i, _ in top] == [1, 2]
    assert top[0][1] == pytest.approx(expected[1]) and top[1][1] == pytest.approx(expected[2])
    assert sum(math.exp(v) for v in log_softmax(logits)) == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [dict(top_p=1.5), dict(min_p=-0.1), dict(repeat_penalty=0.0),
                                 dict(repeat_last_n=-2), dict(temp=float("nan")), dict(seed=-1)])
def test_bad_values_are_rejected(bad):
    with pytest.raises(LlogosError):
        SamplingParams(**bad)


def test_logit_bias_comes_first_and_turns_off_the_plain_greedy_shortcut():
    logits = np.array([0.1, 3.0, 2.9, -1.0], np.float32)
    params = SamplingParams(temp=0.0, logit_bias=((1, -100.0), (3, 4.0)))
    assert not Sampler(params, 100).plain_greedy and Sampler(SamplingParams(temp=0.0), 100).plain_greedy
    assert draws(params, logits, 3) == [3, 3, 3]
    with pytest.raises(LlogosError):
        SamplingParams(logit_bias=((1, math.inf),))
