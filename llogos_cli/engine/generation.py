"""Generation of one sequence: prefill, then decode a token at a time until a stop rule ends it."""

import time

from llogos_cli.engine.grammar import Grammar
from llogos_cli.engine.sampling import Sampler
from llogos_cli.engine.sequence import Sequence, Timings
from llogos_cli.engine.session import Session
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.tokenizer.tokenizer import Tokenizer


class Generation:
    """Iterate to receive Tokens; afterwards `stop` says why it ended and `timings` how long it took."""

    def __init__(self, session: Session, tokenizer: Tokenizer, prompt: list[int], sampler: Sampler,
                 criteria: StopCriteria, n_logprobs: int = 0, special: bool = False, grammar: Grammar | None = None):
        self.session, self.prompt, self.sampler = session, prompt, sampler
        self.seq = Sequence(tokenizer, prompt, sampler, criteria, session.n_ctx, n_logprobs, special, grammar)
        self.timings = Timings()

    stop = property(lambda self: self.seq.stop or "")
    tail = property(lambda self: self.seq.tail)
    context_full = property(lambda self: self.seq.context_full)

    def __iter__(self):
        seq, t0 = self.seq, time.perf_counter()
        logits = self.session.evaluate(self.prompt)
        self.timings.prompt_n = self.session.last_evaluated
        self.timings.prompt_ms = (time.perf_counter() - t0) * 1e3
        busy = 0.0   # time spent sampling and decoding, not in the consumer's hands between tokens
        try:
            while seq.stop is None:
                t0 = time.perf_counter()
                token = seq.push(*self._choose(logits))
                busy += time.perf_counter() - t0
                if token is not None:
                    yield token
                if seq.stop is None:   # its logits will be needed
                    t0 = time.perf_counter()
                    logits = self.session.step(token.id)
                    busy += time.perf_counter() - t0
                    self.timings.eval_runs += 1
        finally:   # a consumer that stops early (chat's Ctrl-C) still gets the timings so far
            self.timings.predicted_n = len(seq.generated)
            self.timings.predicted_ms = busy * 1e3

    def _choose(self, logits) -> tuple[int, list | None]:
        """The next token (and its top log-probabilities if asked). Plain greedy decoding takes the
        argmax where the logits are, so on a GPU only the token id crosses to the host."""
        b = self.session.model.b
        if self.seq.plain_greedy:
            return int(b.argmax_rows(logits[None])[0]), None
        return self.seq.choose(b.to_host(logits))
