"""Several choices of one prompt in the batch engine (the server's n > 1): the prompt is prefilled once,
the other choices start from the blocks the first one left, and every choice answers as it would alone."""

import numpy as np

from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.prefix_cache import BLOCK_SIZE
from llogos_cli.engine.sampling import SamplingParams
from llogos_cli.engine.stops import StopCriteria
from tests.test_batch import load

SAMPLED = {"temp": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


def choices(prompt: list[int], seeds: list[int]) -> list[Request]:
    return [Request(f"c{i}", prompt, SamplingParams(seed=seed, **SAMPLED), StopCriteria(6, ignore_eos=True))
            for i, seed in enumerate(seeds)]


def run(engine: BatchEngine, requests: list[Request]) -> dict:
    engine.add_choices(requests)
    results = {}
    while not engine.idle:
        results |= {u.id: u.result for u in engine.step() if u.result is not None}
    return results


def test_choices_prefill_the_prompt_once_and_answer_as_alone():
    model, tok = load("tiny-llama")
    prompt = np.random.default_rng(3).integers(3, tok.n_vocab, 3 * BLOCK_SIZE + 5).tolist()
    seeds = [1, 2, 3, 4]
    shared = run(BatchEngine(model, tok, n_slots=4, n_ctx=256, step_tokens=64), choices(prompt, seeds))
    assert shared["c0"].prefix_hit == 0
    assert all(shared[f"c{i}"].prefix_hit == 3 * BLOCK_SIZE for i in (1, 2, 3))   # only the tail is prefilled
    for i, seed in enumerate(seeds):
        alone = run(BatchEngine(model, tok, n_slots=1, n_ctx=256, prefix_cache_bytes=0),
                    [choices(prompt, [seed])[0]])["c0"]
        assert shared[f"c{i}"].tokens == alone.tokens, i
    assert len({tuple(r.tokens) for r in shared.values()}) == 4


def test_without_a_prefix_cache_choices_start_together_and_cancelling_frees_them_all():
    model, tok = load("tiny-llama")
    prompt = list(range(3, 3 + 2 * BLOCK_SIZE))
    engine = BatchEngine(model, tok, n_slots=2, n_ctx=256, prefix_cache_bytes=0)
    engine.add_choices(choices(prompt, [1, 2, 3]))
    assert engine.n_waiting == 3
    engine.step()
    assert len(engine.scheduler.running) == 2 and engine.n_waiting == 1
    for rid in ("c0", "c1", "c2"):
        assert engine.cancel(rid)
    assert engine.idle


def test_cancelling_the_first_choice_before_it_ran_lets_the_others_start():
    model, tok = load("tiny-llama")
    prompt = list(range(3, 3 + 2 * BLOCK_SIZE))
    engine = BatchEngine(model, tok, n_slots=2, n_ctx=256)
    engine.add_choices(choices(prompt, [1, 2, 3]))
    assert engine.n_waiting == 3
    assert engine.cancel("c0") and engine.cancel("c2")
    results = {}
    while not engine.idle:
        results |= {u.id: u.result for u in engine.step() if u.result is not None}
    assert list(results) == ["c1"] and len(results["c1"].tokens) == 6
