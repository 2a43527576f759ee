"""One prompt's completion as it goes: the tokens sampled so far, their text, and why it ended.

The same per-token rules serve a single `generate` and every row of a batch: end-of-generation
and chat end-of-turn tokens, the token limit, the room left in the context, stop strings, and a
grammar that is complete. A constrained row chooses only among the tokens its grammar allows.
"""

from dataclasses import dataclass

import numpy as np

from llogos_cli.engine.grammar import Grammar, Matcher
from llogos_cli.engine.sampling import Sampler, top_logprobs
from llogos_cli.engine.stops import StopCriteria, StopFilter
from llogos_cli.tokenizer.detokenize import StreamDecoder


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
    draft_n: int = 0          # tokens drafted by speculative decoding
    draft_n_accepted: int = 0   # of those, the ones the model chose too

    def as_dict(self) -> dict:
        """llama-server's timings; the draft counts only where speculation drafted, as there."""
        d = {"prompt_n": self.prompt_n, "prompt_ms": round(self.prompt_ms, 3),
             "prompt_per_second": _per_second(self.prompt_n, self.prompt_ms),
             "predicted_n": self.predicted_n, "predicted_ms": round(self.predicted_ms, 3),
             "predicted_per_second": _per_second(self.predicted_n, self.predicted_ms)}
        if self.draft_n:
            d |= {"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted}
        return d


def _per_second(n: int, ms: float) -> float:
    return round(n / ms * 1000.0, 3) if ms > 0 else 0.0


class Completion:
    """One prompt's completion: feed it sampled tokens with push(); `stop` is set ("eos", "limit" or
    "stop-string") once it has ended, and `tail` holds the text released only at the end (a
    held-back stop-string prefix or a partial UTF-8 character). A complete grammar ends it as
    "eos": the reply is whole. The scheduled unit that holds it is the engine's Row."""

    def __init__(self, tokenizer, prompt: list[int], sampler: Sampler, criteria: StopCriteria, n_ctx: int,
                 n_logprobs: int = 0, special: bool = False, grammar: Grammar | None = None, shifts: bool = False):
        self.tokenizer, self.prompt, self.sampler, self.criteria = tokenizer, prompt, sampler, criteria
        self.n_logprobs = n_logprobs
        self.matcher = Matcher(grammar, tokenizer) if grammar is not None else None
        self.generated: list[int] = []
        self.room = n_ctx - len(prompt)        # tokens that fit in the context before it fills (or shifts)
        self.shifts = shifts                   # a full context shifts (engine/context_shift.py) instead of ending it
        self.stop: str | None = None
        self.tail = ""
        self.context_full = False
        self._decoder, self._stops = StreamDecoder(tokenizer, special), StopFilter(criteria.stop_strings)
        for t in prompt:
            sampler.accept(t)
        if not self.wants_more:
            self._end("limit")

    @property
    def wants_more(self) -> bool:
        n = len(self.generated)
        return (self.criteria.n_predict < 0 or n < self.criteria.n_predict) and (self.shifts or n < self.room)

    @property
    def plain_greedy(self) -> bool:
        """The next token is the argmax of the logits, masked by the grammar where there is one
        (mask_bits): it can be taken where the logits are."""
        return self.sampler.plain_greedy and not self.n_logprobs

    def mask_bits(self) -> np.ndarray | None:
        """The grammar's bitmask of the tokens allowed next (uint32 words), None without a grammar."""
        return None if self.matcher is None else self.matcher.bits()

    def start_mask(self) -> None:
        """Begin the grammar's mask for the next token (a constrained row), to be ready when it samples."""
        if self.matcher is not None:
            self.matcher.start()

    def choose(self, row: np.ndarray) -> tuple[int, list | None]:
        """Sample from a host logits row; with the top log-probabilities when asked for."""
        allowed = self.matcher.allowed(len(row)) if self.matcher is not None else None
        return self.sampler.sample(row, allowed), (top_logprobs(row, self.n_logprobs) if self.n_logprobs else None)

    def push(self, token_id: int, logprobs: list | None = None) -> Token | None:
        """Fold in the next token: the Token to emit, or None when it ends the completion unseen."""
        crit = self.criteria
        self.generated.append(token_id)
        if self.matcher is not None:
            self.matcher.consume(token_id)
        if token_id in crit.stop_ids or (token_id in self.tokenizer.eog_ids and not crit.ignore_eos):
            self._end("eos")
            return None
        self.sampler.accept(token_id)
        token = Token(token_id, self._stops.push(self._decoder.push(token_id)), logprobs)
        if self._stops.hit:
            self._end("stop-string")
        elif self.matcher is not None and self.matcher.done:
            self._end("eos")
        elif not self.wants_more:
            self._end("limit")
        return token

    def shifted(self, n_discard: int) -> None:
        """The context dropped n_discard tokens: that much more room before it fills again."""
        self.room += n_discard

    def fill_context(self) -> None:
        """The context is full and cannot shift: the completion ends as at its limit."""
        self._end("limit")
        self.context_full = True

    def _end(self, why: str) -> None:
        self.stop = why
        self.context_full = why == "limit" and not self.shifts and len(self.generated) >= self.room
        if why != "stop-string":
            self.tail = self._stops.push(self._decoder.flush()) + self._stops.flush()
