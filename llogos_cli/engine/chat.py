"""A conversation held against one model context: each turn prefills only what is new."""

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from llogos_cli.console import warn
from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.conversation import ChatFormat, Message, fit, with_system
from llogos_cli.engine.generation import Generation
from llogos_cli.engine.reasoning import Split
from llogos_cli.engine.sampling import SamplingParams, draw_seed
from llogos_cli.engine.completion import Timings
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.errors import LlogosError


@dataclass(frozen=True, slots=True)
class Reply:
    text: str               # the answer (the whole reply when its reasoning is not split off)
    stop: str               # "eos" (end of turn), "limit", "stop-string", "interrupted"
    prompt_tokens: int      # the whole rendered conversation; timings.prompt_n is the part prefilled
    timings: Timings
    reasoning: str = ""     # what the model reasoned before its answer (<think>, gpt-oss's analysis)

    def summary(self) -> str:
        t = self.timings
        return (f"prompt {self.prompt_tokens} tokens, {t.prompt_n} prefilled in {t.prompt_ms:.0f} ms"
                f"{_rate_note(t.prompt_n, t.prompt_ms)} | reply {t.predicted_n} tokens in {t.predicted_ms:.0f} ms"
                f"{_rate_note(max(t.predicted_n - 1, 0), t.predicted_ms)}")


def _rate_note(n: int, ms: float) -> str:
    return f" ({n / ms * 1e3:.1f} tokens/s)" if n and ms > 0 else ""


class Chat:
    """The messages so far and the engine (one slot that keeps its tokens) that has seen them.

    Every turn renders the whole conversation as a new request; the engine continues the tokens
    its slot still holds as far as they agree, and the prefix cache holds earlier conversations'
    blocks: in a growing conversation everything up to the new message is reused. Whatever
    re-renders differently (a reply re-tokenized, a dropped turn, a new system prompt) is
    prefilled again from the first token that differs."""

    def __init__(self, fmt: ChatFormat, engine: BatchEngine, params: SamplingParams, n_predict: int,
                 messages: list[Message], split_reasoning: bool = True):
        self.fmt = fmt
        self.split_reasoning = split_reasoning
        self.engine = engine
        self.params = params
        self.seed = params.seed if params.seed is not None else draw_seed()
        self._seeds = np.random.default_rng(self.seed)   # each turn's own, so /regen draws a new sample
        self._turns = 0
        self.criteria = StopCriteria(n_predict, fmt.stop_strings(), stop_ids=fmt.stop_ids())
        self.messages = list(messages)
        self.last: Reply | None = None

    @property
    def system(self) -> str | None:
        return self.messages[0].content if self.messages and self.messages[0].role == "system" else None

    def set_system(self, text: str) -> None:
        self.messages = with_system(self.messages, text)

    def clear(self) -> None:
        """A new conversation under the same system prompt; its tokens stay cached for the next turn."""
        self.messages = self.messages[:1] if self.system is not None else []

    def _room_for_reply(self) -> int:
        n_ctx, n = self.engine.n_ctx, self.criteria.n_predict
        return min(n, n_ctx // 2) if n >= 0 else n_ctx // 4

    def respond(self, emit: Callable[[str], None], interrupted: Callable[[], bool] = lambda: False,
                think: Callable[[str], None] = lambda text: None) -> Reply:
        """Generate the assistant's next message, passing its answer's text to `emit` and its
        reasoning's to `think` as they come, and add the answer to the conversation, also when
        `interrupted()` turns true or Ctrl-C cuts it short."""
        self.last = None
        if not self.messages or self.messages[-1].role != "user":
            raise LlogosError("the conversation does not end with a user message: there is nothing to reply to")
        kept, ids = fit(self.fmt, self.messages, self.engine.n_ctx - self._room_for_reply())
        if len(kept) < len(self.messages):
            warn(f"the conversation outgrew the context of {self.engine.n_ctx} tokens: "
                 f"dropped the {len(self.messages) - len(kept)} oldest messages")
            self.messages = kept
        self._turns += 1
        params = replace(self.params, seed=int(self._seeds.integers(2 ** 63)))
        reasoning = self.fmt.reasoning(self.fmt.text(kept)) if self.split_reasoning else None
        splitter = reasoning.splitter() if reasoning else None
        gen = Generation(self.engine, Request(f"turn-{self._turns}", ids, params, self.criteria))
        said = Split()
        stop = None

        def show(piece: Split) -> None:
            nonlocal said
            said += piece
            if piece.reasoning:
                think(piece.reasoning)
            if piece.content:
                emit(piece.content)

        tokens = iter(gen)
        try:
            for t in tokens:
                show(splitter.push(t.text) if splitter else Split(content=t.text))
                if interrupted():
                    stop = "interrupted"
                    break
            else:
                show(splitter.push(gen.tail) if splitter else Split(content=gen.tail))
            if splitter:
                show(splitter.finish())
        except KeyboardInterrupt:   # the engine drops a cache cut inside a forward pass
            stop = "interrupted"
            raise
        finally:
            tokens.close()
            self.last = Reply(said.content, stop or gen.stop, len(ids), gen.timings, said.reasoning)
            self.messages.append(Message("assistant", self.last.text))
        if gen.context_full:
            warn(f"the reply filled the context of {self.engine.n_ctx} tokens")
        return self.last

    def regenerate(self, emit: Callable[[str], None], interrupted: Callable[[], bool] = lambda: False,
                   think: Callable[[str], None] = lambda text: None) -> Reply:
        """Replace the last reply with a new one."""
        if self.messages and self.messages[-1].role == "assistant":
            self.messages.pop()
        return self.respond(emit, interrupted, think)
