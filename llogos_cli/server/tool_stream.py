"""Tool calls while the reply that makes them is still streaming: each call's name as soon as it is
written, and as much of its arguments as is certain, so a stream can send them as they come.

What is sent of a call's arguments is always the beginning of what tool_calls.parse gives once the
reply is whole (JSON in json.dumps' spelling): for a JSON object being written, the text up to its
last finished member, or into an unfinished string value, re-spelled; for the XML formats, the
parameters closed so far. A call counts only once its name is one of the request's tools.
"""

import itertools
import json
import re
from collections.abc import Mapping

from llogos_cli.server import tool_markup

# Where a call in JSON begins, up to its arguments' opening brace: a Hermes or Mistral call object, a
# Llama 3 one (at the start, after <|python_tag|>, or after ";"), a plain one at the reply's start or
# in a list, Mistral's name[ARGS], and a harmony message to a function.
_JSON_HEADS = (
    re.compile(r'(?:^|[;,\[]|<\|python_tag\|>|<tool_call>|\[TOOL_CALLS\])\s*(?:```(?:json)?\s*)?'
               r'\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)'),
    re.compile(r"\[TOOL_CALLS\]\s*([^\[\s{]+)\s*\[ARGS\]\s*(?=\{)"),
    re.compile(tool_markup.HARMONY_CALL.pattern + r"\s*(?=\{)", re.S),
)
_CLOSERS = {"{": "}", "[": "]"}
# A \uXXXX escape of these begins a surrogate pair: its character is not known until the pair's second half.
_HIGH_SURROGATES = ("d8", "d9", "da", "db")


def partial_calls(text: str, tools: Mapping) -> list[tuple[str, str]]:
    """(name, the certain beginning of its arguments as JSON text) for each call begun in `text`."""
    for reader in (tool_markup.qwen3_coder, tool_markup.glm):
        found = list(itertools.takewhile(lambda f: f.name in tools, reader(text, tools)))
        if found:
            return [(f.name, _dumped(f.arguments, f.complete)) for f in found]
    return _json_calls(text, tools)


def _dumped(arguments: dict, complete: bool) -> str:
    whole = json.dumps(arguments, ensure_ascii=False)
    return whole if complete else whole[:-1]


def _json_calls(text: str, tools: Mapping) -> list[tuple[str, str]]:
    heads = sorted((m for head in _JSON_HEADS for m in head.finditer(text)), key=lambda m: m.start())
    calls, at = [], 0
    for m in heads:
        if m.start() < at:
            continue
        if m.group(1) not in tools:
            break
        read = json_prefix(text, m.end())
        if read is None:   # not JSON once closed: tool_calls.parse reads no call here either
            break
        prefix, end = read
        calls.append((m.group(1), prefix))
        if end is None:
            break
        at = end
    return calls


def json_prefix(text: str, start: int) -> tuple[str, int | None] | None:
    """The certain beginning of json.dumps of the object that starts at text[start], and where the
    object ends (None while it is unfinished); None if it closed and is not JSON."""
    closers: list[str] = []         # what closes each open bracket, outermost first
    in_string = is_key = expect_key = escape = False
    hex_left = 0                    # digits still to come of a \uXXXX escape
    cut = None                      # the last safe place: (where, what closes a string cut there, closers)
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if hex_left:
                hex_left -= 1
                safe = not hex_left and text[i - 3:i - 1].lower() not in _HIGH_SURROGATES
            elif escape:
                escape, hex_left = False, 4 if c == "u" else 0
                safe = not hex_left
            elif c == "\\":
                escape, safe = True, False
            elif c == '"':
                in_string = False
                if not is_key:
                    cut = (i + 1, "", closers[:])
                continue
            else:
                safe = True
            if safe and not is_key:
                cut = (i + 1, '"', closers[:])
        elif c == '"':
            in_string, is_key, expect_key = True, expect_key, False
        elif c in "{[":
            closers.append(_CLOSERS[c])
            expect_key = c == "{"
            cut = (i + 1, "", closers[:])
        elif c in "}]":
            closers.pop()
            if not closers:
                try:
                    return json.dumps(json.loads(text[start:i + 1]), ensure_ascii=False), i + 1
                except json.JSONDecodeError:
                    return None
            cut = (i + 1, "", closers[:])
        elif c == ",":
            expect_key = closers[-1] == "}"
            cut = (i, "", closers[:])
    if cut is None:
        return "", None
    where, quote, still_open = cut
    return _healed(text[start:where], quote + "".join(reversed(still_open))), None


def _healed(head: str, added: str) -> str:
    """json.dumps of the object begun by `head` and closed by `added`, less what closed it."""
    try:
        whole = json.dumps(json.loads(head + added), ensure_ascii=False)
    except json.JSONDecodeError:
        return ""
    return whole[:len(whole) - len(added)]
