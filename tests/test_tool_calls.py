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
