"""Anthropic's Messages API (/v1/messages, what Claude Code and the `anthropic` SDK speak) as a
translation of the chat endpoint's.

A request becomes the chat completion request it means (system blocks as the system message,
tool_use and tool_result blocks as tool calls and tool messages, tool_choice's any as required),
which prepare_chat turns into the engine's Request with the same template, tool prompt, grammar
and reasoning split as /v1/chat/completions. The reply comes back through the chat renderer, whose
deltas (reasoning, text, parsed tool calls, the finish) become content blocks and the named
events of Anthropic's stream.
"""

import json
from dataclasses import replace

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from llogos_cli.engine.batch import Result
from llogos_cli.server import anthropic_schemas as api
from llogos_cli.server import schemas
from llogos_cli.server.blocks import CALL, REASONING, BlockRenderer
from llogos_cli.server.errors import ApiError
from llogos_cli.server.prepare import Prepared, prepare_chat
from llogos_cli.server.render import Envelope

PATH = "/v1/messages"
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
# Anthropic's error type for each status this server answers with.
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                405: "invalid_request_error", 413: "request_too_large", 500: "api_error", 503: "overloaded_error"}
_STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens"}
# A thinking budget as the reasoning effort templates know (gpt-oss's low/medium/high): at least this
# many tokens for each, the largest that fits.
_EFFORTS = ((16384, "high"), (4096, "medium"), (0, "low"))
_DEFAULT_BUDGET = 4096   # thinking without a budget (adaptive): the middle effort
ERROR_PREFIX = "Error: "   # before a failed tool call's result (is_error) in the text the model reads


# ---------------------------------------------------------------------------------------- requests

def prepare(body: api.MessagesRequest, tokenizer, chat, defaults, n_ctx: int) -> tuple[schemas.ChatCompletionRequest,
                                                                                      Prepared]:
    """The chat request the body means, and its engine requests. max_tokens past the context's
    room is generation to the context's end, not an error: Claude Code asks every model for 32000."""
    request = chat_request(body)
    prepared = prepare_chat(request, tokenizer, chat, defaults, n_ctx)
    limit = min(body.max_tokens, n_ctx - len(prepared.requests[0].prompt))
    requests = tuple(replace(r, criteria=replace(r.criteria, n_predict=limit)) for r in prepared.requests)
    return request, replace(prepared, id="msg_" + prepared.id.partition("-")[2], requests=requests)


def count_tokens(body: api.CountTokensRequest, tokenizer, chat, defaults, n_ctx: int) -> api.CountTokens:
    """Exactly the prompt a Messages request with this body would run."""
    prepared = prepare_chat(chat_request(body), tokenizer, chat, defaults, n_ctx)
    return api.CountTokens(input_tokens=len(prepared.requests[0].prompt))


def chat_request(body: api.CountTokensRequest) -> schemas.ChatCompletionRequest:
    messages = [{"role": "system", "content": _text(body.system)}] if body.system else []
    for i, m in enumerate(body.messages):
        messages += _chat_messages(m, f"messages.{i}.content")
    fields: dict = {"messages": messages}
    tools = [t for t in body.tools or () if t.client]
    if tools:
        fields["tools"] = [{"type": "function", "function": {"name": t.name, "parameters": t.input_schema,
                                                             **({"description": t.description} if t.description else {})}}
                           for t in tools]
    choice = body.tool_choice
    if choice is not None and (tools or choice.type in ("any", "tool")):
        fields["tool_choice"] = _TOOL_CHOICES.get(choice.type) or {"type": "function", "function": {"name": choice.name}}
        fields["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    if body.thinking is not None:
        fields.update(_thinking(body.thinking))
    if isinstance(body, api.MessagesRequest):
        fields.update(stop=body.stop_sequences, stream=body.stream, temperature=body.temperature, top_p=body.top_p,
                      top_k=body.top_k)
        fmt = body.output_config.format if body.output_config else None
        if fmt is not None:
            fields["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.schema_}}
    try:
        return schemas.ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as e:
        raise ApiError(400, schemas.explain(e.errors())) from None


def _thinking(thinking: api.Thinking) -> dict:
    """Thinking on or off as the template's switches: enable_thinking (Qwen3, GLM, SmolLM3) and the
    reasoning effort (gpt-oss, which always reasons: off is its least). A template with neither
    ignores them, and its model simply answers."""
    on = thinking.type != "disabled"
    budget = 0 if not on else _DEFAULT_BUDGET if thinking.budget_tokens is None else thinking.budget_tokens
    effort = next(name for least, name in _EFFORTS if budget >= least)
    return {"chat_template_kwargs": {"enable_thinking": on}, "reasoning_effort": effort}


def _chat_messages(m: api.Message, where: str) -> list[dict]:
    """One Anthropic message as chat messages: a user message's tool results become tool messages
    (first: they answer the calls of the assistant message before), its text a user message."""
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    texts, calls, results = [], [], []
    for j, block in enumerate(m.content):
        if block.type == "text":
            texts.append(block.text)
        elif block.type in ("image", "document"):
            raise ApiError(400, f"{where}.{j}: {block.type} blocks are not supported: the model reads text only")
        elif block.type == "tool_use" and m.role == "assistant":
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}})
        elif block.type == "tool_result" and m.role == "user":
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _result(block, where)})
        elif block.type in ("tool_use", "tool_result"):
            raise ApiError(400, f"{where}.{j}: a {block.type} block cannot be in a {m.role} message")
    if m.role == "assistant":
        return [{"role": "assistant", "content": "\n".join(texts) or (None if calls else ""), "tool_calls": calls or None}]
    return results + ([{"role": "user", "content": "\n".join(texts)}] if texts or not results else [])


def _result(block: api.ToolResultBlock, where: str) -> str:
    """A tool result as the tool message's text. The chat templates carry a tool message's content
    and nothing else, so a failed call (is_error) says so in that text: ERROR_PREFIX before it."""
    text = _text(block.content, where)
    return ERROR_PREFIX + text if block.is_error else text


def _text(content: str | list, where: str = "system") -> str:
    if isinstance(content, str):
        return content
    if any(b.type != "text" for b in content):
        raise ApiError(400, f"{where}: only text can be a tool's result here: the model reads text only")
    return "\n".join(b.text for b in content)


# --------------------------------------------------------------------------------------- responses

def _event(name: str, **data) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n".encode()


def _error(e: ApiError) -> api.ErrorOut:
    return api.ErrorOut(error=api.ErrorDetail(type=_ERROR_TYPES.get(e.status, "invalid_request_error"),
                                              message=e.message))


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(_error(e).model_dump(), e.status, headers=e.headers)


class MessageRenderer(BlockRenderer):
    """The reply as one Anthropic message: reasoning as a thinking block, the answer as a text
    block, each tool call as a tool_use block; streamed, each block opens with content_block_start,
    grows by deltas and ends with content_block_stop."""

    _blocks = 0   # blocks started so far: the open one's index is one less

    def error_event(self, e: ApiError) -> bytes:
        return _event("error", error=_error(e).error.model_dump())

    def first(self) -> list[bytes]:
        r = self.envelope
        start = api.MessageOut(id=r.id, model=r.model, content=[], stop_reason=None,
                               usage=api.Usage(input_tokens=r.prompt_n, output_tokens=0))
        return [_event("message_start", message=start.model_dump()), _event("ping")]

    def _block(self, block) -> list[bytes]:
        self._blocks += 1
        return [_event("content_block_start", index=self._blocks - 1, content_block=block.model_dump())]

    def _start(self, kind: str) -> list[bytes]:
        if kind == CALL:
            return self._block(api.ToolUseOut(id=_tool_id(self._calling.id), name=self._calling.name, input={}))
        return self._block(api.ThinkingOut(thinking="") if kind == REASONING else api.TextOut(text=""))

    def _grow(self, kind: str, text: str) -> bytes:
        delta = {"type": "thinking_delta", "thinking": text} if kind == REASONING else \
            {"type": "input_json_delta", "partial_json": text} if kind == CALL else {"type": "text_delta", "text": text}
        return _event("content_block_delta", index=self._blocks - 1, delta=delta)

    def _stop(self, kind: str, text: str) -> list[bytes]:
        return [_event("content_block_stop", index=self._blocks - 1)]

    def _end(self, finish: str, result: Result) -> list[bytes]:
        reason, sequence = self._stop_reason(finish, result)
        usage = _usage(result.timings.prompt_n, result.timings.predicted_n, result.prefix_hit)
        return [_event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                       usage=usage.model_dump()),
                _event("message_stop")]

    def _stop_reason(self, finish: str, result: Result) -> tuple[str, str | None]:
        """Anthropic's stop_reason, and the client's stop sequence that ended the reply, if one did."""
        if finish in _STOP_REASONS:
            return _STOP_REASONS[finish], None
        if result.stop == "stop-string":
            generated = self.envelope.tokenizer.decode(result.tokens)
            hit = [s for s in self.envelope.stops if s in generated]
            if hit:   # the reply ended at the first stop string it wrote
                return "stop_sequence", min(hit, key=generated.find)
        return "end_turn", None

    def choice(self, result: Result) -> api.MessageOut:
        reply = self.reply(result)
        blocks = [api.ThinkingOut(thinking=reply.reasoning)] if reply.reasoning else []
        blocks += [api.TextOut(text=reply.content)] if reply.content else []
        blocks += [api.ToolUseOut(id=_tool_id(c.id), name=c.name, input=json.loads(c.arguments)) for c in reply.calls]
        reason, sequence = self._stop_reason(reply.finish, result)
        r = self.envelope
        return api.MessageOut(id=r.id, model=r.model, content=blocks, stop_reason=reason, stop_sequence=sequence,
                              usage=api.Usage(input_tokens=0, output_tokens=0))

    @staticmethod
    def whole(r: Envelope, choices: list[api.MessageOut], usage: schemas.Usage) -> api.MessageOut:
        cached = usage.prompt_tokens_details.cached_tokens
        return choices[0].model_copy(update={"usage": _usage(usage.prompt_tokens - cached, usage.completion_tokens,
                                                             cached)})


def _usage(uncached: int, output: int, cached: int) -> api.Usage:
    return api.Usage(input_tokens=uncached, output_tokens=output, cache_read_input_tokens=cached)


def _tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")
