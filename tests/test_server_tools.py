"""`llogos serve` structured output and tool calling through the official openai client: response_format,
every tool_choice streamed and not, a conversation with a tool result, and the 400s for bad requests."""

import json
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import lazy_import
from tests.test_cli import env  # noqa: F401  (env is a fixture)
from tests.test_server import Server, sse_events

openai = lazy_import("openai")

QWEN_TOOLS = Path(__file__).parent / "chat_templates" / "qwen2.5-tools.jinja"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now in a time zone.",
                                         "parameters": {"type": "object",
                                                        "properties": {"zone": {"type": "string", "maxLength": 20}},
                                                        "required": ["zone"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def smol(env, smollm_path, tmp_path_factory):
    """SmolLM2 with a tool-calling (Hermes-style) template: its own ChatML markers, Qwen2.5's tool turns."""
    server = Server(env, tmp_path_factory.mktemp("tools") / "log", "-m", "smollm2-135m", "-np", "4", "-c", "2048",
                    "--chat-template-file", str(QWEN_TOOLS))
    yield server
    server.stop()


def chat(smol, **kw):
    return smol.client().chat.completions.create(**{"model": "x", "temperature": 0, "max_tokens": 120, **kw})


def streamed(smol, **kw):
    """The stream's content, its tool calls put together from their deltas, and its finish reason."""
    content, calls, finish = "", {}, None
    for chunk in chat(smol, stream=True, **kw):
        if not chunk.choices:
            continue
        delta, finish = chunk.choices[0].delta, chunk.choices[0].finish_reason or finish
        content += delta.content or ""
        for d in delta.tool_calls or ():
            call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = d.id or call["id"]
            call["name"] += d.function.name or "" if d.function else ""
            call["arguments"] += d.function.arguments or "" if d.function else ""
    return content, [calls[i] for i in sorted(calls)], finish


def json_prefix_completed(text: str):
    """What a JSON text cut anywhere parses to once completed (an open string, literal, number,
    key or value finished, a trailing comma dropped, the open containers closed); raises
    ValueError where no such completion exists."""
    for filler in ("", '"', '":0', ":0", "0", '""', '0000"', '000"', '00"', '0"', "rue", "ue", "e", "alse", "lse",
                   "se", "ull", "ll", "l"):
        for cut in (text, text.rstrip().removesuffix(",")):
            whole = cut + filler
            closers, in_string, escaped = [], False, False
            for ch in whole:
                if in_string:
                    escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
                elif ch == '"':
                    in_string = True
                elif ch in "{[":
                    closers.append("}" if ch == "{" else "]")
                elif ch in "}]" and closers:
                    closers.pop()
            try:
                return json.loads(whole + "".join(reversed(closers)))
            except json.JSONDecodeError:
                pass
    raise ValueError(f"not the beginning of a JSON text: {text!r}")


def test_json_prefix_completed_takes_cut_documents_and_refuses_others():
    document = '{"a": [1, 2.5e3, true, null, {"b": "x\\"y\\u00e9"}], "c": false}'
    assert all(isinstance(json_prefix_completed(document[:n]), dict) for n in range(1, len(document) + 1))
    for bad in ('{"a": 1}}', '{"a" 1', '[1 2]', '{"a": tru e'):
        with pytest.raises(ValueError):
            json_prefix_completed(bad)


def test_json_object_and_json_schema_response_formats(smol):
    """A json_object reply is a JSON object, or one cut by max_tokens: a tiny model may nest
    objects until then (where depends on its rounding, so on the machine)."""
    answer = chat(smol, messages=[{"role": "user", "content": "Describe a cat as JSON."}],
                  response_format={"type": "json_object"})
    content, finish = answer.choices[0].message.content, answer.choices[0].finish_reason
    assert isinstance(json.loads(content) if finish == "stop" else json_prefix_completed(content), dict)
    assert finish == "stop" or (finish == "length" and answer.usage.completion_tokens == 120)
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    ask = [{"role": "user", "content": "Alice is 34. Give her name and age as JSON."}]
    whole = chat(smol, messages=ask, response_format=fmt)
    jsonschema.validate(json.loads(whole.choices[0].message.content), PERSON)
    content, calls, finish = streamed(smol, messages=ask, response_format=fmt)
    assert content == whole.choices[0].message.content and not calls and finish == "stop"


def test_llama_server_json_schema_and_grammar_on_completions(smol):
    client = smol.client()
    done = client.completions.create(model="x", prompt="Alice is 34. As JSON:", max_tokens=60, temperature=0,
                                     extra_body={"json_schema": PERSON})
    jsonschema.validate(json.loads(done.choices[0].text), PERSON)
    done = client.completions.create(model="x", prompt="Is the sky blue? Answer:", max_tokens=5, temperature=0.9,
                                     extra_body={"grammar": 'root ::= " " ("yes" | "no")'})
    assert done.choices[0].text in (" yes", " no")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_required_and_named_tool_choice_always_give_a_valid_call(smol, stream, choice):
    kw = dict(messages=ASK, tools=[WEATHER, TIME], tool_choice=choice)
    if stream:
        content, calls, finish = streamed(smol, **kw)
    else:
        message = (answer := chat(smol, **kw)).choices[0].message
        content, finish = message.content, answer.choices[0].finish_reason
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls]
    assert finish == "tool_calls" and not content and len(calls) == 1
    call = calls[0]
    assert call["id"].startswith("call_")
    named = {"get_weather": WEATHER, "get_time": TIME}[call["name"]]
    jsonschema.validate(json.loads(call["arguments"]), named["function"]["parameters"])
    if isinstance(choice, dict):
        assert call["name"] == "get_weather"


def test_auto_renders_the_tools_and_none_leaves_them_out(smol):
    with_tools = chat(smol, messages=ASK, tools=[WEATHER], max_tokens=1)
    without = chat(smol, messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=1)
    assert with_tools.usage.prompt_tokens > without.usage.prompt_tokens + 40   # the tool list is in the prompt
    answer = chat(smol, messages=ASK, tools=[WEATHER], tool_choice="auto")
    message = answer.choices[0].message
    if message.tool_calls:   # the model chose to call: it must then be a well-formed call
        assert answer.choices[0].finish_reason == "tool_calls" and message.tool_calls[0].function.name == "get_weather"
        json.loads(message.tool_calls[0].function.arguments)
    else:
        assert message.content and answer.choices[0].finish_reason in ("stop", "length")
    content, calls, finish = streamed(smol, messages=ASK, tools=[WEATHER], tool_choice="auto")
    assert (content or None, len(calls)) == (message.content or None, len(message.tool_calls or ()))


def test_a_tool_result_turn_continues_the_conversation(smol):
    first = chat(smol, messages=ASK, tools=[WEATHER], tool_choice="required").choices[0].message
    call = first.tool_calls[0]
    turn = [*ASK, {"role": "assistant", "content": None,
                   "tool_calls": [{"id": call.id, "type": "function",
                                   "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})}]
    answer = chat(smol, messages=turn, tools=[WEATHER], tool_choice="none", max_tokens=30)
    assert answer.choices[0].message.content and answer.choices[0].message.tool_calls is None
    plain = chat(smol, messages=ASK, tool_choice="none", tools=[WEATHER], max_tokens=1)
    assert answer.usage.prompt_tokens > plain.usage.prompt_tokens   # the call and its result are in the prompt


@pytest.mark.parametrize("body, param, fragment", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}},
     "response_format", "not"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
    ({"response_format": {"type": "xml"}}, "response_format", "response_format.type"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "[a-z"}}}}}], "tool_choice": "required"}, "tools", "[a-z"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools", "tools.0.function.name"),
    ({"messages": [{"role": "tool", "content": "21C"}]}, "messages", "tool_call_id"),
    ({"messages": [{"role": "user", "content": None}]}, "messages", "content"),
])
def test_bad_requests_are_openai_400s_naming_the_problem(smol, body, param, fragment):
    r = smol.post("/v1/chat/completions", {"messages": ASK, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert fragment in error["message"] and "\n" not in error["message"]
    assert (error["param"] or "").startswith(param)
    with pytest.raises(openai.BadRequestError):
        chat(smol, **{"messages": ASK, **body})


def test_raw_stream_of_a_call_has_openais_delta_shape(smol):
    r = smol.post("/v1/chat/completions", {"messages": ASK, "tools": [WEATHER], "tool_choice": "required",
                                           "temperature": 0, "stream": True})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    calls = [c["delta"]["tool_calls"][0] for c in chunks if "tool_calls" in c["delta"]]
    assert calls[0]["index"] == 0 and calls[0]["type"] == "function" and calls[0]["function"]["name"] == "get_weather"
    assert chunks[-1]["finish_reason"] == "tool_calls" and chunks[-1]["delta"] == {}
    assert all(c["finish_reason"] is None for c in chunks[:-1])


# ------------------------------------------------------------- conversations through real templates

TOOL_TURN = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": None, "tool_calls": [{
                 "id": "call_0123456789abcdef01234567", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
             {"role": "tool", "tool_call_id": "call_0123456789abcdef01234567", "content": "{\"temp\": 21}"}]


def prompt_text(template_source: str, body: dict) -> str:
    from llogos_cli.engine.conversation import ChatFormat
    from llogos_cli.engine.sampling import SamplingParams
    from llogos_cli.gguf.file import GGUFFile
    from llogos_cli.server.prepare import RequestDefaults, prepare_chat
    from llogos_cli.server.schemas import ChatCompletionRequest
    from llogos_cli.tokenizer.chat_template import ChatTemplate
    from llogos_cli.tokenizer.tokenizer import Tokenizer
    from tests.conftest import FIXTURES, need
    tok = Tokenizer.from_gguf(GGUFFile(need(FIXTURES / "tiny-llama-f32.gguf")))
    chat = ChatFormat(ChatTemplate(template_source, "test"), tok)
    prepared = prepare_chat(ChatCompletionRequest.model_validate(body), tok, chat, RequestDefaults(SamplingParams(), 16), 8192)
    return tok.decode(prepared.requests[0].prompt, special=True)


@pytest.mark.parametrize("template", sorted(p.name for p in QWEN_TOOLS.parent.glob("*tools*.jinja")))
def test_tool_turns_render_through_each_tool_calling_template(template):
    text = prompt_text((QWEN_TOOLS.parent / template).read_text(), {"messages": TOOL_TURN, "tools": [WEATHER]})
    assert "The current weather in a city." in text        # the tool's description: the tools were rendered
    assert "Paris" in text and "celsius" in text and "21" in text   # the call and its result


def test_a_template_without_tools_gets_them_in_a_system_message():
    from llogos_cli.tokenizer.chat_template import BUILTIN
    text = prompt_text(BUILTIN["chatml"], {"messages": TOOL_TURN, "tools": [WEATHER]})
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou can call these functions:")
    assert '"name": "get_weather"' in text
    assert "The result of call call_0123456789abcdef01234567: {\"temp\": 21}" in text


# ------------------------------------------------------------------ streaming, from fixed replies

def render_stream(pieces: list[str], names: set[str], parallel: bool = True) -> tuple[str, list[dict], str]:
    """What a client puts together from a ChatRenderer's chunks for a reply arriving in these pieces."""
    from llogos_cli.engine.batch import Result
    from llogos_cli.engine.completion import Timings, Token
    from llogos_cli.server.render import ChatRenderer, Envelope
    renderer = ChatRenderer(Envelope("chatcmpl-x", "m", None, None, False, frozenset(names), parallel))
    chunks = renderer.first() + [c for p in pieces if (c := renderer.token(Token(1, p))) is not None]
    content_before_end = "".join(json.loads(c[6:])["choices"][0]["delta"].get("content", "") for c in chunks)
    chunks += renderer.last(Result("chatcmpl-x", "".join(pieces), [1] * len(pieces), "eos", Timings()))
    deltas = [json.loads(c[6:])["choices"][0] for c in chunks]
    content = "".join(d["delta"].get("content") or "" for d in deltas)
    calls = [call for d in deltas for call in d["delta"].get("tool_calls", [])]
    assert content.startswith(content_before_end)
    return content_before_end, calls, deltas[-1]["finish_reason"]


def test_text_before_a_call_streams_and_the_call_comes_whole_at_the_end():
    pieces = ["Let me", " check. <to", "ol_call>\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Oslo\"}}",
              "\n</tool_call>"]
    early, calls, finish = render_stream(pieces, {"get_weather"})
    assert early == "Let me check. " and finish == "tool_calls"
    assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [(0, "get_weather", {"city": "Oslo"})]


def test_a_reply_that_only_looked_like_a_call_is_sent_as_text():
    early, calls, finish = render_stream(["{\"answer\": ", "42}"], {"get_weather"})
    assert early == "" and not calls and finish == "stop"
    early, calls, finish = render_stream(["Plain", " words <b>", " and more"], {"get_weather"})
    assert early == "Plain words <b> and more" and not calls and finish == "stop"


def test_parallel_tool_calls_false_keeps_the_first_call():
    two = ['<tool_call>{"name": "a", "arguments": {}}</tool_call>',
           '<tool_call>{"name": "b", "arguments": {}}</tool_call>']
    assert [c["function"]["name"] for c in render_stream(two, {"a", "b"})[1]] == ["a", "b"]
    assert [c["function"]["name"] for c in render_stream(two, {"a", "b"}, parallel=False)[1]] == ["a"]


def test_tool_parameters_with_keywords_that_cannot_be_enforced_still_get_a_call(smol):
    tags = {"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                  "maxItems": 3, "uniqueItems": True}},
        "required": ["tags"], "additionalProperties": False}}}
    answer = chat(smol, messages=[{"role": "user", "content": "Tag this: a cat video."}], tools=[tags],
                  tool_choice="required")
    call = answer.choices[0].message.tool_calls[0]
    assert call.function.name == "tag" and isinstance(json.loads(call.function.arguments)["tags"], list)


# What langchain's bind_tools([get_weather], tool_choice="get_weather") sends: its schema lists the
# properties and says nothing of other keys, which (as in llama.cpp) means there are none.
LANGCHAIN_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                   "required": ["city", "unit"], "type": "object"}}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_to_a_schema_without_additional_properties_has_only_its_keys(smol, stream):
    kw = dict(messages=ASK, tools=[LANGCHAIN_WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    if stream:
        content, calls, finish = streamed(smol, **kw)
    else:
        answer = chat(smol, **kw)
        content, finish = answer.choices[0].message.content, answer.choices[0].finish_reason
        calls = [{"name": c.function.name, "arguments": c.function.arguments}
                 for c in answer.choices[0].message.tool_calls or ()]
    assert finish == "tool_calls" and not content and [c["name"] for c in calls] == ["get_weather"]
    closed = {**LANGCHAIN_WEATHER["function"]["parameters"], "additionalProperties": False}
    jsonschema.validate(json.loads(calls[0]["arguments"]), closed)


def test_a_response_format_without_additional_properties_has_only_its_keys(smol):
    person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}}, "required": ["name"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": person}}
    ask = [{"role": "user", "content": "Alice is 34 and lives in Paris. Describe her as JSON."}]
    content = chat(smol, messages=ask, response_format=fmt).choices[0].message.content
    jsonschema.validate(json.loads(content), {**person, "additionalProperties": False})
