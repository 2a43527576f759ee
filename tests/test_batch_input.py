"""A `llogos batch` line to a request: read with the server's request schema, so its fields mean
and are checked the same as in a request to `llogos serve`."""

import pytest
from pydantic import ValidationError

from llogos_cli.engine.conversation import ChatFormat, Message
from llogos_cli.engine.sampling import SamplingParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.jobs.lines import Line, LineDefaults, LineError, to_request
from llogos_cli.server import schemas
from llogos_cli.tokenizer import chat_template
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.conftest import FIXTURES, need


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(need(FIXTURES / "tiny-llama-f32.gguf")))


DEFAULTS = LineDefaults(SamplingParams(), StopCriteria(4, ("END",), ignore_eos=True), 2, 7)


def request(tok, fields: dict, chat=None):
    return to_request(Line("a", 1, fields), tok, chat, DEFAULTS)


def test_a_line_takes_the_servers_sampling_fields_with_their_types(tok):
    r = request(tok, {"prompt": "hi", "presence_penalty": 0.5, "frequency_penalty": 0.25, "repeat_penalty": 1.1,
                      "top_k": 5, "temperature": 1, "min_p": 0.1, "top_p": 0.5})
    p = r.params
    assert (p.presence_penalty, p.frequency_penalty, p.repeat_penalty, p.top_k, p.temp, p.min_p, p.top_p) == \
        (0.5, 0.25, 1.1, 5, 1, 0.1, 0.5)
    for name, value in (("top_k", 2.5), ("seed", 1.0), ("frequency_penalty", "0.5"), ("repeat_penalty", True),
                        ("top_p", 7), ("temperature", -1), ("n_predict", -5), ("stop", 3)):
        e = request(tok, {"prompt": "hi", name: value})
        assert isinstance(e, LineError) and e.error.startswith(f"{name}: "), (name, e)


@pytest.mark.parametrize("fields", [
    {"prompt": "hi", "top_k": 2.5}, {"prompt": "hi", "top_p": 1.5}, {"prompt": "hi", "colour": 1},
    {"prompt": 5}, {"prompt": "hi", "max_tokens": 2, "n_predict": 3}, {"prompt": "hi", "seed": -2},
    {"prompt": "hi", "stop": ["a"] * 17}, {"prompt": "hi", "ignore_eos": "yes"}, {"prompt": [-1]},
])
def test_a_bad_line_is_explained_in_the_servers_words(tok, fields):
    """The same fields sent to /v1/completions fail with the same one-line explanation."""
    with pytest.raises(ValidationError) as server:
        schemas.CompletionRequest.model_validate(fields)
    e = request(tok, fields)
    assert isinstance(e, LineError) and e.error == schemas.explain(server.value.errors())


def test_what_a_line_does_not_say_comes_from_the_command_line(tok):
    def said(r):
        return r.criteria.n_predict, r.criteria.stop_strings, r.criteria.ignore_eos, r.n_logprobs
    assert said(request(tok, {"prompt": "hi"})) == (4, ("END",), True, 2)
    r = request(tok, {"prompt": "hi", "max_tokens": 9, "stop": "x", "ignore_eos": False, "logprobs": 0})
    assert said(r) == (9, ("x",), False, 0)
    assert request(tok, {"prompt": "hi", "logprobs": True}).n_logprobs == 1


def test_seeds_are_the_rows_own_unless_the_line_names_one(tok):
    drawn = request(tok, {"prompt": "hi"}).params.seed
    assert drawn == request(tok, {"prompt": "hi", "seed": -1}).params.seed   # -1: the row's own, as without it
    assert to_request(Line("b", 1, {"prompt": "hi"}), tok, None, DEFAULTS).params.seed != drawn
    assert request(tok, {"prompt": "hi", "seed": 3}).params.seed == 3


def test_prompts_as_text_or_token_ids_and_messages_through_the_template(tok):
    assert request(tok, {"prompt": [1, 2, 3]}).prompt == [1, 2, 3]
    assert request(tok, {"prompt": "hi"}).prompt == tok.encode("hi")
    chat = ChatFormat(chat_template.resolve(None, "chatml", None, None), tok)
    text_parts = [{"type": "text", "text": "hi"}, {"type": "text", "text": "!"}]
    parts = {"messages": [{"role": "user", "content": text_parts}]}
    r = request(tok, parts, chat)
    assert r.prompt == tok.encode(chat.text([Message("user", "hi!")]), add_bos=False)
    assert r.criteria.stop_strings == ("END", *chat.stop_strings()) and r.criteria.stop_ids >= chat.stop_ids()
    e = request(tok, parts)
    assert isinstance(e, LineError) and "chat template" in e.error
    for fields in ({"prompt": "x", "messages": parts["messages"]}, {"id": 1}):
        e = request(tok, fields)
        assert isinstance(e, LineError) and "exactly one of" in e.error


def test_a_line_holds_one_constraint(tok):
    assert request(tok, {"prompt": "hi", "json_schema": {"type": "object"}}).grammar is not None
    assert request(tok, {"prompt": "hi", "grammar": 'root ::= "a"'}).grammar is not None
    e = request(tok, {"prompt": "hi", "json_schema": {}, "grammar": 'root ::= "a"'})
    assert isinstance(e, LineError) and "not both" in e.error

