"""Tool calls in a model's reply, in the formats real chat templates teach, and the constraint that
makes a model write one.

Recognised, first match wins:
- Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number of them,
  with text before them kept as the reply's content (the closing tag may be cut off at the end).
- Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, or the newer
  `[TOOL_CALLS]name[ARGS]{...}` repeated.
- Llama 3.x: `{"name": ..., "parameters": {...}}` (or "arguments"), after an optional
  `<|python_tag|>`, several joined by ";".
- Qwen3-Coder's `<function=NAME><parameter=ARG>`, GLM-4.5's `<arg_key>`/`<arg_value>` and gpt-oss's
  harmony messages to `functions.NAME`: tool_markup.py reads them.
- Anything else that is one JSON object (or a list of them, or a ```json fenced block) naming a
  function and its arguments: the generic fallback, and what a constrained call produces.
A call is only a call if it names one of the request's tools; otherwise the reply is plain text.
"""

import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from llogos_cli.server import tool_markup

# Where a reply's tool calls may start: what a stream holds back until it knows. A harmony message to
# a tool starts with its header (the reasoning split leaves only those headers in the answer).
MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<|start|>", "<|channel|>", "to=functions.")
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_MISTRAL_ARGS = re.compile(r"\[TOOL_CALLS\]\s*([^\[\s{]+)\s*\[ARGS\]\s*")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str   # a JSON object, as text (OpenAI's shape)


def parse(text: str, tools: Mapping[str, dict] | set[str]) -> tuple[str | None, list[ToolCall]]:
    """The reply's content (None when it is only calls) and the calls it makes to `tools` (their
    names, or each name's parameter schema, which types the values of the XML formats)."""
    for parser in (_hermes, lambda t: _markup(t, tool_markup.qwen3_coder(t, tools)),
                   lambda t: _markup(t, tool_markup.glm(t, tools)), _harmony, _mistral, _llama3, _plain):
        found = parser(text)
        if found is None:
            continue
        content, calls = found
        if calls and all(c.get("name") in tools for c in calls):
            made = [ToolCall(new_id(), c["name"], c["arguments"]) for c in calls]
            return (content.strip() or None), made
    return text, []


def new_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def could_start_call(text: str) -> bool:
    """Whether a reply that begins with `text` may still turn out to be a tool call (for streams)."""
    head = text.lstrip()
    return (not head or head[0] in "{[`" or any(m.startswith(head[:len(m)]) for m in MARKERS))


def call_schema(tools: list[dict]) -> dict:
    """The JSON Schema of one call to any of `tools` ({"name", "arguments"}), for constrained output."""
    options = [{"type": "object", "properties": {"name": {"const": t["name"]},
                                                 "arguments": t.get("parameters") or {"type": "object"}},
                "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    return options[0] if len(options) == 1 else {"anyOf": options}


# ------------------------------------------------------------------------------------- formats

def _hermes(text: str):
    start = text.find("<tool_call>")
    if start < 0:
        return None
    calls = [_call(_json(m)) for m in _HERMES.findall(text[start:])]
    return text[:start], calls if all(calls) else []


def _markup(text: str, found: list[tool_markup.Found]):
    """Calls in an XML format: each closed, but for the last, which the reply's end may cut short."""
    if not found:
        return None
    whole = all(f.complete for f in found[:-1]) and (found[-1].complete or not text[found[-1].end:].strip())
    calls = [{"name": f.name, "arguments": json.dumps(f.arguments, ensure_ascii=False)} for f in found]
    return text[:found[0].start], calls if whole else []


def _harmony(text: str):
    found = tool_markup.harmony(text)
    if not found:
        return None
    calls = [_call({"name": name, "arguments": _json(body.strip())}) for _, name, body, _ in found]
    return text[:found[0][0]], calls if all(calls) else []


def _mistral(text: str):
    start = text.find("[TOOL_CALLS]")
    if start < 0:
        return None
    rest = text[start:]
    if _MISTRAL_ARGS.match(rest):   # name[ARGS]{...}, repeated
        calls = []
        for m in _MISTRAL_ARGS.finditer(rest):
            args, _ = _raw_json(rest[m.end():])
            calls.append(_call({"name": m.group(1), "arguments": args}))
        return text[:start], calls if all(calls) else []
    value = _json(rest[len("[TOOL_CALLS]"):])
    items = value if isinstance(value, list) else [value]
    calls = [_call(v) for v in items]
    return text[:start], calls if calls and all(calls) else []


def _llama3(text: str):
    body = text.strip()
    body = body.removeprefix("<|python_tag|>").strip()
    if not body.startswith("{") or not ("\"parameters\"" in body or "<|python_tag|>" in text):
        return None
    calls, rest = [], body
    while rest:
        value, rest = _raw_json(rest)
        call = _call(value)
        if call is None:
            return None
        calls.append(call)
        rest = rest.strip().removeprefix(";").strip()
    return "", calls


def _plain(text: str):
    body = text.strip()
    fenced = _FENCE.match(body)
    value = _json(fenced.group(1) if fenced else body)
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        value = value["tool_calls"]
    items = value if isinstance(value, list) else [value]
    calls = [_call(v) for v in items]
    return ("", calls) if calls and all(calls) else None


# ------------------------------------------------------------------------------------- helpers

def _call(value) -> dict | None:
    """{"name", "arguments" as JSON text} from a decoded call, or None if it is not one."""
    if isinstance(value, dict) and isinstance(value.get("function"), dict):   # OpenAI's own shape
        value = value["function"]
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return {"name": value["name"], "arguments": json.dumps(args, ensure_ascii=False)}


def _json(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _raw_json(text: str):
    """The JSON value at the start of text and what follows it; (None, "") if there is none."""
    try:
        value, end = json.JSONDecoder().raw_decode(text.lstrip())
    except json.JSONDecodeError:
        return None, ""
    return value, text.lstrip()[end:]
