"""Tool calls written as markup rather than as a JSON call object, the formats newer model families
are trained on:
- Qwen3-Coder: `<tool_call><function=NAME><parameter=ARG>value</parameter>...</function></tool_call>`,
  each value on lines of its own (the newline after the opening tag and before the closing one are
  the format's, not the value's);
- GLM-4.5: `<tool_call>NAME<arg_key>ARG</arg_key><arg_value>value</arg_value>...</tool_call>`;
- gpt-oss (harmony): a message to a function, its recipient in the header, its body the JSON arguments:
  `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>` (the recipient may
  also come before the channel: `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>`).

The XML formats write every value as text; a value takes the type the tool's JSON schema gives its
parameter (a string stays as written, numbers, booleans, arrays and objects are read as JSON), as
the templates that render them write strings bare and everything else as JSON.

Each reader gives the calls found so far, each with whether it is complete, so that a stream can
send a call's name and its finished arguments before the reply ends (see tool_stream.py).
"""

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

_QWEN_CALL = re.compile(r"<tool_call>\s*<function=([^>\s]+)>", re.S)
_QWEN_PARAM = re.compile(r"\s*<parameter=([^>]+)>(.*?)</parameter>", re.S)
_QWEN_END = re.compile(r"\s*</function>")
_GLM_CALL = re.compile(r"<tool_call>\s*([^\s<{\[]+)\s*(?=<arg_key>|</tool_call>)", re.S)
_GLM_PARAM = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)
_GLM_END = re.compile(r"\s*</tool_call>")
# The header of a harmony message to a function, up to where its body starts.
HARMONY_CALL = re.compile(r"(?:<\|start\|>assistant)?\s*(?:<\|channel\|>\w+)?\s*to=functions\.([^\s<]+)"
                          r"(?:(?!<\|message\|>).)*<\|message\|>", re.S)
_HARMONY_ENDS = ("<|call|>", "<|end|>", "<|return|>")
# What a schema's parameter is read as: a string as written, anything else as JSON.
_TEXT_TYPES = {"string"}
_PYTHON_SPELLINGS = {"true": True, "false": False, "none": None}


@dataclass(frozen=True, slots=True)
class Found:
    start: int           # where the call's markup begins in the text
    name: str
    arguments: dict      # the arguments read so far, typed
    complete: bool       # the call's markup is closed
    end: int             # where what was read of it ends


def qwen3_coder(text: str, tools: Mapping) -> list[Found]:
    return _xml(text, tools, _QWEN_CALL, _QWEN_PARAM, _QWEN_END, strip_newlines=True)


def glm(text: str, tools: Mapping) -> list[Found]:
    return _xml(text, tools, _GLM_CALL, _GLM_PARAM, _GLM_END, strip_newlines=False)


def harmony(text: str) -> list[tuple[int, str, str, bool]]:
    """(start, name, the body so far, whether it ended) for each harmony message to a function."""
    found = []
    for m in HARMONY_CALL.finditer(text):
        body = text[m.end():]
        ends = [body.find(e) for e in _HARMONY_ENDS if e in body]
        end = min(ends) if ends else -1
        found.append((m.start(), m.group(1), body if end < 0 else body[:end], end >= 0))
    return found


def _xml(text: str, tools: Mapping, call: re.Pattern, param: re.Pattern, end: re.Pattern,
         strip_newlines: bool) -> list[Found]:
    found = []
    for m in call.finditer(text):
        name, at, arguments = m.group(1), m.end(), {}
        schema = _properties(tools, name)
        while p := param.match(text, at):
            value = p.group(2)
            if strip_newlines:
                value = value.removeprefix("\n").removesuffix("\n")
            key = p.group(1).strip()
            arguments[key] = typed(value, schema.get(key))
            at = p.end()
        closed = end.match(text, at)
        found.append(Found(m.start(), name, arguments, closed is not None, closed.end() if closed else at))
    return found


def _properties(tools: Mapping, name: str) -> dict:
    schema = tools.get(name) if isinstance(tools, Mapping) else None
    properties = (schema or {}).get("properties")
    return properties if isinstance(properties, dict) else {}


def typed(value: str, schema: dict | None):
    """A parameter's text as the value its schema says it is; without a schema, JSON if it reads as
    JSON, else the text."""
    kinds = _types(schema)
    if kinds & _TEXT_TYPES:
        return value
    try:
        return json.loads(value.strip())
    except json.JSONDecodeError:
        # Python's spelling (True, None), which Qwen3-Coder's template writes for these values
        return _PYTHON_SPELLINGS.get(value.strip().lower(), value) if kinds & {"boolean", "null"} else value


def _types(schema: dict | None) -> set[str]:
    kind = (schema or {}).get("type")
    if isinstance(kind, str):
        return {kind}
    return {k for k in kind if isinstance(k, str)} if isinstance(kind, list) else set()
