"""`llogos serve`'s OpenAI Responses API through the official openai client (client.responses):
input as text or items, instructions, the stream's typed events in order with their sequence
numbers, function tools forced and auto with arguments valid for their schema, a function call's
output round-tripped by call_id, structured output by text.format, an incomplete reply, hosted
tools skipped, input_tokens counts exact, and errors in OpenAI's shape."""

import json

import httpx
import jsonschema
import pytest

from tests.conftest import lazy_import
from tests.test_cli import env  # noqa: F401  (env is a fixture)
from tests.test_server import Server
from tests.test_server_tools import PERSON, QWEN_TOOLS

openai = lazy_import("openai")

WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
                          "required": ["city", "unit"], "additionalProperties": False}}
ASK = "What is the weather like in Paris?"


@pytest.fixture(scope="module")
def smol(env, tmp_path_factory):
    """SmolLM2 with a tool-calling (Hermes-style) template."""
    server = Server(env, tmp_path_factory.mktemp("responses") / "log", "-m", "smollm2-135m", "-np", "2", "-c", "1024",
                    "--chat-template-file", str(QWEN_TOOLS))
    yield server
    server.stop()
    log = server.log.read_text()
    assert server.proc.returncode == 0 and "Traceback" not in log, log


def create(smol, **kw):
    return smol.client().responses.create(**{"model": "smollm2-135m", "max_output_tokens": 12, "temperature": 0, **kw})


def events(response: httpx.Response) -> list[tuple[str, dict]]:
    """Each SSE event's name and data, checking that the data's type is the event's name."""
    out = []
    for raw in response.text.removesuffix("\n\n").split("\n\n"):
        name_line, data_line = raw.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert name_line.startswith("event: ") and data["type"] == name, raw
        out.append((name, data))
    return out


def test_a_response_with_its_output_message_and_usage(smol):
    done = create(smol, input="Say hi to Ada.", instructions="Be brief.", reasoning={"effort": "low"}, store=False)
    assert done.id.startswith("resp_") and done.object == "response" and done.model == "smollm2-135m"
    assert done.status in ("completed", "incomplete") and [o.type for o in done.output] == ["message"]
    message = done.output[0]
    assert message.role == "assistant" and message.content[0].type == "output_text" and done.output_text
    assert 0 < done.usage.output_tokens <= 12 and done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens
    if done.status == "incomplete":
        assert done.incomplete_details.reason == "max_output_tokens" and done.usage.output_tokens == 12
    items = create(smol, instructions="Be brief.", input=[{"role": "user", "content": "Say hi to Ada."}])
    parts = create(smol, instructions="Be brief.",
                   input=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi to Ada."}]}])
    assert items.output_text == parts.output_text == done.output_text
    assert items.usage.input_tokens == parts.usage.input_tokens == done.usage.input_tokens
    assert parts.usage.input_tokens_details.cached_tokens > 0   # the same prompt again
    longer = create(smol, input="Say hi to Ada.", instructions="Be brief and kind, please.", max_output_tokens=1)
    assert longer.usage.input_tokens > done.usage.input_tokens   # the instructions are in the prompt


def test_the_stream_sends_typed_events_in_order_and_agrees_with_the_whole_reply(smol):
    whole = create(smol, input="Say hi to Ada.")
    r = smol.post("/v1/responses", {"input": "Say hi to Ada.", "max_output_tokens": 12, "temperature": 0, "stream": True})
    sent = events(r)
    names = [name for name, _ in sent]
    assert [d["sequence_number"] for _, d in sent] == list(range(len(sent)))
    assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert set(names[4:-4]) == {"response.output_text.delta"}
    assert names[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    final = sent[-1][1]["response"]
    assert final["status"] == whole.status
    assert "".join(d["delta"] for name, d in sent if name.endswith(".delta")) == whole.output_text
    assert final["output"][0]["content"][0]["text"] == whole.output_text and final["usage"]["output_tokens"] == \
        whole.usage.output_tokens
    with smol.client().responses.stream(model="m", input="Say hi to Ada.", max_output_tokens=12, temperature=0) as s:
        got = list(s)
        assert [e.type for e in got] == names and [e.sequence_number for e in got] == list(range(len(sent)))
        text = "".join(e.delta for e in got if e.type == "response.output_text.delta")
        assert text == whole.output_text and s.get_final_response().output_text == whole.output_text


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}], ids=["required", "named"])
def test_a_forced_function_gives_a_call_valid_for_its_schema(smol, stream, choice):
    kw = dict(input=ASK, tools=[WEATHER, {"type": "web_search"}], tool_choice=choice, max_output_tokens=60)
    if stream:
        with smol.client().responses.stream(model="m", temperature=0, **kw) as s:
            done = s.get_final_response()
    else:
        done = create(smol, **kw)
    assert done.status == "completed" and [o.type for o in done.output] == ["function_call"]
    call = done.output[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])


def test_a_streamed_call_has_its_argument_events(smol):
    r = smol.post("/v1/responses", {"input": ASK, "tools": [WEATHER], "tool_choice": "required", "temperature": 0,
                                    "stream": True})
    got = events(r)
    names = [name for name, _ in got]
    n_deltas = names.count("response.function_call_arguments.delta")   # the arguments as they are written
    assert n_deltas >= 1
    assert names == ["response.created", "response.in_progress", "response.output_item.added",
                     *["response.function_call_arguments.delta"] * n_deltas, "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    pieces = "".join(data["delta"] for name, data in got if name == "response.function_call_arguments.delta")
    assert pieces == next(data["arguments"] for name, data in got if name == "response.function_call_arguments.done")


def test_auto_may_call_and_a_call_output_continues_the_conversation(smol):
    auto = create(smol, input=ASK, tools=[WEATHER], max_output_tokens=60)
    calls = [o for o in auto.output if o.type == "function_call"]
    if calls:
        jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    else:
        assert auto.output_text
    call = create(smol, input=ASK, tools=[WEATHER], tool_choice="required", max_output_tokens=60).output[0]
    turn = [{"role": "user", "content": ASK},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "21 degrees, clear sky"}]
    answer = create(smol, input=turn, tools=[WEATHER], tool_choice="none", max_output_tokens=20)
    assert answer.output_text and not any(o.type == "function_call" for o in answer.output)
    plain = create(smol, input=ASK, tools=[WEATHER], tool_choice="none", max_output_tokens=1)
    assert answer.usage.input_tokens > plain.usage.input_tokens + 10   # the call and its output are in the prompt


def test_input_tokens_count_is_the_prompt_a_real_request_runs(smol):
    body = dict(input=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": ASK}],
                tools=[WEATHER, {"type": "web_search"}], tool_choice="auto")
    counted = smol.client().responses.input_tokens.count(model="m", **body)
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens == create(smol, max_output_tokens=1, **body).usage.input_tokens
    as_instructions = smol.client().responses.input_tokens.count(model="m", instructions="Be brief.", input=ASK,
                                                                 tools=[WEATHER], tool_choice="auto")
    assert as_instructions.input_tokens == counted.input_tokens   # a developer message is the system message
    without_tools = smol.client().responses.input_tokens.count(model="m", instructions="Be brief.", input=ASK)
    assert without_tools.input_tokens < counted.input_tokens - 40
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        smol.client().responses.input_tokens.count(model="m", input=ASK, previous_response_id="resp_1")


def test_history_of_reasoning_items_and_call_outputs_in_every_form(smol):
    """Codex sends back earlier reasoning items and outputs as text or as parts: reasoning is dropped as
    chat templates drop it, and an output's two forms are one prompt."""
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather",
            "arguments": '{"city": "Paris", "unit": "celsius"}'}

    def count(earlier: list, output) -> int:
        items = [{"role": "user", "content": ASK}, *earlier, call,
                 {"type": "function_call_output", "call_id": "call_1", "output": output}]
        return smol.client().responses.input_tokens.count(model="m", input=items, tools=[WEATHER]).input_tokens

    plain = count([], "21 degrees")
    assert count([], [{"type": "input_text", "text": "21 degrees"}]) == plain
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Paris, then."}],
                 "encrypted_content": "ZW5jcnlwdGVk"}
    assert count([reasoning], "21 degrees") == plain
    assert count([], "21 degrees, clear sky and a light wind") > plain


def test_text_format_json_schema_holds_the_output_to_it(smol):
    done = create(smol, input="Alice is 34. Give her name and age as JSON.", max_output_tokens=60,
                  text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(done.output_text), PERSON)


@pytest.mark.parametrize("body, param, fragment", [
    ({"input": "hi", "previous_response_id": "resp_123"}, "previous_response_id", "previous_response_id"),
    ({"input": []}, "input", "input"),
    ({"input": [{"role": "wizard", "content": "hi"}]}, "input", "role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input", "input_image"),
    ({"input": "hi", "max_output_tokens": "5"}, "max_output_tokens", "max_output_tokens"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"input": "hi", "max_output_tokens": 5000}, "max_output_tokens", "max_output_tokens 5000 does not fit"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}},
     "text.format", "nonsense"),
])
def test_bad_requests_are_openai_400s_naming_the_problem(smol, body, param, fragment):
    r = smol.post("/v1/responses", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and fragment in error["message"] and "\n" not in error["message"]
    assert (error["param"] or param).startswith(param)
    with pytest.raises(openai.BadRequestError):
        smol.client().responses.create(model="m", **body)


def test_output_items_sent_back_as_the_sdk_returns_them(smol):
    """openai-agents and langchain send a reply's output items back as the SDK parsed them (a message's
    id, status and output_text parts with annotations; a function call's id and status): accepted, and
    the same prompt as the items' plain forms."""
    said = create(smol, input="Say hi to Ada.", max_output_tokens=6).output[0]
    call = create(smol, input=ASK, tools=[WEATHER], tool_choice="required", max_output_tokens=60).output[0]
    assert said.type == "message" and call.type == "function_call" and call.id and call.status
    text = "".join(part.text for part in said.content)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "21 degrees"}

    def count(items: list) -> int:
        return smol.client().responses.input_tokens.count(model="m", input=items, tools=[WEATHER]).input_tokens

    as_returned = count([{"role": "user", "content": "Say hi to Ada."}, said.model_dump(exclude_none=True),
                         {"role": "user", "content": ASK}, call.model_dump(exclude_none=True), result])
    plain = count([{"role": "user", "content": "Say hi to Ada."}, {"role": "assistant", "content": text},
                   {"role": "user", "content": ASK},
                   {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
                   result])
    assert as_returned == plain
    assert count([{"role": "user", "content": ASK}, call.model_dump(exclude_none=True), result]) < plain - 5
