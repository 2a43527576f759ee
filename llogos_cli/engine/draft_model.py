"""Drafts from a smaller model of the same vocabulary (llama.cpp's -md), for speculative decoding.

The draft model has a cache of its own, a slot for each of the engine's (a batch's rows and a
server's slots draft in turn, each in its slot), and holds in each the
tokens it has evaluated there. Before a row's step it evaluates the row's tokens past the longest
run it already holds that the row's tokens begin with (what the target kept of its last draft is
reused, the rest written over), then drafts greedily, one token a pass, until it has the tokens
asked for or its best token's probability falls below --draft-p-min. Its drafts are point masses,
so the target's check of them is the rule of engine/speculation.py, exact as it is for n-grams.
"""

from dataclasses import replace

import numpy as np

from llogos_cli.engine.speculation import SpecParams, Speculator
from llogos_cli.errors import LlogosError
from llogos_cli.model.batch import Batch
from llogos_cli.model.forward import Model
from llogos_cli.model.loader import LoadOptions, Loaded, load, open_model


class DraftModel(Speculator):
    def __init__(self, params: SpecParams, model, n_slots: int, n_ctx: int):
        if any(model.cfg.recurrent):
            raise LlogosError("the draft model has recurrent layers, whose state cannot step back from a rejected "
                              "draft: choose one with attention layers only")
        super().__init__(params)
        self.model = model
        self.cache = model.new_cache(n_slots, n_ctx)
        self.held: dict[int, list[int]] = {}   # slot -> the tokens the draft model's cache holds there

    def propose(self, row, n: int) -> list[int]:
        held = self.held.get(row.slot, [])
        keep = 0
        for a, b in zip(held, row.tokens[:-1]):   # the last token is evaluated again: its logits draft
            if a != b:
                break
            keep += 1
        tokens, draft = row.tokens[keep:], []
        while True:
            probs = self._next(row.slot, tokens, keep)
            keep += len(tokens)
            best = int(np.argmax(probs))
            if probs[best] < self.params.draft_p_min:
                break
            draft.append(best)
            if len(draft) == n:
                break
            tokens = [best]
        self.held[row.slot] = (row.tokens + draft)[:keep]
        return draft

    def _next(self, slot: int, tokens: list[int], pos: int) -> np.ndarray:
        """The draft model's next-token probabilities after tokens, written at positions pos.."""
        logits = self.model.forward(self.cache, Batch.run(tokens, slot, pos, [len(tokens) - 1]))
        row = self.model.backend.to_host(logits)[0].astype(np.float64)
        e = np.exp(row - row.max())
        return e / e.sum()


def load_draft_model(params: SpecParams, options: LoadOptions, target: Loaded, n_ctx: int,
                     n_slots: int = 1) -> Model | None:
    """The -md model on the target's backend, its vocabulary checked against the target's, sized for
    n_slots caches of n_ctx (the memory guard counts them); None without -md."""
    if params.spec_draft_model is None:
        return None
    mf = open_model(params.spec_draft_model)
    check_vocabulary(target.tokenizer, mf.tokenizer)
    return load(mf, target.model.backend.name, options.cpu_weights, n_ctx, options.cache_types, n_slots).model


def draft_footprint(params: SpecParams, options: LoadOptions, n_ctx: int, n_slots: int = 1) -> int:
    """Bytes the -md model takes beside its target once loaded by load_draft_model (0 without -md): its
    weights as held on the target's device and its cache, n_slots slots and the scratch one of n_ctx
    positions each, of the default cache type (DraftModel asks for no other); decided without
    reading a weight."""
    if params.spec_draft_model is None:
        return 0
    mf = open_model(params.spec_draft_model)
    own_cache = replace(options, cache_type_k=None, cache_type_v=None)
    return own_cache.footprint(mf, n_ctx, n_slots, 1, 0, n_blocks=(n_slots + 1) * n_ctx)


def check_vocabulary(target, draft) -> None:
    """A draft model must spell every token as the target does: its drafts are the target's ids."""
    same = target.n_vocab == draft.n_vocab and all(
        target.token_bytes(i, special=True) == draft.token_bytes(i, special=True) for i in range(target.n_vocab))
    if not same:
        raise LlogosError(f"the draft model's vocabulary ({draft.n_vocab} tokens) is not the model's "
                          f"({target.n_vocab} tokens): a draft model must share it token for token")
