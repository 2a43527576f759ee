"""OpenAI chat parameters beyond sampling through `llogos serve`: logit_bias (OpenAI's and llama-server's
forms), llama-server's request fields, n choices (distinct,
reproducible with a seed, streamed with their indices, counted once in usage, each constrained on its
own, all freed when the client leaves), and 400s naming the parameters that are out of bounds."""

import json

import httpx
import jsonschema
import pytest

from llogos_cli.gguf.file import GGUFFile
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.conftest import FIXTURES, lazy_import, need
from tests.test_cli import env  # noqa: F401  (env is a fixture)
from tests.test_server import Server, sse_events, wait_until

openai = lazy_import("openai")

TINY = FIXTURES / "tiny-llama-f32.gguf"
ASK = [{"role": "user", "content": "a b c"}]


@pytest.fixture(scope="module")
def tiny(env, tmp_path_factory):
    need(TINY)
    server = Server(env, tmp_path_factory.mktemp("params") / "log", "-m", str(TINY), "-np", "2",
                    "--queue-size", "4", "-c", "1024", "--allow-long-ctx", "--chat-template", "chatml")
    yield server
    server.stop()


def test_logit_bias_bans_and_favours_tokens(tiny):
    client = tiny.client()
    tok = Tokenizer.from_gguf(GGUFFile(TINY))
    favoured = tok.decode([300])

    def reply(**kw):
        return client.chat.completions.create(model="x", messages=ASK, max_tokens=3, temperature=0, logprobs=True,
                                              extra_body={"ignore_eos": True}, **kw).choices[0]

    plain = reply()
    assert plain.message.content != favoured * 3
    assert reply(logit_bias={"300": 100}).message.content == favoured * 3
    top = bytes(plain.logprobs.content[0].bytes)
    top_id = next(i for i in range(tok.n_vocab) if tok.token_bytes(i, special=True) == top)
    assert bytes(reply(logit_bias={str(top_id): -100}).logprobs.content[0].bytes) != top
    done = client.completions.create(model="x", prompt="a", max_tokens=2, temperature=0, logit_bias={"300": 100},
                                     extra_body={"ignore_eos": True})
    assert done.choices[0].text == favoured * 2


def test_logit_bias_in_llama_servers_list_forms_and_false_to_ban(tiny):
    client = tiny.client()
    tok = Tokenizer.from_gguf(GGUFFile(TINY))
    favoured = next(i for i in range(300, tok.n_vocab) if tok.encode(tok.decode([i]), add_bos=False) == [i])
    text = tok.decode([favoured])

    def reply(bias):
        return client.chat.completions.create(model="x", messages=ASK, max_tokens=3, temperature=0, logprobs=True,
                                              logit_bias=bias, extra_body={"ignore_eos": True}).choices[0]

    assert reply([[favoured, 100]]).message.content == text * 3
    assert reply([[text, 100]]).message.content == text * 3          # the text's own tokens
    top = bytes(reply(None).logprobs.content[0].bytes)
    top_id = next(i for i in range(tok.n_vocab) if tok.token_bytes(i, special=True) == top)
    for banned in ([[top_id, False]], {str(top_id): False}):
        assert bytes(reply(banned).logprobs.content[0].bytes) != top


def test_llama_server_fields_n_probs_return_tokens_and_id_slot(tiny):
    tok = Tokenizer.from_gguf(GGUFFile(TINY))
    r = tiny.post("/v1/chat/completions", {"messages": ASK, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
                                           "n_probs": 3, "return_tokens": True, "id_slot": 1})
    choice = r.json()["choices"][0]
    assert [len(t["top_logprobs"]) for t in choice["logprobs"]["content"]] == [3] * 4
    assert tok.decode(choice["tokens"]) == choice["message"]["content"] and len(choice["tokens"]) == 4
    r = tiny.post("/v1/completions", {"prompt": "a b", "max_tokens": 4, "temperature": 0, "ignore_eos": True,
                                      "n_probs": 2, "return_tokens": True, "stream": True})
    events = [json.loads(e) for e in sse_events(r.text) if e != "[DONE]"]
    chunks = [e["choices"][0] for e in events if e["choices"]]
    tokens = [t for c in chunks for t in c.get("tokens", [])]
    assert len(tokens) == 4 and tok.decode(tokens) == "".join(c["text"] for c in chunks)
    assert all(len(c["logprobs"]["top_logprobs"][0]) == 2 for c in chunks if c.get("tokens"))
    plain = tiny.post("/v1/completions", {"prompt": "a b", "max_tokens": 2}).json()["choices"][0]
    assert "tokens" not in plain and plain["logprobs"] is None


def test_cache_prompt_false_evaluates_the_whole_prompt(tiny):
    body = {"prompt": " ".join(["word"] * 80), "max_tokens": 1}
    tiny.post("/v1/completions", body)
    cached = lambda r: r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]   # noqa: E731
    assert cached(tiny.post("/v1/completions", body)) > 0
    assert cached(tiny.post("/v1/completions", {**body, "cache_prompt": False})) == 0


@pytest.mark.parametrize("body, fragment", [
    ({"logit_bias": {"x": 5}}, "logit_bias"),
    ({"logit_bias": [[99999, 5]]}, "logit_bias"),
    ({"logit_bias": [[3, True]]}, "logit_bias"),
    ({"n_probs": 21}, "n_probs"),
    ({"reasoning_format": "bogus"}, "reasoning_format"),
    ({"logit_bias": {"99999": 5}}, "logit_bias"),
    ({"logit_bias": {"3": 500}}, "logit_bias"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    ({"n": 7}, "n 7 is more choices than this server has slots and queue places (6)"),
])
def test_unsupported_or_bad_parameters_are_400s_naming_them(tiny, body, fragment):
    r = tiny.post("/v1/chat/completions", {"messages": ASK, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith(fragment)


# ---------------------------------------------------------------------------------------- n choices

SAMPLED = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
LONG = {"max_tokens": 8, "extra_body": {"ignore_eos": True, **SAMPLED}}


def test_n_choices_are_distinct_and_the_same_for_the_same_seed(tiny):
    client = tiny.client()
    first = client.chat.completions.create(model="x", messages=ASK, n=3, seed=11, **LONG)
    assert [c.index for c in first.choices] == [0, 1, 2]
    texts = [c.message.content for c in first.choices]
    assert len(set(texts)) == 3, texts
    again = client.chat.completions.create(model="x", messages=ASK, n=3, seed=11, **LONG)
    assert [c.message.content for c in again.choices] == texts
    alone = client.chat.completions.create(model="x", messages=ASK, seed=11, **LONG)
    assert alone.choices[0].message.content == texts[0]          # choice 0 is what n = 1 answers
    assert first.usage.prompt_tokens == alone.usage.prompt_tokens   # the prompt counts once...
    assert first.usage.completion_tokens == 3 * 8                   # ...the completions of every choice
    assert first.usage.total_tokens == first.usage.prompt_tokens + 3 * 8
    unseeded = client.chat.completions.create(model="x", messages=ASK, n=2, **LONG)
    assert unseeded.choices[0].message.content != unseeded.choices[1].message.content

    done = client.completions.create(model="x", prompt="a b", n=2, seed=3, max_tokens=6,
                                     extra_body={"ignore_eos": True, **SAMPLED})
    assert [c.index for c in done.choices] == [0, 1] and done.choices[0].text != done.choices[1].text
    assert done.usage.completion_tokens == 12


def test_streamed_choices_carry_their_indices_and_one_usage_at_the_end(tiny):
    whole = tiny.client().chat.completions.create(model="x", messages=ASK, n=3, seed=5, **LONG)
    r = tiny.post("/v1/chat/completions", {"messages": ASK, "n": 3, "seed": 5, "max_tokens": 8, "ignore_eos": True,
                                           "stream": True, "stream_options": {"include_usage": True}, **SAMPLED})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    content, finish, roles = {}, {}, {}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        assert chunk["usage"] is None
        i = choice["index"]
        content[i] = content.get(i, "") + (choice["delta"].get("content") or "")
        roles[i] = roles.get(i) or choice["delta"].get("role")
        finish[i] = choice["finish_reason"] or finish.get(i)
    assert content == {c.index: c.message.content for c in whole.choices}
    assert roles == {0: "assistant", 1: "assistant", 2: "assistant"} and finish == {0: "length", 1: "length", 2: "length"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 24
    assert chunks[-1]["usage"]["prompt_tokens"] == whole.usage.prompt_tokens

    plain = tiny.post("/v1/completions", {"prompt": "a b", "n": 2, "seed": 5, "max_tokens": 4, "ignore_eos": True,
                                          "stream": True, **SAMPLED})
    parts = [json.loads(e) for e in sse_events(plain.text)[:-1]]
    assert {p["choices"][0]["index"] for p in parts} == {0, 1} and all("usage" not in p for p in parts)


def test_each_choice_is_constrained_on_its_own(tiny):
    schema = {"type": "object", "properties": {"word": {"type": "string", "maxLength": 6},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["word", "n"], "additionalProperties": False}
    answer = tiny.client().chat.completions.create(
        model="x", messages=ASK, n=3, seed=2, max_tokens=60, extra_body=SAMPLED,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}})
    replies = [c.message.content for c in answer.choices]
    for reply in replies:
        jsonschema.validate(json.loads(reply), schema)
    assert len(set(replies)) > 1
    tool = {"type": "function", "function": {"name": "pick", "parameters": schema}}
    calls = tiny.client().chat.completions.create(model="x", messages=ASK, n=2, seed=2, max_tokens=60,
                                                  extra_body=SAMPLED, tools=[tool], tool_choice="required")
    for choice in calls.choices:
        assert choice.finish_reason == "tool_calls"
        jsonschema.validate(json.loads(choice.message.tool_calls[0].function.arguments), schema)


def test_a_client_leaving_a_stream_of_choices_frees_every_row(tiny):
    before = tiny.metrics()['llogos_requests_total{outcome="cancelled"}']
    with httpx.stream("POST", tiny.url + "/v1/completions", timeout=60, content=json.dumps(
            {"prompt": "a b", "n": 3, "max_tokens": 1000, "ignore_eos": True, "stream": True})) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        wait_until(lambda: tiny.metrics()["llogos_slots_busy"] + tiny.metrics()["llogos_queue_length"] >= 3,
                   "the choices never all started")
    # Waited for without a short limit: choices the server did not see leave would run to their end
    # and count as finished, not cancelled.
    wait_until(lambda: not ((m := tiny.metrics())["llogos_slots_busy"] or m["llogos_queue_length"]),
               "a choice kept its row after the client left")
    m = tiny.metrics()
    assert m['llogos_requests_total{outcome="cancelled"}'] == before + 1
    r = tiny.post("/v1/completions", {"prompt": "a", "n": 2, "max_tokens": 2, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
