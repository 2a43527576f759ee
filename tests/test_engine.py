"""The engine: context reuse across calls, generation limits, and stop strings."""

import numpy as np
import pytest

from llogos_cli.backends.numpy_backend import NumpyBackend
from llogos_cli.engine.generation import Generation
from llogos_cli.engine.sampling import Sampler, SamplingParams
from llogos_cli.engine.session import Session
from llogos_cli.engine.stops import StopCriteria, StopFilter
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.forward import Model
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.conftest import FIXTURES, need, relative_error


def model(name: str) -> Model:
    return Model(GGUFFile(need(FIXTURES / f"{name}.gguf")), NumpyBackend())


def fresh_logits(m: Model, ids: list[int]) -> np.ndarray:
    return m.forward_seq(m.new_context(64), np.asarray(ids, np.int32))[-1]


@pytest.mark.parametrize("name", ["tiny-llama-f32", "tiny-qwen35-f32"])
def test_evaluate_reuses_the_common_prefix(name):
    m = model(name)
    rng = np.random.default_rng(0)
    prompt, reply, more = (rng.integers(3, m.cfg.n_vocab, n).tolist() for n in (9, 5, 4))
    session = Session(m, 64)
    session.evaluate(prompt)
    assert session.last_evaluated == len(prompt)
    for t in reply:                      # as generation leaves it: every reply token evaluated
        session.step(t)
    logits = session.evaluate(prompt)    # regenerate the reply: only the prompt's last token again
    assert session.last_evaluated == 1
    assert relative_error(logits, fresh_logits(m, prompt)) < 1e-5
    for t in reply:
        session.step(t)
    logits = session.evaluate(prompt + reply + more)   # the next turn: only what is new
    assert session.last_evaluated == len(more)
    assert relative_error(logits, fresh_logits(m, prompt + reply + more)) < 1e-5


def test_recurrent_state_resumes_from_the_mark_when_a_reply_renders_differently():
    m = model("tiny-qwen35-f32")
    prompt, reply, other = [5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17]
    session = Session(m, 64)
    session.evaluate(prompt)
    for t in reply:
        session.step(t)
    # The reply re-tokenizes differently in the next prompt: the state cannot step back to the
    # point of difference, so it resumes from the mark before the prompt's last token.
    logits = session.evaluate(prompt + other)
    assert session.last_evaluated == 1 + len(other)
    assert relative_error(logits, fresh_logits(m, prompt + other)) < 1e-5
    logits = session.evaluate([4] + prompt)   # before the mark: only a rebuild will do
    assert session.last_evaluated == 1 + len(prompt)
    assert relative_error(logits, fresh_logits(m, [4] + prompt)) < 1e-5


def test_generation_limits_and_context_room():
    m = model("tiny-llama-f32")
    tok = Tokenizer.from_gguf(GGUFFile(FIXTURES / "tiny-llama-f32.gguf"))

    def run(n_ctx, n_predict, prompt):
        gen = Generation(Session(m, n_ctx), tok, prompt, Sampler(SamplingParams(temp=0.0), n_ctx),
                         StopCriteria(n_predict, ignore_eos=True))
        return gen, list(gen)

    gen, tokens = run(64, 5, [1, 2, 3])
    assert len(tokens) == 5 and gen.stop == "limit" and not gen.context_full
    assert gen.timings.eval_runs == 4   # the last token's logits are never needed
    gen, tokens = run(10, -1, [1, 2, 3])
    assert len(tokens) == 7 and gen.stop == "limit" and gen.context_full
    gen, tokens = run(64, 0, [1, 2, 3])
    assert tokens == [] and gen.timings.prompt_n == 3


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
