"""The engine run one request at a time: a parked slot continued across requests, generation limits, and stop strings."""

import numpy as np
import pytest

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.generation import Generation
from llogos_cli.engine.sampling import SamplingParams
from llogos_cli.engine.stops import StopCriteria, StopFilter
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.forward import Model
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.conftest import EXACT_KV, FIXTURES, need, relative_error


def model(name: str) -> tuple[Model, Tokenizer]:
    f = GGUFFile(need(FIXTURES / f"{name}.gguf"))
    return Model(f, NumpyBackend()), Tokenizer.from_gguf(f)


def request(rid, prompt: list[int], n_predict: int, n_logprobs: int = 8) -> Request:
    return Request(rid, prompt, SamplingParams(temp=0.0), StopCriteria(n_predict, ignore_eos=True), n_logprobs)


def first_logprobs(engine: BatchEngine, req: Request) -> tuple[np.ndarray, int]:
    """The top log-probabilities of the request's first token, and the prompt tokens it evaluated."""
    gen = Generation(engine, req)
    tokens = list(gen)
    return np.array([lp for _, lp in tokens[0].logprobs]), gen.timings.prompt_n


def fresh(m, tok, req: Request) -> np.ndarray:
    return first_logprobs(BatchEngine(m, tok, 1, 64, EXACT_KV, prefix_cache_bytes=0), req)[0]


@pytest.mark.parametrize("name", ["tiny-llama-f32", "tiny-qwen35-f32"])
def test_a_parked_slot_is_continued_to_the_token(name):
    m, tok = model(name)
    rng = np.random.default_rng(0)
    prompt, more = (rng.integers(3, m.cfg.n_vocab, n).tolist() for n in (21, 4))
    engine = BatchEngine(m, tok, 1, 64, EXACT_KV, prefix_cache_bytes=0, keep_slots=True)
    gen = Generation(engine, request("a", prompt, 5))
    reply = [t.id for t in gen]
    assert gen.timings.prompt_n == len(prompt)
    # Regenerate the reply: only the prompt's last token again (the recurrent state from its mark).
    logprobs, evaluated = first_logprobs(engine, request("b", prompt, 5))
    assert evaluated == 1
    assert relative_error(logprobs, fresh(m, tok, request("b", prompt, 5))) < 1e-5
    list(Generation(engine, request("c", prompt, 5)))
    # The next turn: what is new, and the reply's last token, which no step evaluated.
    logprobs, evaluated = first_logprobs(engine, request("d", prompt + reply + more, 3))
    assert evaluated == len(more) + 1
    assert relative_error(logprobs, fresh(m, tok, request("d", prompt + reply + more, 3))) < 1e-5


def test_recurrent_state_resumes_from_the_mark_when_a_reply_renders_differently():
    m, tok = model("tiny-qwen35-f32")
    prompt, other = [5, 6, 7, 8, 9, 10], [14, 15, 16, 17]
    engine = BatchEngine(m, tok, 1, 64, EXACT_KV, keep_slots=True)
    list(Generation(engine, request("a", prompt, 4)))
    # The reply re-tokenizes differently in the next prompt: the state cannot step back to the
    # point of difference, so it resumes from the mark before the prompt's last token.
    logprobs, evaluated = first_logprobs(engine, request("b", prompt + other, 2))
    assert evaluated == 1 + len(other)
    assert relative_error(logprobs, fresh(m, tok, request("b", prompt + other, 2))) < 1e-5
    logprobs, evaluated = first_logprobs(engine, request("c", [4] + prompt, 2))   # before the mark: a rebuild
    assert evaluated == 1 + len(prompt)
    assert relative_error(logprobs, fresh(m, tok, request("c", [4] + prompt, 2))) < 1e-5


def test_a_shared_block_is_copied_where_a_parked_row_parts_from_it():
    """A parked row's full blocks are in the prefix cache: a request that parts from it inside one
    writes a copy of the block's head, and the cached block still serves its own prompt."""
    m, tok = model("tiny-llama-f32")
    rng = np.random.default_rng(1)
    prompt = rng.integers(3, m.cfg.n_vocab, 40).tolist()
    other = prompt[:20] + rng.integers(3, m.cfg.n_vocab, 6).tolist()
    engine = BatchEngine(m, tok, 1, 64, EXACT_KV, keep_slots=True)
    list(Generation(engine, request("a", prompt, 3)))
    logprobs, evaluated = first_logprobs(engine, request("b", other, 2))
    assert evaluated == len(other) - 20
    assert relative_error(logprobs, fresh(m, tok, request("b", other, 2))) < 1e-5
    logprobs, evaluated = first_logprobs(engine, request("c", prompt, 2))   # blocks 0-1 by their names
    assert evaluated == len(prompt) - 32
    assert relative_error(logprobs, fresh(m, tok, request("c", prompt, 2))) < 1e-5


def test_generation_limits_and_context_room():
    m, tok = model("tiny-llama-f32")

    def run(n_ctx, n_predict, prompt):
        gen = Generation.alone(m, tok, n_ctx, request(0, prompt, n_predict, 0))
        return gen, list(gen)

    gen, tokens = run(64, 5, [1, 2, 3])
    assert len(tokens) == 5 and gen.stop == "limit" and not gen.context_full
    assert gen.timings.eval_runs == 4   # the last token's logits are never needed
    gen, tokens = run(10, -1, [1, 2, 3])
    assert len(tokens) == 7 and gen.stop == "limit" and gen.context_full
    gen, tokens = run(64, 0, [1, 2, 3])
    assert tokens == [] and gen.timings.prompt_n == 3 and gen.stop == "limit"


def test_stop_filter_holds_back_what_may_begin_a_stop_string():
    f = StopFilter(("</end>", "STOP"))
    assert f.push("Hello <") == "Hello "
    assert f.push("/e") == ""
    assert f.push("x") == "</ex"          # no longer a prefix of a stop string: released
    assert f.push(" and ST") == " and "
    assert f.push("OP and more") == "" and f.hit
    f = StopFilter(("\n\n",))
    assert f.push("a\n") == "a" and f.flush() == "\n"
    assert StopFilter(()).push("anything") == "anything"
