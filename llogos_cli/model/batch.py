"""What a forward pass runs: a batch of tokens, each at its own slot and position of the cache."""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Batch:
    """Tokens of one or more sequences for one forward pass, as llama.cpp's llama_batch: token t
    goes to cache slot slots[t] at position pos[t]. A slot's tokens are one contiguous run with
    consecutive positions. `logits` lists the tokens whose logits are wanted."""
    tokens: np.ndarray   # (T,) int32
    slots: np.ndarray    # (T,) int32
    pos: np.ndarray      # (T,) int32
    logits: np.ndarray   # (T',) increasing indices into tokens

    @staticmethod
    def run(tokens, slot: int, pos0: int, logits) -> "Batch":
        """A run of tokens of one slot from position pos0."""
        T = len(tokens)
        return Batch(np.asarray(tokens, np.int32), np.full(T, slot, np.int32),
                     np.arange(pos0, pos0 + T, dtype=np.int32), np.asarray(logits, np.intp))

    @staticmethod
    def join(batches: list["Batch"]) -> "Batch":
        offsets = np.cumsum([0] + [len(b.tokens) for b in batches[:-1]])
        return Batch(*(np.concatenate([getattr(b, f) for b in batches]) for f in ("tokens", "slots", "pos")),
                     np.concatenate([b.logits + o for b, o in zip(batches, offsets)]).astype(np.intp))
