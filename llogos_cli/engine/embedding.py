"""Embeddings: prompts through the forward pass without its LM head, each sequence's final hidden
states pooled into one vector and normalised, as llama.cpp's llama-embedding and server do.

Prompts run together, each whole in a slot of its own (an encoder's attention sees the whole
sequence, so a prompt is never cut into chunks), as many per forward pass as fit a token budget.
Each pass gets a cache of its own, sized to its prompts: embedding keeps nothing between passes.
That cache is float32 on every backend (CUDA's default is f16): its keys and values are read back
in the same pass, so rounding them would save no memory over time, only cost accuracy, and
llama.cpp attends an encoder's keys and values unrounded (it keeps no cache for one).
"""

from dataclasses import dataclass

import numpy as np

from llogos_cli.errors import LlogosError
from llogos_cli.model.batch import Batch
from llogos_cli.model.config import POOLING_TYPES
from llogos_cli.model.forward import Model
from llogos_cli.model.memory import PREFILL_BATCH

POOLINGS = tuple(p for p in POOLING_TYPES if p != "rank")   # what makes vectors; rank makes scores (engine/rerank.py)
DEFAULT_NORMALIZE = 2        # euclidean, llama.cpp's default
MAX_INT16 = 32760.0          # normalize 0 scales the largest component to this (llama.cpp's int16 range)
MAX_SEQS = 64                # prompts in one forward pass at most, whatever their length


@dataclass(frozen=True, slots=True)
class EmbedOptions:
    pooling: str                 # one of POOLINGS
    normalize: int = DEFAULT_NORMALIZE   # -1 none, 0 max-abs to int16, 1 taxicab, 2 euclidean, p > 2 the p-norm

    def __post_init__(self):
        if self.pooling not in POOLINGS:   # rank: a reranker's scores, which engine/rerank.py makes
            raise LlogosError(f"pooling '{self.pooling}' is not supported (choose from {', '.join(POOLINGS)})")
        if self.normalize < -1:
            raise LlogosError(f"--embd-normalize {self.normalize} is not -1, 0, 1, 2 or a larger p-norm")


def prompt_ids(tokenizer, text: str) -> list[int]:
    """A text's tokens as llama.cpp embeds them: with its special tokens, EOS last where the
    vocabulary adds one (generation leaves that EOS out: it would end the prompt)."""
    ids = tokenizer.encode(text)
    if tokenizer.add_eos and tokenizer.eos_id is not None and ids[-1:] != [tokenizer.eos_id]:
        ids.append(tokenizer.eos_id)
    return ids


def normalize(x: np.ndarray, kind: int) -> np.ndarray:
    """The rows of x (..., n_embd) scaled as llama.cpp's common_embd_normalize scales one embedding
    (a row of zeros stays zeros)."""
    x64 = x.astype(np.float64)
    if kind == -1:
        return x.astype(np.float32)
    if kind == 0:
        norm = np.abs(x64).max(axis=-1, keepdims=True) / MAX_INT16
    elif kind == 2:
        norm = np.sqrt((x64 * x64).sum(axis=-1, keepdims=True))
    else:
        norm = (np.abs(x64) ** kind).sum(axis=-1, keepdims=True) ** (1.0 / kind)
    return (x64 * np.where(norm > 0, 1.0 / np.where(norm > 0, norm, 1.0), 0.0)).astype(np.float32)


class Embedder:
    """Embeddings of token-id prompts from one model, up to n_ctx tokens a prompt."""

    def __init__(self, model: Model, n_ctx: int, batch_tokens: int = PREFILL_BATCH):
        self.model, self.n_ctx, self.batch_tokens = model, n_ctx, batch_tokens

    def embed(self, prompts: list[list[int]], options: EmbedOptions,
              types: list[list[int] | None] | None = None) -> list[np.ndarray]:
        """One float32 vector (n_embd,) per prompt; with pooling none, one per token (T, n_embd).
        types: each prompt's token types (an encoder's sentence A and B), None for all 0."""
        types = types or [None] * len(prompts)
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise LlogosError(f"input {i} is empty: there is nothing to embed")
            if len(prompt) > self.n_ctx:
                raise LlogosError(f"input {i} has {len(prompt)} tokens, more than the context of {self.n_ctx} (-c)")
            if max(prompt) >= self.model.cfg.n_vocab or min(prompt) < 0:
                raise LlogosError(f"input {i} has a token id outside the vocabulary (0-{self.model.cfg.n_vocab - 1})")
        out: list[np.ndarray] = []
        for group in self._groups(prompts):
            out += self._run([prompts[i] for i in group], options, [types[i] for i in group])
        return out

    def _groups(self, prompts: list[list[int]]):
        """The indices of consecutive prompts within the token budget (a longer prompt alone)."""
        group, tokens = [], 0
        for i, prompt in enumerate(prompts):
            if group and (tokens + len(prompt) > self.batch_tokens or len(group) == MAX_SEQS):
                yield group
                group, tokens = [], 0
            group.append(i)
            tokens += len(prompt)
        if group:
            yield group

    def _run(self, prompts: list[list[int]], options: EmbedOptions, types: list) -> list[np.ndarray]:
        model = self.model
        picked = [self._picked(len(p), options.pooling) for p in prompts]   # which tokens' states each needs
        batch = Batch.join([Batch.run(p, slot, 0, rows, t)
                            for slot, (p, rows, t) in enumerate(zip(prompts, picked, types))])
        cache = model.new_cache(len(prompts), max(len(p) for p in prompts), "f32", "f32")
        hidden = model.backend.to_host(model.hidden(cache, batch)).astype(np.float32)   # (sum picked, n_embd)
        ends = np.cumsum([len(rows) for rows in picked])
        states = np.split(hidden, ends[:-1])
        pooled = [s if options.pooling == "none" else s.mean(axis=0) for s in states]
        return [normalize(p, options.normalize) for p in pooled]

    @staticmethod
    def _picked(n: int, pooling: str) -> np.ndarray:
        if pooling == "cls":
            return np.array([0])
        if pooling == "last":
            return np.array([n - 1])
        return np.arange(n)
