"""The server's request log: one line on stderr per request, with its method, path, status, tokens
and time, written once the response has been sent (for a stream, once it ends).

The completion routes report their tokens with note_tokens. It reaches the request's line through a
context variable: the middleware sets it before the app runs, and everything that runs for the
request, its stream included, runs in that context or in a copy of it.
"""

import time
from contextvars import ContextVar
from dataclasses import dataclass

from llogos_cli.console import err

# Polled by load balancers and scrapers: their successes would drown the lines that matter.
_QUIET_PATHS = frozenset({"/health", "/metrics"})


@dataclass(slots=True)
class _Tokens:
    counts: tuple[int, int] | None = None    # prompt, generated; None for requests that run no model


_TOKENS: ContextVar[_Tokens | None] = ContextVar("llogos_request_tokens", default=None)


def note_tokens(prompt: int, generated: int) -> None:
    """The current request's token counts, for its line."""
    tokens = _TOKENS.get()
    if tokens is not None:
        tokens.counts = prompt, generated


class RequestLog:
    """ASGI middleware that writes each request's line."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status, tokens = time.perf_counter(), 500, _Tokens()   # 500: the app failed before answering

        async def send_and_see(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        reset = _TOKENS.set(tokens)
        try:
            await self.app(scope, receive, send_and_see)
        finally:
            _TOKENS.reset(reset)
            if not (status == 200 and scope["path"] in _QUIET_PATHS):
                err.print(_line(scope["method"], scope["path"], status, tokens.counts, time.perf_counter() - start),
                          markup=False, highlight=False, soft_wrap=True)


def _line(method: str, path: str, status: int, counts: tuple[int, int] | None, seconds: float) -> str:
    counted = "" if counts is None else f"{counts[0]} prompt + {counts[1]} generated tokens, "
    return f"{method} {path} {status} ({counted}{seconds:.2f} s)"
