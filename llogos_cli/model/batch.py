"""What a forward pass runs: a batch of tokens, each at its own slot and position of the cache."""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Batch:
    """Tokens of one or more sequences for one forward pass, as llama.cpp's llama_batch: token t
    goes to cache slot slots[t] at position pos[t]. A slot's tokens are one contiguous run with
    consecutive positions. `logits` lists the tokens whose logits are wanted. `types`: an encoder's
    token types (BERT's sentence A or B: a cross-encoder's query and document), None for all 0."""
    tokens: np.ndarray   # (T,) int32
    slots: np.ndarray    # (T,) int32
    pos: np.ndarray      # (T,) int32
    logits: np.ndarray   # (T',) increasing indices into tokens
    types: np.ndarray | None = None   # (T,) int32

    @staticmethod
    def run(tokens, slot: int, pos0: int, logits, types=None) -> "Batch":
        """A run of tokens of one slot from position pos0."""
        T = len(tokens)
        return Batch(np.asarray(tokens, np.int32), np.full(T, slot, np.int32),
                     np.arange(pos0, pos0 + T, dtype=np.int32), np.asarray(logits, np.intp),
                     None if types is None else np.asarray(types, np.int32))

    @staticmethod
    def join(batches: list["Batch"]) -> "Batch":
        offsets = np.cumsum([0] + [len(b.tokens) for b in batches[:-1]])
        typed = any(b.types is not None for b in batches)
        return Batch(*(np.concatenate([getattr(b, f) for b in batches]) for f in ("tokens", "slots", "pos")),
                     np.concatenate([b.logits + o for b, o in zip(batches, offsets)]).astype(np.intp),
                     np.concatenate([np.zeros(len(b.tokens), np.int32) if b.types is None else b.types
                                     for b in batches]) if typed else None)
