"""Engine tokens and results -> the API's responses: whole bodies, and server-sent event chunks.

A token's text is what it adds to the reply after stop strings are held back, so a stream's
chunks join to exactly the whole response's text; what is released only at the end (a held-back
prefix of a stop string that never completed, a partial UTF-8 character) goes in the last chunk.
"""

import time

from pydantic import BaseModel

from llogos_cli.engine.batch import Result
from llogos_cli.engine.sequence import Token
from llogos_cli.server import request_log
from llogos_cli.server import schemas as s
from llogos_cli.server import tool_calls

FINISH = {"eos": "stop", "stop-string": "stop", "limit": "length"}
DONE = b"data: [DONE]\n\n"
# OpenAI's own value for a log-probability too small to report; here, a sampled token outside the
# top N the engine was asked for (only possible when sampling with top_k 0 or with penalties).
FLOOR_LOGPROB = -9999.0


def sse(event: BaseModel, exclude: set[str] | None = None) -> bytes:
    return b"data: " + event.model_dump_json(exclude=exclude).encode() + b"\n\n"


class _Renderer:
    def __init__(self, rid: str, model: str, tokenizer, n_top: int | None, prompt_n: int, include_usage: bool,
                 tools: frozenset[str] = frozenset(), parallel_tool_calls: bool = True):
        self.rid, self.model, self.tokenizer = rid, model, tokenizer
        self.n_top, self.prompt_n, self.include_usage = n_top, prompt_n, include_usage
        self.tools, self.parallel_tool_calls = tools, parallel_tool_calls
        self.created = int(time.time())
        self.sent = ""           # streamed text so far

    def _sse(self, chunk: BaseModel) -> bytes:
        # OpenAI sends a chunk's "usage" (null until the last) only to streams that asked for it.
        return sse(chunk, exclude=None if self.include_usage else {"usage"})

    def usage(self, result: Result) -> s.Usage:
        """The finished request's token counts, for its response and for its line in the request log."""
        n = result.timings.predicted_n
        request_log.note_tokens(self.prompt_n, n)
        return s.Usage(prompt_tokens=self.prompt_n, completion_tokens=n, total_tokens=self.prompt_n + n,
                       prompt_tokens_details=s.PromptTokensDetails(cached_tokens=result.prefix_hit))

    def _piece(self, token_id: int) -> tuple[str, list[int]]:
        raw = self.tokenizer.token_bytes(token_id, special=True)
        return raw.decode("utf-8", errors="replace"), list(raw)

    def _top(self, token_id: int, top: list) -> tuple[float, list[tuple[str, list[int], float]]]:
        """The token's own log-probability and the first n_top of the engine's top list."""
        own = next((lp for i, lp in top if i == token_id), FLOOR_LOGPROB)
        return own, [(*self._piece(i), lp) for i, lp in top[:self.n_top]]


class ChatRenderer(_Renderer):
    """With tools, a stream holds back text from where tool calls may start (the reply's start, when
    it could be a JSON call, or a call marker), and sends the calls, parsed, in its last chunks."""

    _held = ""              # streamed text not sent yet because it may be tool calls
    _holding = False        # a call marker was seen: the rest of the reply is held

    def _chunk(self, delta: s.ChatDelta, finish: str | None = None, logprobs=None) -> bytes:
        choice = s.ChatChunkChoice(delta=delta, finish_reason=finish, logprobs=logprobs)
        return self._sse(s.ChatCompletionChunk(id=self.rid, created=self.created, model=self.model, choices=[choice]))

    def _logprobs(self, ids: list[int], tops: list) -> s.ChatLogprobs:
        content = []
        for token_id, top in zip(ids, tops):
            own, shown = self._top(token_id, top)
            text, raw = self._piece(token_id)
            content.append(s.TokenLogprob(token=text, logprob=own, bytes=raw, top_logprobs=[
                s.TopLogprob(token=t, logprob=lp, bytes=b) for t, b, lp in shown]))
        return s.ChatLogprobs(content=content)

    def first(self) -> list[bytes]:
        return [self._chunk(s.ChatDelta(role="assistant", content=""))]

    def token(self, token: Token) -> bytes | None:
        text = self._release(token.text) if self.tools else token.text
        if not text and self.n_top is None:
            return None
        self.sent += text
        logprobs = None if self.n_top is None else self._logprobs([token.id], [token.logprobs])
        return self._chunk(s.ChatDelta(content=text), logprobs=logprobs)

    def _release(self, text: str) -> str:
        """What of the reply so far can be sent: none of what may be the start of tool calls."""
        self._held += text
        if self._holding or (not self.sent and tool_calls.could_start_call(self._held)):
            return ""
        held = self._held
        cut = min((i for i in (held.find(m) for m in tool_calls.MARKERS) if i >= 0), default=-1)
        if cut >= 0:
            self._holding = True
        else:   # keep back a tail that may be the start of a marker
            cut = len(held) - max((n for m in tool_calls.MARKERS for n in range(1, min(len(m), len(held)) + 1)
                                   if held.endswith(m[:n])), default=0)
        self._held = held[cut:]
        return held[:cut]

    def _reply(self, result: Result) -> tuple[str | None, list[tool_calls.ToolCall], str]:
        """The reply's content, its tool calls, and its finish reason."""
        if not self.tools:
            return result.text, [], FINISH[result.stop]
        content, calls = tool_calls.parse(result.text, self.tools)
        if not calls:
            return result.text, [], FINISH[result.stop]
        return content, calls if self.parallel_tool_calls else calls[:1], "tool_calls"

    def last(self, result: Result) -> list[bytes]:
        usage = self.usage(result)
        content, calls, finish = self._reply(result)
        if calls:   # what content is left, then each call whole, in OpenAI's delta shape
            tail = content[len(self.sent):] if content and content.startswith(self.sent) else ""
            chunks = [self._chunk(s.ChatDelta(content=tail))] if tail else []
            chunks += [self._chunk(s.ChatDelta(tool_calls=[s.ToolCallDelta(
                index=i, id=c.id, type="function", function=s.FunctionDelta(name=c.name, arguments=c.arguments))]))
                for i, c in enumerate(calls)]
            chunks.append(self._chunk(s.ChatDelta(), finish))
        else:
            chunks = [self._chunk(s.ChatDelta(content=result.text[len(self.sent):] or None), finish)]
        if self.include_usage:
            chunks.append(self._sse(s.ChatCompletionChunk(id=self.rid, created=self.created, model=self.model,
                                                    choices=[], usage=usage)))
        return chunks

    def whole(self, result: Result) -> s.ChatCompletion:
        logprobs = None if self.n_top is None else self._logprobs(result.tokens, result.logprobs)
        content, calls, finish = self._reply(result)
        made = [s.ToolCallOut(id=c.id, function=s.FunctionCallOut(name=c.name, arguments=c.arguments))
                for c in calls] or None
        choice = s.ChatChoice(message=s.AssistantMessage(content=content, tool_calls=made), finish_reason=finish,
                              logprobs=logprobs)
        return s.ChatCompletion(id=self.rid, created=self.created, model=self.model, choices=[choice],
                                usage=self.usage(result))


class CompletionRenderer(_Renderer):
    def _body(self, text: str, finish: str | None, logprobs=None, usage=None) -> s.Completion:
        choice = s.CompletionChoice(text=text, finish_reason=finish, logprobs=logprobs)
        return s.Completion(id=self.rid, created=self.created, model=self.model, choices=[choice], usage=usage)

    def _logprobs(self, ids: list[int], tops: list, offset: int) -> s.CompletionLogprobs:
        lp = s.CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        for token_id, top in zip(ids, tops):
            own, shown = self._top(token_id, top)
            text = self._piece(token_id)[0]
            lp.tokens.append(text)
            lp.token_logprobs.append(own)
            lp.top_logprobs.append({t: p for t, _, p in shown})
            lp.text_offset.append(offset)
            offset += len(text)
        return lp

    def first(self) -> list[bytes]:
        return []

    def token(self, token: Token) -> bytes | None:
        if not token.text and self.n_top is None:
            return None
        logprobs = None if self.n_top is None else self._logprobs([token.id], [token.logprobs], len(self.sent))
        self.sent += token.text
        return self._sse(self._body(token.text, None, logprobs))

    def last(self, result: Result) -> list[bytes]:
        usage = self.usage(result)
        chunks = [self._sse(self._body(result.text[len(self.sent):], FINISH[result.stop]))]
        if self.include_usage:
            chunks.append(self._sse(s.Completion(id=self.rid, created=self.created, model=self.model, choices=[],
                                           usage=usage)))
        return chunks

    def whole(self, result: Result) -> s.Completion:
        logprobs = None if self.n_top is None else self._logprobs(result.tokens, result.logprobs, 0)
        return self._body(result.text, FINISH[result.stop], logprobs, self.usage(result))
