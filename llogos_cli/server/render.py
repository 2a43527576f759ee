"""Engine tokens and results -> the API's responses: whole bodies, and server-sent event chunks.

A token's text is what it adds to the reply after stop strings are held back, so a stream's
chunks join to exactly the whole response's text; what is released only at the end (a held-back
prefix of a stop string that never completed, a partial UTF-8 character) goes in the last chunk.
A request for n choices runs n engine rows; each row's tokens go through its own renderer, which
marks its chunks with the choice's index, and Choices joins them under one id and one usage.
"""

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel

from llogos_cli.engine.batch import Result
from llogos_cli.engine.completion import Token
from llogos_cli.engine.reasoning import Reasoning, Split
from llogos_cli.server import request_log
from llogos_cli.server import schemas
from llogos_cli.server import tool_calls, tool_stream
from llogos_cli.server.errors import ApiError

FINISH = {"eos": "stop", "stop-string": "stop", "limit": "length"}
DONE = b"data: [DONE]\n\n"
# OpenAI's own value for a log-probability too small to report; here, a sampled token outside the
# top N the engine was asked for (only possible when sampling with top_k 0 or with penalties).
FLOOR_LOGPROB = -9999.0


def sse(event: BaseModel, exclude: set[str] | None = None) -> bytes:
    return b"data: " + event.model_dump_json(exclude=exclude).encode() + b"\n\n"


@dataclass(frozen=True, slots=True)
class Envelope:
    """What every chunk and body of one response shares."""
    id: str
    model: str
    tokenizer: object
    n_top: int | None                  # top log-probabilities to report; None: none at all
    include_usage: bool = False        # a stream asked for usage (stream_options)
    tools: Mapping[str, dict] | frozenset[str] = frozenset()   # each tool's parameter schema, or only names
    parallel_tool_calls: bool = True
    reasoning: Reasoning | None = None   # a chat reply's reasoning goes to reasoning_content
    return_tokens: bool = False        # each choice, and each chunk, carries its token ids
    stops: tuple[str, ...] = ()        # the client's stop strings, for APIs that name the one that ended a reply
    prompt_n: int = 0                  # the prompt's tokens, for APIs that tell them before the reply
    prompt_ns: tuple[int, ...] = ()    # each choice's, where a response has several prompts (/completion's)
    created: int = field(default_factory=lambda: int(time.time()))

    def sse(self, chunk: BaseModel) -> bytes:
        # OpenAI sends a chunk's "usage" (null until the last) only to streams that asked for it.
        return sse(chunk, exclude=None if self.include_usage else {"usage"})


class _Renderer:
    """One choice's tokens and result."""

    END = (DONE,)   # what a stream sends once every choice has finished

    def error_event(self, e: ApiError) -> bytes:
        """A failure after a stream has begun, as this API's clients read it."""
        return sse(e.body())

    def __init__(self, envelope: Envelope, index: int = 0):
        self.envelope, self.index = envelope, index
        self.sent = ""           # streamed text so far

    @property
    def _quiet(self) -> bool:
        """A token whose text adds nothing needs no chunk: nothing else is reported per token."""
        return self.envelope.n_top is None and not self.envelope.return_tokens

    def _ids(self, ids: list[int]) -> list[int] | None:
        return list(ids) if self.envelope.return_tokens else None

    def _piece(self, token_id: int) -> tuple[str, list[int]]:
        raw = self.envelope.tokenizer.token_bytes(token_id, special=True)
        return raw.decode("utf-8", errors="replace"), list(raw)

    def _top(self, token_id: int, top: list) -> tuple[float, list[tuple[str, list[int], float]]]:
        """The token's own log-probability and the first n_top of the engine's top list."""
        own = next((lp for i, lp in top if i == token_id), FLOOR_LOGPROB)
        return own, [(*self._piece(i), lp) for i, lp in top[:self.envelope.n_top]]


class ChatRenderer(_Renderer):
    """A reply's reasoning (where the envelope says how to tell it) streams as reasoning_content,
    its answer as content. With tools, a stream holds back answer text from where tool calls may
    start (the reply's start, when it could be a JSON call, or a call marker), and sends each call
    from there as tool_calls deltas: its id and name once they are written, its arguments as they
    become certain (tool_stream.py), the rest of them once the reply is whole and parsed."""

    _held = ""              # streamed text not sent yet because it may be tool calls
    _holding = False        # a call marker was seen: the rest of the reply is held
    _thought = ""           # streamed reasoning so far

    def __init__(self, envelope: Envelope, index: int = 0):
        super().__init__(envelope, index)
        self._splitter = envelope.reasoning.splitter() if envelope.reasoning else None
        self._calls: list[list[str]] = []   # [id, name, arguments sent] of each call streamed so far

    def _chunk(self, delta: schemas.ChatDelta, finish: str | None = None, logprobs=None, tokens=None,
               timings: dict | None = None) -> bytes:
        choice = schemas.ChatChunkChoice(index=self.index, delta=delta, finish_reason=finish, logprobs=logprobs,
                                         tokens=tokens)
        r = self.envelope
        if timings is not None:
            return r.sse(schemas.TimedChatCompletionChunk(id=r.id, created=r.created, model=r.model, choices=[choice],
                                                          timings=timings))
        return r.sse(schemas.ChatCompletionChunk(id=r.id, created=r.created, model=r.model, choices=[choice]))

    def _logprobs(self, ids: list[int], tops: list) -> schemas.ChatLogprobs:
        content = []
        for token_id, top in zip(ids, tops):
            own, shown = self._top(token_id, top)
            text, raw = self._piece(token_id)
            content.append(schemas.TokenLogprob(token=text, logprob=own, bytes=raw, top_logprobs=[
                schemas.TopLogprob(token=t, logprob=lp, bytes=b) for t, b, lp in shown]))
        return schemas.ChatLogprobs(content=content)

    def first(self) -> list[bytes]:
        return [self._chunk(schemas.ChatDelta(role="assistant", content=""))]

    def token(self, token: Token) -> bytes | None:
        piece = self._splitter.push(token.text) if self._splitter else Split(content=token.text)
        text = self._release(piece.content) if self.envelope.tools else piece.content
        calls = self._call_deltas() if self._held else None
        if not text and not piece.reasoning and not calls and self._quiet:
            return None
        self.sent += text
        self._thought += piece.reasoning
        logprobs = None if self.envelope.n_top is None else self._logprobs([token.id], [token.logprobs])
        return self._chunk(schemas.ChatDelta(content=text if text or not (piece.reasoning or calls) else None,
                                             reasoning_content=piece.reasoning or None, tool_calls=calls),
                           logprobs=logprobs, tokens=self._ids([token.id]))

    def _call_deltas(self) -> list[schemas.ToolCallDelta] | None:
        """What the held text says of its calls that was not sent yet: new calls, more arguments."""
        found = tool_stream.partial_calls(self._held, self.envelope.tools)
        deltas = []
        for i, (name, arguments) in enumerate(found if self.envelope.parallel_tool_calls else found[:1]):
            new = i == len(self._calls)
            if new:
                self._calls.append([tool_calls.new_id(), name, ""])
            sent = self._calls[i][2]
            more = arguments[len(sent):] if arguments.startswith(sent) else ""
            self._calls[i][2] += more
            if new or more:
                deltas.append(schemas.ToolCallDelta(index=i, id=self._calls[i][0] if new else None,
                                                    type="function" if new else None,
                                                    function=schemas.FunctionDelta(name=name if new else None,
                                                                                   arguments=more)))
        return deltas or None

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

    def _split(self, result: Result) -> Split:
        return self.envelope.reasoning.split(result.text) if self.envelope.reasoning else Split(content=result.text)

    def _reply(self, answer: str, stop: str) -> tuple[str | None, list[tool_calls.ToolCall], str]:
        """The answer's content, its tool calls, and the finish reason."""
        if not self.envelope.tools:
            return answer, [], FINISH[stop]
        content, calls = tool_calls.parse(answer, self.envelope.tools)
        if not calls:
            return answer, [], FINISH[stop]
        return content, calls if self.envelope.parallel_tool_calls else calls[:1], "tool_calls"

    def last(self, result: Result) -> list[bytes]:
        whole = self._split(result)
        content, calls, finish = self._reply(whole.content, result.stop)
        thought = whole.reasoning[len(self._thought):] or None   # what the splitter held to the end
        if not calls:
            return [self._chunk(schemas.ChatDelta(content=whole.content[len(self.sent):] or None,
                                                  reasoning_content=thought), finish, timings=result.timings_record())]
        # What reasoning and content are left, then each call whole, in OpenAI's delta shape.
        tail = content[len(self.sent):] if content and content.startswith(self.sent) else ""
        chunks = [self._chunk(schemas.ChatDelta(content=tail or None, reasoning_content=thought))] \
            if tail or thought else []
        chunks += [self._chunk(schemas.ChatDelta(tool_calls=[delta])) for delta in self._rest_of_calls(calls)]
        chunks.append(self._chunk(schemas.ChatDelta(), finish, timings=result.timings_record()))
        return chunks

    def _rest_of_calls(self, calls: list[tool_calls.ToolCall]) -> list[schemas.ToolCallDelta]:
        """The whole reply's calls less what was streamed of them."""
        deltas = []
        for i, c in enumerate(calls):
            if i < len(self._calls) and self._calls[i][1] == c.name and c.arguments.startswith(self._calls[i][2]):
                rest = c.arguments[len(self._calls[i][2]):]
                if rest:
                    deltas.append(schemas.ToolCallDelta(index=i, function=schemas.FunctionDelta(arguments=rest)))
            else:
                deltas.append(schemas.ToolCallDelta(index=i, id=c.id, type="function",
                                                    function=schemas.FunctionDelta(name=c.name, arguments=c.arguments)))
        return deltas

    def choice(self, result: Result) -> schemas.ChatChoice:
        logprobs = None if self.envelope.n_top is None else self._logprobs(result.tokens, result.logprobs)
        whole = self._split(result)
        content, calls, finish = self._reply(whole.content, result.stop)
        made = [schemas.ToolCallOut(id=c.id, function=schemas.FunctionCallOut(name=c.name, arguments=c.arguments))
                for c in calls] or None
        message = schemas.AssistantMessage(content=content, reasoning_content=whole.reasoning or None, tool_calls=made)
        return schemas.ChatChoice(index=self.index, message=message, finish_reason=finish, logprobs=logprobs,
                                  tokens=self._ids(result.tokens))

    @staticmethod
    def whole(r: Envelope, choices: list[schemas.ChatChoice], usage: schemas.Usage) -> schemas.ChatCompletion:
        return schemas.ChatCompletion(id=r.id, created=r.created, model=r.model, choices=choices, usage=usage)

    @staticmethod
    def usage_chunk(r: Envelope, usage: schemas.Usage) -> schemas.ChatCompletionChunk:
        return schemas.ChatCompletionChunk(id=r.id, created=r.created, model=r.model, choices=[], usage=usage)


class CompletionRenderer(_Renderer):
    def _choice(self, text: str, finish: str | None, logprobs=None, tokens=None) -> schemas.CompletionChoice:
        return schemas.CompletionChoice(index=self.index, text=text, finish_reason=finish, logprobs=logprobs,
                                        tokens=tokens)

    def _sse(self, text: str, finish: str | None, logprobs=None, tokens=None) -> bytes:
        r = self.envelope
        return r.sse(schemas.Completion(id=r.id, created=r.created, model=r.model,
                                        choices=[self._choice(text, finish, logprobs, tokens)]))

    def _logprobs(self, ids: list[int], tops: list, offset: int) -> schemas.CompletionLogprobs:
        lp = schemas.CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
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
        n_top = self.envelope.n_top
        if not token.text and self._quiet:
            return None
        logprobs = None if n_top is None else self._logprobs([token.id], [token.logprobs], len(self.sent))
        self.sent += token.text
        return self._sse(token.text, None, logprobs, self._ids([token.id]))

    def last(self, result: Result) -> list[bytes]:
        return [self._sse(result.text[len(self.sent):], FINISH[result.stop])]

    def choice(self, result: Result) -> schemas.CompletionChoice:
        logprobs = None if self.envelope.n_top is None else self._logprobs(result.tokens, result.logprobs, 0)
        return self._choice(result.text, FINISH[result.stop], logprobs, self._ids(result.tokens))

    @staticmethod
    def whole(r: Envelope, choices: list[schemas.CompletionChoice], usage: schemas.Usage) -> schemas.Completion:
        return schemas.Completion(id=r.id, created=r.created, model=r.model, choices=choices, usage=usage)

    @staticmethod
    def usage_chunk(r: Envelope, usage: schemas.Usage) -> schemas.Completion:
        return schemas.Completion(id=r.id, created=r.created, model=r.model, choices=[], usage=usage)


class Choices:
    """A response's n choices, one engine request each (request_ids[i] is choice i): their chunks as
    they come, and the usage once every choice has finished."""

    def __init__(self, renderer_class, envelope: Envelope, request_ids: list, prompt_n: int):
        self.envelope, self.prompt_n, self._kind = envelope, prompt_n, renderer_class
        self._index = {rid: i for i, rid in enumerate(request_ids)}
        self._renderers = [renderer_class(envelope, i) for i in range(len(request_ids))]
        self._results: dict[int, Result] = {}

    @property
    def done(self) -> bool:
        return len(self._results) == len(self._renderers)

    def first(self) -> list[bytes]:
        return [chunk for r in self._renderers for chunk in r.first()]

    def token(self, request_id, token: Token) -> bytes | None:
        return self._renderers[self._index[request_id]].token(token)

    def last(self, result: Result) -> list[bytes]:
        """A choice's last chunks; after the last choice's, the usage chunk if the stream asked for it."""
        i = self._index[result.id]
        self._results[i] = result
        chunks = self._renderers[i].last(result)
        if self.done:
            usage = self.usage()
            if self.envelope.include_usage:
                chunks.append(self.envelope.sse(self._kind.usage_chunk(self.envelope, usage)))
            chunks += self._kind.END
        return chunks

    def error(self, e: ApiError) -> bytes:
        return self._renderers[0].error_event(e)

    def add(self, result: Result) -> None:
        """A choice's result, for a response sent whole."""
        self._results[self._index[result.id]] = result

    def body(self) -> BaseModel:
        choices = [self._renderers[i].choice(self._results[i]) for i in range(len(self._renderers))]
        return self._kind.whole(self.envelope, choices, self.usage())

    def usage(self) -> schemas.Usage:
        """The prompt counted once, the completions of every choice; cached tokens are the first
        choice's (the others start from the blocks it left, which are not the client's doing). A
        completion's tokens are those of its reply, one per log-probability entry: the end-of-turn
        token that ended it is no part of it."""
        n = sum(len(r.tokens) for r in self._results.values())
        request_log.note_tokens(self.prompt_n, n)
        cached = schemas.PromptTokensDetails(cached_tokens=self._results[0].prefix_hit)
        return schemas.Usage(prompt_tokens=self.prompt_n, completion_tokens=n, total_tokens=self.prompt_n + n,
                             prompt_tokens_details=cached)
