"""A chat reply as a sequence of blocks, for the APIs whose streams open, grow and close each part
of a reply in turn (Anthropic's content blocks, the Responses API's output items).

The chat renderer decides what the reply says as it streams: its reasoning and answer text apart
(the reasoning split), the answer held back where tool calls may start, each call's name and then
its arguments as they become certain. BlockRenderer takes those deltas and turns each change of
kind (reasoning, text, a new call) into the end of one block and the start of the next; each API
says what its events are.
"""

from dataclasses import dataclass

from llogos_cli.engine.batch import Result
from llogos_cli.engine.completion import Token
from llogos_cli.server import schemas, tool_calls
from llogos_cli.server.render import ChatRenderer, Envelope

REASONING, TEXT, CALL = "reasoning", "text", "call"


@dataclass(frozen=True, slots=True)
class Reply:
    """A finished reply's parts, in the order its blocks come."""
    reasoning: str
    content: str | None
    calls: list[tool_calls.ToolCall]
    finish: str          # the chat API's finish reason: "stop", "length" or "tool_calls"


class BlockRenderer(ChatRenderer):
    END = ()   # each API's last event ends its stream

    def __init__(self, envelope: Envelope, index: int = 0):
        super().__init__(envelope, index)
        self._open: str | None = None   # REASONING, TEXT or CALL: the kind of the block being streamed
        self._grown = ""                 # the open block's text so far (a call's: its arguments)
        self._calling: tool_calls.ToolCall | None = None   # the call being streamed (its arguments: none)
        self._result: Result | None = None

    # What each API says: its events as SSE bytes. A CALL block's call is self._calling.
    def _start(self, kind: str) -> list[bytes]:
        raise NotImplementedError

    def _grow(self, kind: str, text: str) -> bytes:
        raise NotImplementedError

    def _stop(self, kind: str, text: str) -> list[bytes]:
        raise NotImplementedError

    def _end(self, finish: str, result: Result) -> list[bytes]:
        raise NotImplementedError

    def token(self, token: Token) -> bytes | None:
        return super().token(token) or None

    def last(self, result: Result) -> list[bytes]:
        self._result = result
        return super().last(result)

    def _chunk(self, delta: schemas.ChatDelta, finish: str | None = None, logprobs=None, tokens=None,
               timings=None) -> bytes:
        out = []
        for kind, text in ((REASONING, delta.reasoning_content), (TEXT, delta.content)):
            if text:
                out += self._into(kind)
                self._grown += text
                out.append(self._grow(kind, text))
        for call in delta.tool_calls or ():
            if call.id is not None:   # a new call: a block of its own
                out += self._into(None)
                self._calling = tool_calls.ToolCall(call.id, call.function.name, "")
                out += self._into(CALL)
            if call.function.arguments:
                self._grown += call.function.arguments
                out.append(self._grow(CALL, call.function.arguments))
        if finish is not None:
            out += self._into(None)
            out += self._end(finish, self._result)
        return b"".join(out)

    def _into(self, kind: str | None) -> list[bytes]:
        """The events that close the open block, unless it is of `kind`, and open one of `kind`."""
        if self._open == kind:
            return []
        out = self._stop(self._open, self._grown) if self._open is not None else []
        self._open, self._grown = kind, ""
        return out + (self._start(kind) if kind is not None else [])

    def reply(self, result: Result) -> Reply:
        whole = self._split(result)
        content, calls, finish = self._reply(whole.content, result.stop)
        return Reply(whole.reasoning, content, calls, finish)
