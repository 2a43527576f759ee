"""Perplexity over a text file, computed the way llama-perplexity does.

The text is tokenized once (with BOS if the model adds one) and cut into non-overlapping chunks
of n_ctx tokens; the first token of each chunk becomes BOS where the model adds one. Each chunk
is evaluated from an empty cache, and only the second half is scored: the logits at positions
n_ctx/2 ... n_ctx-2 predict tokens n_ctx/2+1 ... n_ctx-1, so every prediction has context.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from llogos_cli.engine.sampling import token_logprobs
from llogos_cli.model.memory import PREFILL_BATCH
from llogos_cli.errors import LlogosError
from llogos_cli.model.forward import Model
from llogos_cli.tokenizer.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class PerplexityResult:
    ppl: float
    ppl_stderr: float
    n_ctx: int
    n_chunks: int
    scored_tokens: int

    def as_dict(self) -> dict:
        return {"ppl": self.ppl, "ppl_stderr": self.ppl_stderr, "n_ctx": self.n_ctx,
                "n_chunks": self.n_chunks, "scored_tokens": self.scored_tokens}


def perplexity(model: Model, tok: Tokenizer, text: str, n_ctx: int, max_chunks: int = 0,
               on_chunk: Callable[[int, int, float], None] = lambda i, n, ppl: None,
               cache_types: tuple[str | None, str | None] = (None, None), batch: int = PREFILL_BATCH) -> PerplexityResult:
    tokens = tok.encode(text, parse_special=False)
    if n_ctx < 4:
        raise LlogosError("perplexity needs a context of at least 4 tokens")
    if len(tokens) < 2 * n_ctx:
        raise LlogosError(f"the text has {len(tokens)} tokens; perplexity at context {n_ctx} "
                          f"needs at least {2 * n_ctx}")
    n_chunks = len(tokens) // n_ctx
    if max_chunks > 0:
        n_chunks = min(n_chunks, max_chunks)
    first = n_ctx // 2
    nll = nll2 = 0.0
    count = 0
    for i in range(n_chunks):
        chunk = np.asarray(tokens[i * n_ctx:(i + 1) * n_ctx], dtype=np.int32)
        if tok.add_bos:
            chunk[0] = tok.bos_id
        ctx = model.new_context(n_ctx, *cache_types)
        rows = []   # logits at positions first ... n_ctx - 1, computed a batch at a time
        for start in range(0, n_ctx, batch):
            piece = chunk[start:start + batch]
            skip = max(0, first - start)
            logits = model.forward_seq(ctx, piece, all_logits=skip < len(piece), logits_from=skip)
            if skip < len(piece):
                rows.append(model.backend.to_host(logits))
        logits = np.concatenate(rows)[:-1]                                   # (n_ctx - 1 - first, vocab)
        nlls = -token_logprobs(logits, chunk[first + 1:])                  # (n_ctx - 1 - first,)
        nll += float(nlls.sum())
        nll2 += float(np.square(nlls).sum())
        count += len(nlls)
        on_chunk(i + 1, n_chunks, math.exp(nll / count))
    mean = nll / count
    var = nll2 / count - mean * mean
    ppl = math.exp(mean)
    stderr = ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else 0.0
    return PerplexityResult(ppl, stderr, n_ctx, n_chunks, count)
