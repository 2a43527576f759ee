"""`llogos serve`'s Anthropic Messages API through the official `anthropic` SDK: a reply, system
blocks, stop sequences, the stream's named events in order, tools forced and auto with inputs valid
for their schema, a tool result round-tripped, count_tokens against a real request's usage, the
prefix cache in usage, max_tokens past the context, the key as x-api-key, and errors in Anthropic's shape
(a body over the size limit and an unknown route among them)."""

import json

import httpx
import jsonschema
import pytest

from llogos_cli.server.anthropic import ERROR_PREFIX
from tests.conftest import lazy_import
from tests.test_cli import env  # noqa: F401  (env is a fixture)
from tests.test_server import Server
from tests.test_server_tools import QWEN_TOOLS

anthropic = lazy_import("anthropic")

N_CTX = 1024
KEY = "sesame"
WEATHER = {"name": "get_weather", "description": "The current weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                             "unit": {"enum": ["celsius", "fahrenheit"]}},
                            "required": ["city", "unit"], "additionalProperties": False}}
TIME = {"name": "get_time", "description": "The time now in a time zone.",
        "input_schema": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
                         "required": ["zone"], "additionalProperties": False}}
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]
HI = [{"role": "user", "content": "Say hi to Ada."}]


@pytest.fixture(scope="module")
def smol(env, tmp_path_factory):
    """SmolLM2 with a tool-calling (Hermes-style) template, behind an API key."""
    server = Server(dict(env, LLOGOS_API_KEY=KEY), tmp_path_factory.mktemp("anthropic") / "log", "-m", "smollm2-135m",
                    "-np", "2", "-c", str(N_CTX), "--chat-template-file", str(QWEN_TOOLS))
    yield server
    server.stop()
    log = server.log.read_text()
    assert server.proc.returncode == 0 and "Traceback" not in log, log


def client(smol, **kw):
    return anthropic.Anthropic(base_url=smol.url, api_key=KEY, max_retries=0, **kw)


GREEDY = {"temperature": 0}   # a field the SDK no longer names, which older clients send


def create(smol, **kw):
    return client(smol).messages.create(**{"model": "smollm2-135m", "max_tokens": 12, "extra_body": GREEDY, **kw})


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def post(smol, path: str, body: dict, **headers) -> httpx.Response:
    return smol.post(path, body, headers={"x-api-key": KEY, "anthropic-version": "2023-06-01", **headers})


def events(response: httpx.Response) -> list[tuple[str, dict]]:
    """Each SSE event's name and data, checking that the data's type is the event's name."""
    assert response.text.endswith("\n\n")
    out = []
    for raw in response.text[:-2].split("\n\n"):
        name_line, data_line = raw.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert name_line.startswith("event: ") and data["type"] == name, raw
        out.append((name, data))
    return out


def assert_block_order(names: list[str]) -> None:
    """message_start, ping, then blocks (start, deltas, stop), message_delta, message_stop."""
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"], names
    inside = False
    for name in names[2:-2]:
        assert name == ("content_block_stop" if inside and name == "content_block_stop" else
                        "content_block_delta" if inside else "content_block_start"), names
        inside = name != "content_block_stop"
    assert not inside, names


# ---------------------------------------------------------------------------------------- replies

def test_a_message_with_its_id_blocks_stop_reason_and_usage(smol):
    reply = create(smol, messages=HI, thinking={"type": "enabled", "budget_tokens": 1024}, metadata={"user_id": "u"})
    assert reply.id.startswith("msg_") and reply.type == "message" and reply.role == "assistant"
    assert reply.model == "smollm2-135m" and [b.type for b in reply.content] == ["text"] and text_of(reply)
    assert reply.stop_reason in ("end_turn", "max_tokens") and reply.stop_sequence is None
    assert 0 < reply.usage.output_tokens <= 12 and (reply.stop_reason == "end_turn") == (reply.usage.output_tokens < 12)
    assert reply.usage.input_tokens > 5


def test_system_as_text_or_blocks_is_the_same_prompt(smol):
    plain = create(smol, messages=HI, system="Answer in French.\nBe brief.")
    blocks = create(smol, messages=HI, system=[{"type": "text", "text": "Answer in French."},
                                               {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}])
    shorter = create(smol, messages=HI, system=[{"type": "text", "text": "Answer in French."}], max_tokens=1)

    def prompt(m):
        return m.usage.input_tokens + m.usage.cache_read_input_tokens

    assert prompt(plain) == prompt(blocks) > prompt(shorter) and text_of(plain) == text_of(blocks)


def test_a_stop_sequence_ends_the_reply_and_is_named(smol):
    free = text_of(create(smol, messages=HI, max_tokens=16))
    stop = free[6:9]
    assert len(stop) == 3
    cut = create(smol, messages=HI, max_tokens=16, stop_sequences=["NEVER SAID", stop])
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    assert text_of(cut) == free[:free.find(stop)]


def test_the_stream_sends_named_events_in_order_and_agrees_with_the_whole_reply(smol):
    whole = create(smol, messages=HI)
    r = post(smol, "/v1/messages", {"model": "m", "max_tokens": 12, "temperature": 0, "messages": HI, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    sent = events(r)
    assert_block_order([name for name, _ in sent])
    start, delta = sent[0][1]["message"], sent[-2][1]
    assert start["id"].startswith("msg_") and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    assert delta["delta"]["stop_reason"] == whole.stop_reason and delta["usage"]["output_tokens"] == whole.usage.output_tokens
    assert "".join(d["delta"]["text"] for name, d in sent if name == "content_block_delta") == text_of(whole)
    raw = client(smol).messages.create(model="m", max_tokens=12, extra_body=GREEDY, messages=HI, stream=True)
    assert [e.type for e in raw] == [name for name, _ in sent if name != "ping"]   # the SDK passes no ping on
    with client(smol).messages.stream(model="m", max_tokens=12, extra_body=GREEDY, messages=HI) as stream:
        final = stream.get_final_message()
    assert text_of(final) == text_of(whole) and final.stop_reason == whole.stop_reason


# ------------------------------------------------------------------------------------------ tools

@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_time"}], ids=["any", "tool"])
def test_a_forced_tool_gives_a_tool_use_block_valid_for_its_schema(smol, stream, choice):
    kw = dict(messages=ASK, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=60)
    if stream:
        with client(smol).messages.stream(model="m", extra_body=GREEDY, **kw) as s:
            reply = s.get_final_message()
    else:
        reply = create(smol, **kw)
    assert reply.stop_reason == "tool_use" and [b.type for b in reply.content] == ["tool_use"]
    call = reply.content[0]
    assert call.id.startswith("toolu_")
    jsonschema.validate(call.input, {"get_weather": WEATHER, "get_time": TIME}[call.name]["input_schema"])
    if choice["type"] == "tool":
        assert call.name == "get_time"


def test_a_streamed_tool_call_is_input_json_deltas_in_its_own_block(smol):
    r = post(smol, "/v1/messages", {"model": "m", "max_tokens": 60, "temperature": 0, "messages": ASK, "stream": True,
                                    "tools": [WEATHER], "tool_choice": {"type": "any"}})
    sent = events(r)
    assert_block_order([name for name, _ in sent])
    starts = [d["content_block"] for name, d in sent if name == "content_block_start"]
    assert starts[-1]["type"] == "tool_use" and starts[-1]["name"] == "get_weather" and starts[-1]["input"] == {}
    partial = "".join(d["delta"]["partial_json"] for name, d in sent
                      if name == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
    jsonschema.validate(json.loads(partial), WEATHER["input_schema"])
    assert sent[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_auto_may_call_and_none_leaves_the_tools_out(smol):
    auto = create(smol, messages=ASK, tools=[WEATHER], tool_choice={"type": "auto"}, max_tokens=60)
    calls = [b for b in auto.content if b.type == "tool_use"]
    if calls:
        assert auto.stop_reason == "tool_use" and calls[0].name == "get_weather"
        jsonschema.validate(calls[0].input, WEATHER["input_schema"])
    else:
        assert text_of(auto) and auto.stop_reason in ("end_turn", "max_tokens")
    none = create(smol, messages=ASK, tools=[WEATHER], tool_choice={"type": "none"}, max_tokens=1)
    offered = create(smol, messages=ASK, tools=[WEATHER], max_tokens=1)
    assert offered.usage.input_tokens + offered.usage.cache_read_input_tokens > \
        none.usage.input_tokens + none.usage.cache_read_input_tokens + 40


def test_a_tool_result_turn_continues_the_conversation(smol):
    first = create(smol, messages=ASK, tools=[WEATHER], tool_choice={"type": "any"}, max_tokens=60)
    call = first.content[0]
    turn = [*ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                          "content": [{"type": "text", "text": "21 degrees, clear sky"}]}]}]
    answer = create(smol, messages=turn, tools=[WEATHER], max_tokens=20)
    assert text_of(answer) and not any(b.type == "tool_use" for b in answer.content)
    plain = create(smol, messages=ASK, tools=[WEATHER], max_tokens=1)
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens > \
        plain.usage.input_tokens + plain.usage.cache_read_input_tokens + 10


def test_history_of_thinking_and_tool_result_blocks_in_every_form(smol):
    """Claude Code sends back earlier thinking (signed, or redacted) and tool results as a string or
    as blocks: thinking is dropped as chat templates drop reasoning, and a result's two forms are one prompt."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "unit": "celsius"}}

    def turn(earlier: list, result) -> list:
        return [*ASK, {"role": "assistant", "content": [*earlier, call]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}]}]

    def count(messages) -> int:
        return client(smol).messages.count_tokens(model="m", messages=messages, tools=[WEATHER]).input_tokens

    plain = count(turn([], "21 degrees"))
    assert count(turn([], [{"type": "text", "text": "21 degrees"}])) == plain
    thought = [{"type": "thinking", "thinking": "The user wants Paris.", "signature": "c2ln"},
               {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"}]
    assert count(turn(thought, "21 degrees")) == plain
    assert count(turn([], "21 degrees, clear sky and a light wind")) > plain
    reply = create(smol, messages=turn(thought, "21 degrees"), tools=[WEATHER], max_tokens=8)
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == plain


def test_output_config_format_holds_the_reply_to_its_schema(smol):
    from tests.test_server_tools import PERSON
    reply = create(smol, messages=[{"role": "user", "content": "Alice is 34. Give her name and age as JSON."}],
                   max_tokens=60, output_config={"format": {"type": "json_schema", "schema": PERSON}})
    jsonschema.validate(json.loads(text_of(reply)), PERSON)


# ------------------------------------------------------------------------------- counts and limits

def test_count_tokens_is_the_prompt_a_real_request_runs_and_repeats_come_from_the_cache(smol):
    body = dict(messages=[{"role": "user", "content": "Count these words, please: one two three."}],
                system=[{"type": "text", "text": "You count."}], tools=[TIME])
    counted = client(smol).messages.count_tokens(model="m", **body).input_tokens
    first = create(smol, max_tokens=1, **body)
    again = create(smol, max_tokens=1, **body)
    assert counted == first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert counted == again.usage.input_tokens + again.usage.cache_read_input_tokens
    assert again.usage.cache_read_input_tokens > first.usage.cache_read_input_tokens
    assert counted > client(smol).messages.count_tokens(model="m", messages=body["messages"]).input_tokens


def test_max_tokens_past_the_context_generates_to_its_end(smol):
    words = "apple " * 975
    ask = [{"role": "user", "content": f"Repeat these words: {words}"}]
    counted = client(smol).messages.count_tokens(model="m", messages=ask).input_tokens
    assert N_CTX - 40 < counted < N_CTX
    with client(smol).messages.stream(model="m", messages=ask, max_tokens=32000, extra_body=GREEDY) as stream:
        reply = stream.get_final_message()   # the SDK streams so large a request, as Claude Code does
    used = reply.usage.input_tokens + reply.usage.cache_read_input_tokens + reply.usage.output_tokens
    assert (reply.stop_reason, used) == ("max_tokens", N_CTX) or (reply.stop_reason == "end_turn" and used < N_CTX)


# ------------------------------------------------------------------------------ headers and errors

def test_the_key_as_x_api_key_or_bearer_and_betas_tolerated(smol):
    r = post(smol, "/v1/messages?beta=true", {"model": "m", "max_tokens": 1, "messages": HI},
             **{"anthropic-beta": "prompt-caching-2024-07-31,interleaved-thinking-2025-05-14"})
    assert r.status_code == 200 and r.json()["type"] == "message"
    bearer = smol.post("/v1/messages", {"model": "m", "max_tokens": 1, "messages": HI},
                       headers={"Authorization": f"Bearer {KEY}"})
    assert bearer.status_code == 200
    assert client(smol).beta.messages.create(model="m", max_tokens=1, messages=HI, betas=["context-1m-2025-08-07"]).content
    wrong = post(smol, "/v1/messages", {"model": "m", "max_tokens": 1, "messages": HI}, **{"x-api-key": "nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=smol.url, api_key="nope", max_retries=0).messages.create(
            model="m", max_tokens=1, messages=HI)


@pytest.mark.parametrize("body, fragment", [
    ({"messages": HI}, "max_tokens"),
    ({"max_tokens": "5", "messages": HI}, "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "hi"}]}, "messages.0.role"),
    ({"max_tokens": 5, "messages": []}, "messages"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
    ({"max_tokens": 5, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "tool"}}, "name"),
    ({"max_tokens": 5, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
    ({"max_tokens": 5, "messages": ASK, "tools": [{"name": "f"}]}, "input_schema"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                                  "input": {}}]}]}, "tool_use"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x " * 2000}]}, "context"),
])
def test_bad_requests_are_anthropic_errors_naming_the_problem(smol, body, fragment):
    r = post(smol, "/v1/messages", {"model": "m", **body})
    assert r.status_code == 400, r.text
    error = r.json()
    assert set(error) == {"type", "error"} and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert fragment in error["error"]["message"] and "\n" not in error["error"]["message"]
    if isinstance(body.get("max_tokens"), int):   # the SDK itself refuses to send the others
        with pytest.raises(anthropic.BadRequestError):
            client(smol).messages.create(**{"model": "m", **body})


def test_a_huge_body_and_an_unknown_route_are_anthropic_errors_too(smol):
    r = post(smol, "/v1/messages", b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "'
             + b"a" * (9 * 2 ** 20) + b'"}]}')
    assert r.status_code == 413 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["type"] == "request_too_large" and "larger than" in r.json()["error"]["message"]
    with pytest.raises(anthropic.APIStatusError) as refused:
        client(smol).messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "a" * (9 * 2 ** 20)}])
    assert refused.value.status_code == 413 and refused.value.body["error"]["type"] == "request_too_large"
    r = post(smol, "/v1/messages/batches", {"requests": []})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", r.text
    assert post(smol, "/v1/messages", {"model": "m", "max_tokens": 1, "messages": HI}).status_code == 200


def test_count_tokens_refuses_what_messages_refuses(smol):
    r = post(smol, "/v1/messages/count_tokens", {"model": "m", "messages": [{"role": "robot", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert post(smol, "/v1/messages/count_tokens", {"model": "m", "messages": HI}).json()["input_tokens"] > 0


# ------------------------------------------------------------------ the stream, from fixed replies

def test_reasoning_streams_as_a_thinking_block_before_the_text():
    from llogos_cli.engine.batch import Result
    from llogos_cli.engine.completion import Timings, Token
    from llogos_cli.engine.reasoning import Reasoning
    from llogos_cli.server.anthropic import MessageRenderer
    from llogos_cli.server.render import Envelope
    envelope = Envelope("msg_x", "m", None, None, reasoning=Reasoning("think"), prompt_n=7)
    pieces = ["<think>", "Weigh", " it.</th", "ink>\n\nPar", "is."]
    result = Result("chatcmpl-x", "".join(pieces), [1] * len(pieces), "eos", Timings(prompt_n=7, predicted_n=5))
    renderer = MessageRenderer(envelope)
    chunks = renderer.first() + [c for p in pieces if (c := renderer.token(Token(1, p)))] + renderer.last(result)
    sent = events(httpx.Response(200, content=b"".join(chunks)))
    assert_block_order([name for name, _ in sent])
    starts = [d["content_block"]["type"] for name, d in sent if name == "content_block_start"]
    deltas = [d["delta"] for name, d in sent if name == "content_block_delta"]
    assert starts == ["thinking", "text"]
    assert "".join(d.get("thinking", "") for d in deltas) == "Weigh it." and \
        "".join(d.get("text", "") for d in deltas) == "Paris."
    whole = MessageRenderer(envelope).choice(result)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in whole.content] == \
        [("thinking", "Weigh it."), ("text", "Paris.")]
    assert sent[-2][1]["usage"] == {"input_tokens": 7, "output_tokens": 5, "cache_read_input_tokens": 0,
                                    "cache_creation_input_tokens": 0}


def test_content_sent_back_as_the_sdk_returns_it(smol):
    """langchain-anthropic, litellm and Claude Code send a reply's content blocks back as the SDK parsed
    them (a text block's citations, a tool_use's id and input), and a tool's result as block content
    beside a text block: accepted, and the same prompt as the plain forms. A failed tool's result
    (is_error) reaches the model marked: the prompt of its text with ERROR_PREFIX before it."""
    said = create(smol, messages=HI, max_tokens=6).content
    used = create(smol, messages=ASK, tools=[WEATHER], tool_choice={"type": "any"}, max_tokens=60).content
    use = next(b for b in used if b.type == "tool_use")
    text = "".join(b.text for b in said if b.type == "text")
    plain_used = [{"type": "tool_use", "id": b.id, "name": b.name, "input": b.input} if b.type == "tool_use"
                  else {"type": "text", "text": b.text} for b in used]

    def count(messages: list) -> int:
        return client(smol).messages.count_tokens(model="m", messages=messages, tools=[WEATHER]).input_tokens

    def turn(said_blocks, use_blocks, result) -> list:
        return [*HI, {"role": "assistant", "content": said_blocks}, *ASK, {"role": "assistant", "content": use_blocks},
                {"role": "user", "content": [result, {"type": "text", "text": "Answer anyway."}]}]

    def result(content, **error) -> dict:
        return {"type": "tool_result", "tool_use_id": use.id, "content": content, **error}

    as_returned = count(turn([b.model_dump() for b in said], [b.model_dump() for b in used],
                             result([{"type": "text", "text": "service down"}])))
    plain = count(turn(text, plain_used, result("service down")))
    assert as_returned == plain
    failed = count(turn([b.model_dump() for b in said], [b.model_dump() for b in used],
                        result([{"type": "text", "text": "service down"}], is_error=True)))
    assert failed == count(turn(text, plain_used, result(ERROR_PREFIX + "service down"))) > plain
    assert count(turn(text, plain_used, result("service down", is_error=False))) == plain
    assert count(turn(text, plain_used, {"type": "tool_result", "tool_use_id": use.id, "content": "down"})) < plain
