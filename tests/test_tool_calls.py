"""Tool calls recognised in fixed model outputs, one format at a time, and the schema of a valid call."""

import json

import jsonschema
import pytest

from llogos_cli.engine.grammar import Grammar
from llogos_cli.server.tool_calls import call_schema, could_start_call, parse

NAMES = {"get_weather", "search"}
WEATHER = {"city": "Paris", "unit": "celsius"}


def calls_of(text: str):
    content, calls = parse(text, NAMES)
    return content, [(c.name, json.loads(c.arguments)) for c in calls], [c.id for c in calls]


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',      # cut at the end
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]',
    '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}',
    '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    '  ```json\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"unit\\": \\"celsius\\"}"}\n```',
    '{"tool_calls": [{"type": "function", "function": {"name": "get_weather", '
    '"arguments": {"city": "Paris", "unit": "celsius"}}}]}',
], ids=["hermes", "hermes-unclosed", "mistral", "mistral-args", "llama3", "llama3-python-tag", "plain",
        "fenced", "openai-shape"])
def test_each_format_gives_the_same_call(text):
    content, calls, ids = calls_of(text)
    assert content is None and calls == [("get_weather", WEATHER)]
    assert ids[0].startswith("call_") and len(ids[0]) > 10


def test_text_before_calls_is_the_content_and_several_calls_keep_their_order():
    text = ("Let me look that up.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
            "</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"rain\"}}\n</tool_call>")
    content, calls, ids = calls_of(text)
    assert content == "Let me look that up."
    assert calls == [("get_weather", {"city": "Paris"}), ("search", {"q": "rain"})] and ids[0] != ids[1]
    _, calls, _ = calls_of('{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
                           '{"name": "search", "parameters": {"q": "x"}}')
    assert [name for name, _ in calls] == ["get_weather", "search"]
    _, calls, _ = calls_of('[TOOL_CALLS]get_weather[ARGS]{"city": "A"}[TOOL_CALLS]search[ARGS]{"q": "b"}')
    assert calls == [("get_weather", {"city": "A"}), ("search", {"q": "b"})]


@pytest.mark.parametrize("text", [
    "The weather in Paris is sunny.",
    '{"city": "Paris"}',                                                   # JSON, but no call
    '{"name": "delete_everything", "arguments": {}}',                      # not one of the tools
    '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>',  # broken JSON
    '{"name": "get_weather", "arguments": "not json"}',
])
def test_what_is_not_a_call_to_a_tool_stays_text(text):
    assert parse(text, NAMES) == (text, [])


def test_streams_hold_back_only_what_may_start_a_call():
    assert all(could_start_call(t) for t in ["", "  ", "{", ' {"na', "<tool", "<tool_call>{", "[TOOL", "```"])
    assert not any(could_start_call(t) for t in ["Hello", "The <tool", "I will"])


def test_the_call_schema_admits_calls_to_the_tools_only():
    tools = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                    "required": ["city"]}},
             {"name": "now"}]
    schema = call_schema(tools)
    Grammar.json_schema(schema)   # compiles
    jsonschema.validate({"name": "get_weather", "arguments": {"city": "Paris"}}, schema)
    jsonschema.validate({"name": "now", "arguments": {}}, schema)
    for wrong in ({"name": "get_weather", "arguments": {}}, {"name": "other", "arguments": {}}, {"name": "now"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)


# ---------------------------------------------------- the XML and harmony formats of newer families

WRITE = {"type": "object", "properties": {
    "path": {"type": "string"}, "content": {"type": "string"}, "mode": {"type": "integer"},
    "append": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}},
    "meta": {"type": "object"}, "ratio": {"type": ["number", "null"]}}}
TOOLS = {"write_file": WRITE, "get_weather": {"type": "object", "properties": {"city": {"type": "string"}}}}
# Arguments of every type the schema names; "12" and "true" are strings that look like something else.
ARGUMENTS = [
    {"path": "notes/été.txt", "content": "line 1\n  line 2 😀\n", "mode": 420, "append": True,
     "tags": ["a", "b"], "meta": {"k": 1.5, "deep": [None]}, "ratio": 0.25},
    {"path": "12", "content": "true", "append": False, "ratio": None},
    {},
]


def _written(value) -> str:
    """A value as the XML formats' templates write it: a string bare, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def qwen3_coder(name: str, arguments: dict) -> str:
    params = "".join(f"<parameter={k}>\n{_written(v)}\n</parameter>\n" for k, v in arguments.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def glm(name: str, arguments: dict) -> str:
    params = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_written(v)}</arg_value>\n" for k, v in arguments.items())
    return f"<tool_call>{name}\n{params}</tool_call>"


def harmony(name: str, arguments: dict) -> str:
    return (f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
            f"{json.dumps(arguments, ensure_ascii=False)}<|call|>")


def harmony_recipient_first(name: str, arguments: dict) -> str:
    return (f"<|start|>assistant to=functions.{name}<|channel|>commentary json<|message|>"
            f"{json.dumps(arguments, ensure_ascii=False)}<|call|>")


def hermes(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n</tool_call>'


def mistral(name: str, arguments: dict) -> str:
    return f"[TOOL_CALLS]{name}[ARGS]{json.dumps(arguments, ensure_ascii=False)}"


def llama3(name: str, arguments: dict) -> str:
    return f'{{"name": "{name}", "parameters": {json.dumps(arguments)}}}'


NEW_FORMATS = [qwen3_coder, glm, harmony, harmony_recipient_first]
ALL_FORMATS = NEW_FORMATS + [hermes, mistral, llama3]


@pytest.mark.parametrize("write", NEW_FORMATS)
@pytest.mark.parametrize("arguments", ARGUMENTS, ids=["every-type", "look-alikes", "none"])
def test_new_formats_give_the_call_with_values_typed_by_the_schema(write, arguments):
    content, calls = parse("I will save it.\n" + write("write_file", arguments), TOOLS)
    assert content == "I will save it."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("write_file", arguments)]


@pytest.mark.parametrize("write", [qwen3_coder, glm, harmony])
def test_several_calls_in_a_new_format_keep_their_order_and_unknown_names_stay_text(write):
    text = write("get_weather", {"city": "Oslo"}) + "\n" + write("write_file", ARGUMENTS[1])
    assert [(c.name, json.loads(c.arguments)) for c in parse(text, TOOLS)[1]] == \
        [("get_weather", {"city": "Oslo"}), ("write_file", ARGUMENTS[1])]
    unknown = write("delete_everything", {"city": "Oslo"})
    assert parse(unknown, TOOLS) == (unknown, [])


def test_xml_values_without_a_schema_are_json_where_they_read_as_json():
    content, calls = parse(qwen3_coder("anything", {"n": 3, "s": "three", "b": False}), {"anything"})
    assert json.loads(calls[0].arguments) == {"n": 3, "s": "three", "b": False}


# ------------------------------------------------------------- streamed: tool_calls deltas as they come

def streamed_calls(pieces: list[str], tools, reasoning=None):
    """The calls a client puts together from a ChatRenderer's deltas, each delta's (index, id, name,
    arguments), and the finish reason."""
    from llogos_cli.engine.batch import Result
    from llogos_cli.engine.completion import Timings, Token
    from llogos_cli.server.render import ChatRenderer, Envelope
    renderer = ChatRenderer(Envelope("chatcmpl-x", "m", None, None, False, tools, True, reasoning))
    chunks = [c for p in pieces if (c := renderer.token(Token(1, p))) is not None]
    n_early = len(chunks)
    chunks += renderer.last(Result("chatcmpl-x", "".join(pieces), [1] * len(pieces), "eos", Timings()))
    deltas = [json.loads(c[6:])["choices"][0] for c in chunks]
    calls, early = {}, []
    for i, d in enumerate(deltas):
        for t in d["delta"].get("tool_calls") or ():
            call = calls.setdefault(t["index"], {"id": t.get("id"), "name": t["function"].get("name"), "arguments": ""})
            assert "id" not in t or call["id"] == t["id"]   # a call's id and name come once, first
            call["arguments"] += t["function"].get("arguments") or ""
            if i < n_early:
                early.append(t)
    return [calls[i] for i in sorted(calls)], early, deltas[-1]["finish_reason"]


def _cuts(text: str):
    """The text one character at a time, and cut in two at every place."""
    yield list(text)
    for at in range(1, len(text)):
        yield [text[:at], text[at:]]


@pytest.mark.parametrize("write", ALL_FORMATS)
def test_every_format_streams_deltas_that_join_to_the_parsed_calls_however_the_reply_is_cut(write):
    text = write("write_file", ARGUMENTS[0]) + "\n" + write("get_weather", {"city": "Oslo"})
    if write is llama3:
        text = text.replace("\n", "; ")
    whole = [(c.name, c.arguments) for c in parse(text, TOOLS)[1]]
    assert [name for name, _ in whole] == ["write_file", "get_weather"]
    for pieces in _cuts(text):
        calls, early, finish = streamed_calls(pieces, TOOLS)
        assert [(c["name"], c["arguments"]) for c in calls] == whole and finish == "tool_calls"
        assert all(c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]
        if len(pieces) > 2:   # token by token: the first call and much of its arguments came before the end
            assert early[0]["function"]["name"] == "write_file"
            assert len("".join(t["function"].get("arguments") or "" for t in early if t["index"] == 0)) > 20


@pytest.mark.parametrize("arguments", ["{'city': 'Oslo'}", '{"city": Oslo}', '{"city": "Oslo",}'])
def test_a_call_whose_arguments_are_not_json_streams_to_the_end_as_text(arguments):
    text = '<tool_call>{"name": "get_weather", "arguments": ' + arguments + "}</tool_call>"
    assert parse(text, TOOLS)[1] == []
    for pieces in _cuts(text):
        calls, early, finish = streamed_calls(pieces, TOOLS)
        assert finish == "stop" and all(not c["arguments"].endswith("}") for c in calls)


@pytest.mark.parametrize("write", ALL_FORMATS)
def test_a_call_to_an_unknown_tool_streams_no_deltas_and_the_reply_stays_text(write):
    text = write("delete_everything", {"city": "Oslo"}) + "\n" + write("get_weather", {"city": "Oslo"})
    calls, early, finish = streamed_calls(list(text), TOOLS)
    assert not calls and not early and finish == "stop"


def test_a_harmony_reply_streams_its_analysis_as_reasoning_and_its_call_as_deltas():
    from llogos_cli.engine.reasoning import Reasoning, split
    reply = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
             + harmony("get_weather", {"city": "Oslo"}))
    whole = split(reply, "harmony")
    assert whole.reasoning == "Need the weather."
    assert [(c.name, json.loads(c.arguments)) for c in parse(whole.content, TOOLS)[1]] == \
        [("get_weather", {"city": "Oslo"})]
    for pieces in _cuts(reply):
        calls, _, finish = streamed_calls(pieces, TOOLS, Reasoning("harmony"))
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Oslo"})]
        assert finish == "tool_calls"


@pytest.mark.parametrize("template, write", [("gpt-oss-tools.jinja", harmony_recipient_first),
                                             ("qwen3-coder-tools.jinja", qwen3_coder), ("glm4.5-tools.jinja", glm)])
def test_a_call_rendered_back_through_its_family_s_template_reads_as_the_same_call(template, write):
    """What the template writes for an earlier call is the format the parser reads (so the model sees
    its own calls as it writes them), and its result follows it."""
    from pathlib import Path
    from llogos_cli.tokenizer.chat_template import ChatTemplate
    source = (Path(__file__).parent / "chat_templates" / template).read_text()
    call = {"id": "call_1", "type": "function", "function": {"name": "write_file", "arguments": ARGUMENTS[1]}}
    messages = [{"role": "user", "content": "Save it."}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "saved 4 bytes"}]
    tools = [{"type": "function", "function": {"name": n, "description": n, "parameters": p}} for n, p in TOOLS.items()]
    text = ChatTemplate(source, template).render(messages, tools=tools, add_generation_prompt=True)
    assert "saved 4 bytes" in text.split("Save it.", 1)[1]
    at = text.index(write("write_file", ARGUMENTS[1])[:20], text.index("Save it."))
    assert [(c.name, json.loads(c.arguments)) for c in parse(text[at:], TOOLS)[1]][:1] == \
        [("write_file", ARGUMENTS[1])]


def test_messages_and_responses_streams_grow_a_call_block_by_the_same_pieces():
    """The Messages API's input_json_delta and the Responses API's function_call_arguments.delta are
    the chat stream's argument pieces: several for a call written token by token, joining to its input."""
    from llogos_cli.engine.batch import Result
    from llogos_cli.engine.completion import Timings, Token
    from llogos_cli.server.anthropic import MessageRenderer
    from llogos_cli.server.render import Envelope
    from llogos_cli.server.responses import ResponseRenderer
    text = "Saving.\n" + qwen3_coder("write_file", ARGUMENTS[0]) + "\n" + qwen3_coder("get_weather", {"city": "Oslo"})
    result = Result("x", text, [1] * len(text), "eos", Timings(prompt_n=3, predicted_n=len(text)))
    for renderer_class, prefix in ((MessageRenderer, "msg_x"), (ResponseRenderer, "resp_x")):
        renderer = renderer_class(Envelope(prefix, "m", None, None, tools=TOOLS))
        chunks = renderer.first() + [c for ch in text if (c := renderer.token(Token(1, ch)))] + renderer.last(result)
        sent = [json.loads(e.split("\ndata: ", 1)[1]) for e in b"".join(chunks).decode().split("\n\n") if e]
        if renderer_class is MessageRenderer:
            starts = [e["content_block"] for e in sent if e["type"] == "content_block_start"]
            pieces = [[e["delta"]["partial_json"] for e in sent if e["type"] == "content_block_delta"
                       and e["delta"]["type"] == "input_json_delta" and e["index"] == i] for i in (1, 2)]
            assert [b["type"] for b in starts] == ["text", "tool_use", "tool_use"]
            assert [b["name"] for b in starts[1:]] == ["write_file", "get_weather"]
        else:
            added = [e["item"] for e in sent if e["type"] == "response.output_item.added"]
            pieces = [[e["delta"] for e in sent if e["type"] == "response.function_call_arguments.delta"
                       and e["output_index"] == i] for i in (1, 2)]
            done = [e["arguments"] for e in sent if e["type"] == "response.function_call_arguments.done"]
            assert [i["type"] for i in added] == ["message", "function_call", "function_call"]
            assert [json.loads(d) for d in done] == [ARGUMENTS[0], {"city": "Oslo"}]
        assert len(pieces[0]) > 3
        assert [json.loads("".join(p)) for p in pieces] == [ARGUMENTS[0], {"city": "Oslo"}]
