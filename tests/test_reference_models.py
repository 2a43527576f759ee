"""The real models against llama.cpp and against HF transformers' exact float32 forward pass."""

import numpy as np
import pytest

from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.generation import Generation
from llogos_cli.engine.perplexity import perplexity
from llogos_cli.engine.sampling import SamplingParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.model.loader import load
from tests.conftest import EXACT_KV, REFERENCE, assert_teacher_forced, model_path, need, reference

MODELS = ["smollm2-135m", "gemma3-270m"]


@pytest.fixture(scope="module", params=MODELS)
def loaded(request):
    model_path(request.param)
    return request.param, load(request.param, "cpu"), reference(request.param)


@pytest.fixture(scope="module")
def exact(loaded):
    """The same model with float32 activations throughout: the exact path, which the integer
    products (8-bit activations, the default where the CPU has integer dot products) trade for
    speed as llama.cpp does."""
    name, _, ref = loaded
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLOGOS_CPU_ISA", "float")
        return name, load(name, "cpu"), ref


def test_teacher_forced_logprobs_match_transformers_and_llama_cpp(exact):
    name, m, ref = exact
    for case in ref["generation"]:
        prompt, generated = case["prompt_ids"], case["llamacpp"]["generated_ids"]
        assert m.tokenizer.encode(case["prompt"]) == prompt
        ctx = m.model.new_context(256, *EXACT_KV)   # held to transformers' float32 logprobs
        logits = m.model.forward_seq(ctx, np.asarray(prompt + generated, np.int32), all_logits=True)
        assert_teacher_forced(logits, case, 2e-3, name)


def test_greedy_generation_reproduces_transformers(exact):
    name, m, ref = exact
    for case in ref["generation"]:
        expected = case["transformers_fp32"]
        gen = Generation.alone(m.model, m.tokenizer, 256, Request(
            0, case["prompt_ids"], SamplingParams(temp=0.0),
            StopCriteria(n_predict=len(expected["greedy_ids"]), ignore_eos=True), n_logprobs=5), EXACT_KV)
        tokens = list(gen)
        assert len(tokens) == len(expected["greedy_ids"])
        for token, step in zip(tokens, expected["greedy_steps"]):
            (top1, lp1), (_, lp2) = step["top5"][:2]
            if token.id != step["id"]:
                assert lp1 - lp2 < 1e-3, (name, case["id"], "diverged where transformers is decisive")
                break   # a genuine near-tie: the continuations may differ from here on
            ours = dict(token.logprobs)
            for token_id, lp in step["top5"]:
                assert token_id in ours and abs(ours[token_id] - lp) < 2e-3, (name, case["id"], token_id)


def test_greedy_generation_with_integer_products_follows_llama_cpp(loaded):
    """The default products (8-bit activations) and KV cache (f16), as llama.cpp's, choose llama.cpp's
    tokens wherever its lead over the second is at least 0.5; closer calls differ by rounding."""
    name, m, ref = loaded
    for case in ref["generation"]:
        theirs = case["llamacpp"]
        gen = Generation.alone(m.model, m.tokenizer, 256, Request(
            0, case["prompt_ids"], SamplingParams(temp=0.0),
            StopCriteria(n_predict=len(theirs["generated_ids"]), ignore_eos=True)))
        for token, expected, step in zip(gen, theirs["generated_ids"], theirs["steps"]):
            if token.id != expected:
                (_, lp1), (_, lp2) = step["top5"][:2]
                assert lp1 - lp2 < 0.5, (name, case["id"], "diverged where llama.cpp is decisive")
                break


@pytest.mark.parametrize("n_ctx", [128, 256])
def test_perplexity_within_one_percent_of_llama_cpp(loaded, n_ctx):
    name, m, ref = loaded
    expected = next(p for p in ref["perplexity"] if p["n_ctx"] == n_ctx)
    text = need(REFERENCE / "ppl.txt").read_text(encoding="utf-8")
    result = perplexity(m.model, m.tokenizer, text, n_ctx)
    assert result.n_chunks == expected["n_chunks"] and result.scored_tokens == expected["scored_tokens"]
    assert abs(result.ppl / expected["ppl"] - 1) < 0.01, (name, n_ctx, result.ppl, expected["ppl"])


# How close a call a batched row may turn differently from the same prompt alone: with float32
# activations, rounding only; with 8-bit ones (the default), a row's activations round to the other
# side of a quantization step when the products of its batch take another path (tiles of float32
# for many rows of a plain type), as llama.cpp's do.
NEAR_TIE = {"exact": 1e-3, "integer": 0.5}


@pytest.mark.parametrize("products", NEAR_TIE)
def test_sixteen_batched_rows_reproduce_each_prompt_alone(loaded, exact, products):
    """The reference prompts, four rows each with different lengths, in one batch of 16 slots."""
    name, m, ref = exact if products == "exact" else loaded
    cases = [(c, n) for c in ref["generation"] for n in (6, 10, 14, 18)][:16]
    requests = [Request(i, c["prompt_ids"], SamplingParams(temp=0.0), StopCriteria(n, ignore_eos=True))
                for i, (c, n) in enumerate(cases)]
    batched = {r.id: r.tokens for r in BatchEngine(m.model, m.tokenizer, 16, 256).generate(requests)}
    for r in requests:
        alone = list(Generation.alone(m.model, m.tokenizer, 256, Request(r.id, r.prompt, r.params, r.criteria,
                                                                         n_logprobs=2)))
        for ours, token in zip(batched[r.id], alone):
            if ours != token.id:
                (_, lp1), (_, lp2) = token.logprobs
                assert lp1 - lp2 < NEAR_TIE[products], (name, r.id, "a batched row diverged where the model is decisive")
                break
        else:
            assert len(batched[r.id]) == len(alone) == r.criteria.n_predict
