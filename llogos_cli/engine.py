"""Prefill, decode and stop conditions: turns a prompt into a stream of generated tokens."""

import time
from dataclasses import dataclass, field

import numpy as np

from llogos_cli.errors import LlogosError
from llogos_cli.model import Context, Model
from llogos_cli.sampling import Sampler, top_logprobs
from llogos_cli.tokenizer import StreamDecoder, Tokenizer

# Prompts are evaluated in batches of this many tokens, bounding activation memory.
PREFILL_BATCH = 512


@dataclass(frozen=True, slots=True)
class StopCriteria:
    n_predict: int = -1               # -1: until end of generation or a full context
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False
    stop_ids: frozenset[int] = frozenset()   # end a reply, like EOG, even with ignore_eos (chat's end of turn)


@dataclass(frozen=True, slots=True)
class Token:
    id: int
    text: str                          # what this token adds to the output (see StopFilter)
    logprobs: list | None = None       # [(id, logprob), ...] before any sampling transform


@dataclass(slots=True)
class Timings:
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    eval_runs: int = 0        # forward passes during generation (the first token needs none)

    def as_dict(self) -> dict:
        return {"prompt_n": self.prompt_n, "prompt_ms": round(self.prompt_ms, 3),
                "prompt_per_second": _rate(self.prompt_n, self.prompt_ms),
                "predicted_n": self.predicted_n, "predicted_ms": round(self.predicted_ms, 3),
                "predicted_per_second": _rate(self.predicted_n, self.predicted_ms)}


def _rate(n: int, ms: float) -> float:
    return round(n / ms * 1000.0, 3) if ms > 0 else 0.0


def check_fits(n_prompt: int, n_ctx: int) -> None:
    if n_prompt > n_ctx:
        raise LlogosError(f"prompt has {n_prompt} tokens, more than the context size {n_ctx} "
                          f"(raise it with -c/--ctx-size)")


class Session:
    """A model context plus the tokens it holds, so later calls only evaluate what is new."""

    def __init__(self, model: Model, n_ctx: int, cache_types: tuple[str | None, str | None] = (None, None)):
        self.model = model
        self.cache_types = cache_types
        self.ctx: Context = model.new_context(n_ctx, *cache_types)
        self.tokens: list[int] = []
        self.last_evaluated = 0   # tokens the last evaluate() actually ran through the model
        self._decode = None       # the backend's one-token step for this context (a CUDA graph on GPU)
        self._mark = None         # (position, Context.snapshot()) to resume recurrent state from

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def reset(self) -> None:
        n_ctx, self.ctx = self.n_ctx, None   # let the old cache go before the new one is allocated
        self.ctx = self.model.new_context(n_ctx, *self.cache_types)
        self.tokens = []
        self._decode = self._mark = None

    def evaluate(self, ids: list[int]):
        """Bring the context to hold exactly `ids`, reusing the longest common prefix already there.
        Returns the logits after the last id, as a backend array (vocab,)."""
        check_fits(len(ids), self.n_ctx)
        keep = 0
        for a, b in zip(self.tokens, ids):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(ids) - 1)   # always evaluate at least one token to get its logits
        if keep < len(self.tokens) and not self.ctx.rewind(keep):
            if self._mark is not None and self._mark[0] <= keep:
                self.ctx.restore(self._mark[1])
                keep = self._mark[0]
            else:
                self.reset()
                keep = 0
        self.tokens = self.tokens[:keep]
        self.last_evaluated = len(ids) - keep
        logits, start = None, keep
        while start < len(ids):
            end = min(start + PREFILL_BATCH, len(ids))
            if self.ctx.recurrent:
                # Recurrent state cannot step back, so mark it before the prompt's last token: a
                # regenerated reply, or a next turn that renders this reply differently, resumes there.
                if start == len(ids) - 1:
                    self._mark = (start, self.ctx.snapshot())
                elif end == len(ids):
                    end -= 1
            logits = self.model.forward(self.ctx, np.asarray(ids[start:end], dtype=np.int32))
            self.tokens.extend(ids[start:end])
            start = end
        return logits[-1]

    def step(self, token_id: int):
        """Evaluate one token; its logits as a backend array (vocab,)."""
        if len(self.tokens) >= self.n_ctx:
            raise LlogosError("context is full")
        if self._decode is None:
            self._decode = self.model.b.decoder(self.model, self.ctx)
        logits = self._decode(token_id)
        self.tokens.append(token_id)
        return logits[-1]


class StopFilter:
    """Releases generated text, holding back any tail that could be the start of a stop string."""

    def __init__(self, stop_strings: tuple[str, ...]):
        self.stops = [s for s in stop_strings if s]
        self.pending = ""
        self.hit = False

    def push(self, text: str) -> str:
        self.pending += text
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.hit = True
            out, self.pending = self.pending[:cut], ""
            return out
        hold = max((n for s in self.stops for n in range(1, min(len(s), len(self.pending)) + 1)
                    if self.pending.endswith(s[:n])), default=0)
        out = self.pending[:len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


@dataclass(slots=True)
class Generation:
    """Iterate to receive Tokens; afterwards `stop` says why it ended and `timings` how long it took."""
    session: Session
    tokenizer: Tokenizer
    prompt: list[int]
    sampler: Sampler
    criteria: StopCriteria
    n_logprobs: int = 0
    special: bool = False
    stop: str = ""
    tail: str = ""    # text released only at the end: a held-back stop-string prefix or partial UTF-8
    context_full: bool = False
    timings: Timings = field(default_factory=Timings)

    def __iter__(self):
        tok, crit = self.tokenizer, self.criteria
        for t in self.prompt:
            self.sampler.accept(t)
        t0 = time.perf_counter()
        logits = self.session.evaluate(self.prompt)
        self.timings.prompt_n = self.session.last_evaluated
        self.timings.prompt_ms = (time.perf_counter() - t0) * 1e3
        decoder, stops = StreamDecoder(tok, self.special), StopFilter(crit.stop_strings)
        busy = 0.0   # time spent sampling and decoding, not in the consumer's hands between tokens
        n = 0
        self.stop = "limit"
        room = self.session.n_ctx - len(self.prompt)   # tokens that still fit in the context
        try:
            while (crit.n_predict < 0 or n < crit.n_predict) and n < room:
                t0 = time.perf_counter()
                token_id, lp = self._choose(logits)
                busy += time.perf_counter() - t0
                n += 1
                if token_id in crit.stop_ids or (token_id in tok.eog_ids and not crit.ignore_eos):
                    self.stop = "eos"
                    break
                self.sampler.accept(token_id)
                text = stops.push(decoder.push(token_id))
                if stops.hit:
                    self.stop = "stop-string"
                    yield Token(token_id, text, lp)
                    break
                yield Token(token_id, text, lp)
                if (crit.n_predict < 0 or n < crit.n_predict) and n < room:   # its logits will be needed
                    t0 = time.perf_counter()
                    logits = self.session.step(token_id)
                    busy += time.perf_counter() - t0
                    self.timings.eval_runs += 1
            self.context_full = self.stop == "limit" and n >= room
            if self.stop != "stop-string":
                self.tail = stops.push(decoder.flush()) + stops.flush()
        finally:   # a consumer that stops early (chat's Ctrl-C) still gets the timings so far
            self.timings.predicted_n = n
            self.timings.predicted_ms = busy * 1e3

    def _choose(self, logits) -> tuple[int, list | None]:
        """The next token (and its top log-probabilities if asked). Plain greedy decoding takes the
        argmax where the logits are, so on a GPU only the token id crosses to the host."""
        b = self.session.model.b
        if self.sampler.plain_greedy and not self.n_logprobs:
            return b.argmax(logits), None
        row = b.to_host(logits)
        return self.sampler.sample(row), (top_logprobs(row, self.n_logprobs) if self.n_logprobs else None)

