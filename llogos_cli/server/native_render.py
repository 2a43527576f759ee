"""Engine tokens and results -> /completion's replies in llama-server's native shape.

A whole reply is one object (a list of them for n > 1): `content`, `tokens` (with return_tokens),
`stop_type` and its booleans, `stopping_word`, the token counts, `timings`, and with n_probs each
token's `completion_probabilities`. A stream is one `data:` object a token (`stop: false`) and a
last one with `stop: true` and the counts and timings; no [DONE] follows.
"""

import json
from typing import Any

from pydantic import RootModel

from llogos_cli.engine.batch import Result
from llogos_cli.engine.completion import Token
from llogos_cli.server.render import CompletionRenderer, Envelope

STOP_TYPES = {"eos": "eos", "limit": "limit", "stop-string": "word"}


class NativeBody(RootModel[Any]):
    """A JSON value as it is: the native replies are llama-server's objects, not OpenAI's models."""


def _event(body: dict) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class NativeRenderer(CompletionRenderer):
    END = ()

    def __init__(self, envelope: Envelope, index: int = 0):
        super().__init__(envelope, index)
        self._n = 0   # tokens streamed so far

    def _probs(self, ids: list[int], tops: list) -> list[dict]:
        out = []
        for token_id, top in zip(ids, tops):
            own, _ = self._top(token_id, top)
            text, raw = self._piece(token_id)
            shown = [{"id": i, "token": t, "bytes": b, "logprob": lp}
                     for i, lp in top[:self.envelope.n_top] for t, b in (self._piece(i),)]
            out.append({"id": token_id, "token": text, "bytes": raw, "logprob": own, "top_logprobs": shown})
        return out

    def first(self) -> list[bytes]:
        return []

    def token(self, token: Token) -> bytes | None:
        self._n += 1
        if not token.text and self._quiet:
            return None
        self.sent += token.text
        chunk = {"index": self.index, "content": token.text, "tokens": [token.id], "stop": False, "id_slot": -1,
                 "tokens_predicted": self._n, "tokens_evaluated": self.envelope.prompt_ns[self.index]}
        if self.envelope.n_top is not None:
            chunk["completion_probabilities"] = self._probs([token.id], [token.logprobs])
        return _event(chunk)

    def _final(self, result: Result, content: str) -> dict:
        stop_type = STOP_TYPES[result.stop]
        return {"index": self.index, "content": content, "tokens": self._ids(result.tokens) or [], "id_slot": -1,
                "stop": True, "model": self.envelope.model, "tokens_predicted": len(result.tokens),
                "tokens_evaluated": self.envelope.prompt_ns[self.index], "tokens_cached": result.prefix_hit,
                "truncated": result.context_full, "stop_type": stop_type, "stopped_eos": stop_type == "eos",
                "stopped_limit": stop_type == "limit", "stopped_word": stop_type == "word",
                "stopping_word": self._stopping_word(result), "timings": result.timings_record()}

    def _stopping_word(self, result: Result) -> str:
        """The client's stop string that ended the reply: the earliest of them in the generated text."""
        if result.stop != "stop-string":
            return ""
        generated = self.envelope.tokenizer.decode(result.tokens)
        found = [(generated.find(s), s) for s in self.envelope.stops if s in generated]
        return min(found)[1] if found else ""

    def last(self, result: Result) -> list[bytes]:
        return [_event(self._final(result, result.text[len(self.sent):]))]

    def choice(self, result: Result) -> dict:
        body = self._final(result, result.text)
        if self.envelope.n_top is not None:
            body["completion_probabilities"] = self._probs(result.tokens, result.logprobs)
        return body

    @staticmethod
    def whole(r: Envelope, choices: list[dict], usage) -> NativeBody:
        return NativeBody(choices[0] if len(choices) == 1 else choices)
