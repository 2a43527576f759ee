"""OpenAI's Responses API (/v1/responses, what Codex speaks) as a translation of the chat endpoint's.

A request becomes the chat completion request it means (instructions as the system message,
input items as messages, function_call and function_call_output items as an assistant's tool
calls and the tool messages that answer them, text.format as response_format), which
prepare_chat turns into the engine's Request. The reply comes back through the chat renderer as
output items (reasoning, a message, function calls), streamed as the API's typed events, each with
its sequence number. Nothing is stored: a request carries its whole conversation.
/v1/responses/input_tokens counts the prompt such a request would run.
"""

import json
from dataclasses import replace
from typing import Any

from pydantic import RootModel, ValidationError

from llogos_cli.engine.batch import Result
from llogos_cli.server import responses_schemas as api
from llogos_cli.server import schemas
from llogos_cli.server.blocks import CALL, REASONING, BlockRenderer
from llogos_cli.server.errors import ApiError
from llogos_cli.server.prepare import Prepared, prepare_chat
from llogos_cli.server.render import Envelope
from llogos_cli.server.tool_calls import ToolCall

PATH = "/v1/responses"
Body = RootModel[dict[str, Any]]   # a response's JSON, built as the API's documents are
_NO_THINKING = ("none", "minimal")
# The Responses API's efforts that gpt-oss's template does not name, as the nearest it does.
_EFFORTS = {"none": "low", "minimal": "low", "xhigh": "high"}
_FIELDS = {"max_tokens": "max_output_tokens", "response_format": "text.format"}   # the chat request's -> this API's


# ---------------------------------------------------------------------------------------- requests

def prepare(body: api.ResponsesRequest, tokenizer, chat, defaults, n_ctx: int) -> tuple[schemas.ChatCompletionRequest,
                                                                                       Prepared]:
    if body.previous_response_id is not None:
        raise ApiError(400, "previous_response_id is not supported: this server keeps no responses; send the "
                       "whole conversation as input", param="previous_response_id")
    request = chat_request(body)
    try:
        prepared = prepare_chat(request, tokenizer, chat, defaults, n_ctx)
    except ApiError as e:   # named as this API names the field
        if e.param in _FIELDS:
            e.param, e.message = _FIELDS[e.param], e.message.replace(e.param, _FIELDS[e.param], 1)
        raise
    return request, replace(prepared, id="resp_" + prepared.id.partition("-")[2])


def input_tokens(body: api.ResponsesRequest, tokenizer, chat, defaults, n_ctx: int) -> dict:
    """POST /v1/responses/input_tokens: exactly the prompt a response to this body would run."""
    _, prepared = prepare(body, tokenizer, chat, defaults, n_ctx)
    return {"object": "response.input_tokens", "input_tokens": len(prepared.requests[0].prompt)}


def chat_request(body: api.ResponsesRequest) -> schemas.ChatCompletionRequest:
    messages = [{"role": "system", "content": body.instructions}] if body.instructions else []
    items = [api.MessageItem(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    for i, item in enumerate(items):
        _add(messages, item, f"input.{i}")
    fields: dict = {"messages": messages, "max_tokens": body.max_output_tokens, "temperature": body.temperature,
                    "top_p": body.top_p, "stream": body.stream, "parallel_tool_calls": body.parallel_tool_calls}
    tools = [t for t in body.tools or () if t.type == "function"]
    if tools:
        fields["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                           for t in tools]
    choice = body.tool_choice
    if choice is not None and (tools or choice != "auto"):
        fields["tool_choice"] = choice if isinstance(choice, str) else {"type": "function",
                                                                        "function": {"name": choice.name}}
    effort = body.reasoning.effort if body.reasoning else None
    if effort is not None:
        fields.update(_reasoning(effort))
    fmt = body.text.format if body.text else None
    if fmt is not None and fmt.type == "json_schema":
        fields["response_format"] = {"type": "json_schema", "json_schema": fmt.model_dump(
            by_alias=True, exclude={"type"}, exclude_none=True)}
    elif fmt is not None and fmt.type == "json_object":
        fields["response_format"] = {"type": "json_object"}
    try:
        return schemas.ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as e:
        raise ApiError(400, schemas.explain(e.errors())) from None


def _reasoning(effort: str) -> dict:
    """reasoning.effort as the template's switches: none and minimal turn thinking off where the
    template can (enable_thinking), and are gpt-oss's least effort, which always reasons; a template
    with neither switch ignores them."""
    return {"chat_template_kwargs": {"enable_thinking": effort not in _NO_THINKING},
            "reasoning_effort": _EFFORTS.get(effort, effort)}


def _add(messages: list[dict], item, where: str) -> None:
    """One input item onto the chat messages: a function call joins the assistant message before it
    (one turn's text and calls are one message), or starts one."""
    if item.type == "message":
        messages.append({"role": item.role, "content": _text(item.content, where)})
    elif item.type == "function_call":
        call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last["tool_calls"] = [*(last.get("tool_calls") or ()), call]
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif item.type == "function_call_output":
        messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, where)})


def _text(content: str | list, where: str) -> str:
    if isinstance(content, str):
        return content
    other = next((p.type for p in content if p.type not in ("input_text", "output_text")), None)
    if other is not None:
        raise ApiError(400, f"{where}: {other} parts are not supported: the model reads text only", param="input")
    return "".join(p.text for p in content)


# --------------------------------------------------------------------------------------- responses

def _event(name: str, **data) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n".encode()


class ResponseRenderer(BlockRenderer):
    """The reply as a response's output items: reasoning, a message with one output_text part, a
    function_call per tool call; streamed, each item is added, grows by deltas and is done, and the
    response is created first and completed last (its status says whether it is incomplete)."""

    def __init__(self, envelope: Envelope, index: int = 0):
        super().__init__(envelope, index)
        self._seq = 0
        self._output: list[dict] = []   # the items done so far; the open one is next

    def _send(self, name: str, **data) -> bytes:
        self._seq += 1
        return _event(name, sequence_number=self._seq - 1, **data)

    def error_event(self, e: ApiError) -> bytes:
        return self._send("error", code=e.code, message=e.message, param=e.param)

    def first(self) -> list[bytes]:
        started = self._response([], "in_progress", None)
        return [self._send("response.created", response=started), self._send("response.in_progress", response=started)]

    def _item_id(self, prefix: str) -> str:
        return f"{prefix}_{self.envelope.id.partition('_')[2]}_{len(self._output)}"

    def _item(self, kind: str, text: str, status: str) -> dict:
        if kind == REASONING:
            return {"type": "reasoning", "id": self._item_id("rs"), "summary": [], "status": status,
                    "content": [{"type": "reasoning_text", "text": text}] if status == "completed" else []}
        return {"type": "message", "id": self._item_id("msg"), "role": "assistant", "status": status,
                "content": [_part(text)] if status == "completed" else []}

    def _where(self) -> dict:
        prefix = {REASONING: "rs", CALL: "fc"}.get(self._open, "msg")
        return {"output_index": len(self._output), "item_id": self._item_id(prefix)}

    def _start(self, kind: str) -> list[bytes]:
        if kind == CALL:
            item = _function_call(self._item_id("fc"), self._calling)
            return [self._send("response.output_item.added", output_index=len(self._output),
                               item={**item, "status": "in_progress"})]
        item = self._item(kind, "", "in_progress")
        part = {"type": "reasoning_text", "text": ""} if kind == REASONING else _part("")
        return [self._send("response.output_item.added", output_index=len(self._output), item=item),
                self._send("response.content_part.added", item_id=item["id"], output_index=len(self._output),
                           content_index=0, part=part)]

    def _grow(self, kind: str, text: str) -> bytes:
        if kind == CALL:
            return self._send("response.function_call_arguments.delta", **self._where(), delta=text)
        if kind == REASONING:
            return self._send("response.reasoning_text.delta", **self._where(), content_index=0, delta=text)
        return self._send("response.output_text.delta", **self._where(), content_index=0, delta=text, logprobs=[])

    def _stop(self, kind: str, text: str) -> list[bytes]:
        if kind == CALL:
            item = _function_call(self._item_id("fc"), replace(self._calling, arguments=text))
            where = self._where()
            self._output.append(item)
            return [self._send("response.function_call_arguments.done", **where, arguments=text),
                    self._send("response.output_item.done", output_index=where["output_index"], item=item)]
        item = self._item(kind, text, "completed")
        where = self._where()
        done = (self._send("response.reasoning_text.done", **where, content_index=0, text=text) if kind == REASONING
                else self._send("response.output_text.done", **where, content_index=0, text=text, logprobs=[]))
        out = [done, self._send("response.content_part.done", **where, content_index=0, part=item["content"][0]),
               self._send("response.output_item.done", output_index=where["output_index"], item=item)]
        self._output.append(item)
        return out

    def _end(self, finish: str, result: Result) -> list[bytes]:
        usage = _usage(result.timings.prompt_n + result.prefix_hit, result.timings.predicted_n, result.prefix_hit)
        status = "incomplete" if finish == "length" else "completed"
        # Clients wait for response.completed whatever the status (Codex and the openai SDK end on it).
        return [self._send("response.completed", response=self._response(self._output, status, usage))]

    def _response(self, output: list[dict], status: str, usage: dict | None) -> dict:
        r = self.envelope
        return {"id": r.id, "object": "response", "created_at": r.created, "status": status, "model": r.model,
                "output": output, "parallel_tool_calls": r.parallel_tool_calls, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "usage": usage}

    def choice(self, result: Result) -> dict:
        reply = self.reply(result)
        if reply.reasoning:
            self._output.append(self._item(REASONING, reply.reasoning, "completed"))
        if reply.content:
            self._output.append(self._item("text", reply.content, "completed"))
        for call in reply.calls:
            self._output.append(_function_call(self._item_id("fc"), call))
        return self._response(self._output, "incomplete" if reply.finish == "length" else "completed", None)

    @staticmethod
    def whole(r: Envelope, choices: list[dict], usage: schemas.Usage) -> Body:
        return Body({**choices[0], "usage": _usage(usage.prompt_tokens, usage.completion_tokens,
                                                   usage.prompt_tokens_details.cached_tokens)})


def _part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _function_call(item_id: str, call: ToolCall) -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": "completed"}


def _usage(prompt: int, output: int, cached: int) -> dict:
    """OpenAI's usage: input_tokens counts the whole prompt, cached_tokens the part reused."""
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": output,
            "total_tokens": prompt + output}
