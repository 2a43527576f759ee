"""An API conversation with tools -> the messages a chat template renders.

Messages take HF transformers' shape (a call's arguments decoded into an object), and the tools go
to the template as `tools=`. Templates differ in what they can show, so what this passes is fitted
to the template's source:
- one that never mentions tools gets them in the system message, with the instruction to answer a
  call as the JSON object the fallback parser in tool_calls.py reads;
- one that reads them as a JSON string on the system message (Phi-4-mini) gets them there;
- one that knows no tool calls or tool messages gets them as text (the call as JSON, the result as
  a user message);
- one that insists on 9-character call ids (Mistral) gets a digest of each id.
"""

import hashlib
import json

from llogos_cli.server.schemas import ChatMessage

# OpenAI's newer name for the system message, which chat templates do not know.
_ROLES = {"developer": "system"}
# How templates that take the tools as a JSON string on the system message read it.
_SYSTEM_TOOLS = ("message['tools']", 'message["tools"]', "message.tools")
# Mistral's templates refuse tool call ids that are not 9 characters long; OpenAI's are longer.
_NINE_CHARACTER_IDS = "length != 9"


def template_messages(messages: list[ChatMessage], tools: list[dict], source: str) -> list[dict]:
    """The messages for a template of this source; `tools` are the functions offered (may be none)."""
    shaped = [_template_message(m, source) for m in messages]
    if tools and any(field in source for field in _SYSTEM_TOOLS):
        return _with_system_tools(shaped, tools)
    if tools and "tools" not in source:
        return _with_tool_prompt(shaped, tools)
    return shaped


def _template_message(m: ChatMessage, source: str) -> dict:
    """The message as chat templates read it (HF's shape: a call's arguments decoded); for a template
    that knows no tool messages, calls and results become text it can show."""
    role = _ROLES.get(m.role, m.role)
    message = {"role": role, "content": m.text}
    if m.tool_calls:
        calls = [{"id": _template_id(c.id, source), "type": "function",
                  "function": {"name": c.function.name, "arguments": _decoded(c.function.arguments)}}
                 for c in m.tool_calls]
        if "tool_calls" in source:
            message["tool_calls"] = calls
        else:
            shown = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]
            message["content"] = "\n".join(filter(None, [m.text, *(json.dumps(c, ensure_ascii=False) for c in shown)]))
    if role == "tool":
        if "tool" in source:
            message["tool_call_id"] = _template_id(m.tool_call_id, source)
            if m.name:
                message["name"] = m.name
        else:
            message = {"role": "user", "content": f"The result of call {m.tool_call_id}: {m.text}"}
    return message


def _template_id(call_id: str, source: str) -> str:
    """The call's id as the template wants it: for a template that insists on 9 characters, a 9-digit
    hex digest of it (the same for the call and its result, so the pair still matches)."""
    if _NINE_CHARACTER_IDS in source and not (len(call_id) == 9 and call_id.isalnum()):
        return hashlib.sha256(call_id.encode()).hexdigest()[:9]
    return call_id


def _decoded(arguments: str):
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def _with_system_tools(messages: list[dict], tools: list[dict]) -> list[dict]:
    listed = json.dumps([{"type": "function", "function": t} for t in tools], ensure_ascii=False)
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "tools": listed}, *messages[1:]]
    return [{"role": "system", "content": "", "tools": listed}, *messages]


def _with_tool_prompt(messages: list[dict], tools: list[dict]) -> list[dict]:
    prompt = ("You can call these functions:\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
              + "\nTo call one, reply with only a JSON object: {\"name\": the function's name, \"arguments\": "
                "an object of its arguments}.")
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": messages[0]["content"] + "\n\n" + prompt}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]
