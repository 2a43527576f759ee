"""One request run on the engine as a stream of tokens: what `generate` and `chat` iterate.

The engine is the one every command runs; a single sequence is its one-slot case. Timings count
the engine's steps only, not the consumer's time between tokens (a terminal, a pipe).
"""

import time

from llogos_cli.engine.batch import BatchEngine, Request, Result
from llogos_cli.engine.completion import Timings
from llogos_cli.engine.speculation import SpecParams
from llogos_cli.model.memory import PREFILL_BATCH


class Generation:
    """Iterate to receive Tokens; afterwards `result` holds the outcome (None when the consumer
    stopped early), `stop` why it ended and `timings` how long the engine took."""

    def __init__(self, engine: BatchEngine, request: Request):
        self.engine, self.request = engine, request
        self.result: Result | None = None
        self.timings = Timings()
        self._text: list[str] = []

    @classmethod
    def alone(cls, model, tokenizer, n_ctx: int, request: Request,
              cache_types: tuple[str | None, str | None] = (None, None), step_tokens: int = PREFILL_BATCH,
              speculation: SpecParams = SpecParams(), draft_model=None, context_shift: bool = False,
              n_keep: int = 0) -> "Generation":
        """The request on a one-slot engine of its own, without a prefix cache (`generate`)."""
        return cls(BatchEngine(model, tokenizer, 1, n_ctx, cache_types, step_tokens, prefix_cache_bytes=0,
                               speculation=speculation, draft_model=draft_model, context_shift=context_shift,
                               n_keep=n_keep), request)

    stop = property(lambda self: self.result.stop if self.result is not None else "")
    context_full = property(lambda self: self.result is not None and self.result.context_full)

    @property
    def tail(self) -> str:
        """Text released only at the end (a held-back stop-string prefix, a partial character)."""
        return self.result.text[len("".join(self._text)):] if self.result is not None else ""

    def __iter__(self):
        engine, rid, t = self.engine, self.request.id, self.timings
        engine.add(self.request)
        prompt_s = decode_s = 0.0
        in_step = False
        try:
            while self.result is None:
                t0 = time.perf_counter()
                in_step = True
                updates = [u for u in engine.step() if u.id == rid]
                in_step = False
                if t.predicted_n:   # each step after the first token evaluates the last one
                    decode_s += time.perf_counter() - t0
                    t.eval_runs += 1
                else:
                    prompt_s += time.perf_counter() - t0
                t.prompt_ms, t.predicted_ms = prompt_s * 1e3, decode_s * 1e3
                for u in updates:
                    t.predicted_n += 1
                    if u.result is not None:
                        self._finish(u.result)
                    if u.token is not None:
                        self._text.append(u.token.text)
                        yield u.token
        finally:   # a consumer that stops early (chat's Ctrl-C) still gets the timings so far
            if self.result is None:
                partial = engine.cancel(rid, keep=not in_step)
                if partial is not None:
                    t.prompt_n = partial.timings.prompt_n

    def _finish(self, result: Result) -> None:
        self.result = result
        self.timings.prompt_n = result.timings.prompt_n
        self.timings.predicted_n = result.timings.predicted_n
        self.timings.draft_n = result.timings.draft_n
        self.timings.draft_n_accepted = result.timings.draft_n_accepted
