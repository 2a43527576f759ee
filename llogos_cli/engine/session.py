"""One sequence's context and the tokens it holds, so each call evaluates only what is new.

A session may also keep earlier sequences' KV (kept_blocks > 0): when a call diverges from what
the context holds, the context's full blocks go into a pool first (the prefix cache's blocks and
hash chains), and a later call whose tokens begin with kept blocks copies them back instead of
evaluating them. That is how `llogos chat` reuses a conversation it left, on /load or after /clear.
Recurrent layers cannot be rebuilt from a KV prefix: such models keep nothing.
"""

import numpy as np

from llogos_cli.engine.prefix_cache import BLOCK_SIZE, BlockManager
from llogos_cli.errors import LlogosError
from llogos_cli.model.forward import Context, Model

# Prompts are evaluated in batches of this many tokens, bounding activation memory.
PREFILL_BATCH = 512
_SLOT0 = np.zeros(1, np.int32)


def check_fits(n_prompt: int, n_ctx: int) -> None:
    if n_prompt > n_ctx:
        raise LlogosError(f"prompt has {n_prompt} tokens, more than the context size {n_ctx} "
                          f"(raise it with -c/--ctx-size)")


class Session:
    """A model context plus the tokens it holds, so later calls only evaluate what is new."""

    def __init__(self, model: Model, n_ctx: int, cache_types: tuple[str | None, str | None] = (None, None),
                 kept_blocks: int = 0):
        self.model = model
        self.cache_types = cache_types
        self.ctx: Context = model.new_context(n_ctx, *cache_types)
        self.tokens: list[int] = []
        self.last_evaluated = 0   # tokens the last evaluate() actually ran through the model
        self.last_kept = 0        # of the tokens the last evaluate() needed, those copied from kept blocks
        if any(model.cfg.recurrent):
            kept_blocks = 0
        self._kept = BlockManager(kept_blocks) if kept_blocks else None
        self._pool = model.new_cache(kept_blocks, BLOCK_SIZE, *cache_types) if kept_blocks else None
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
        if keep < len(self.tokens):
            self._keep_blocks()
        if keep < len(self.tokens) and not self.ctx.rewind(keep):
            if self._mark is not None and self._mark[0] <= keep:
                self.ctx.restore(self._mark[1])
                keep = self._mark[0]
            else:
                self.reset()
                keep = 0
        self.tokens = self.tokens[:keep]
        self.last_kept = self._take_blocks(ids) - keep
        keep += self.last_kept
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
            logits = self.model.forward_seq(self.ctx, np.asarray(ids[start:end], dtype=np.int32))
            self.tokens.extend(ids[start:end])
            start = end
        return logits[-1]

    def _keep_blocks(self) -> None:
        """Copy the context's full blocks that are not kept yet into the pool, before they go."""
        if self._kept is None:
            return
        table: list[int] = []
        for i, block in self._kept.extend(table, self.tokens):
            self._pool.copy_positions(block, 0, self.ctx.cache, 0, i * BLOCK_SIZE, BLOCK_SIZE)
        self._kept.release(table)   # unused, so least recently used first when a new block needs room

    def _take_blocks(self, ids: list[int]) -> int:
        """Extend the context with the kept blocks that continue it along ids (never ids' last token,
        whose logits are wanted); -> the tokens it now holds."""
        have = len(self.tokens)
        if self._kept is None:
            return have
        table = self._kept.match(ids, len(ids) - 1)
        if len(table) * BLOCK_SIZE > have:
            for i in range(have // BLOCK_SIZE, len(table)):
                self.ctx.cache.copy_positions(0, i * BLOCK_SIZE, self._pool, table[i], 0, BLOCK_SIZE)
            have = self.ctx.n_past = len(table) * BLOCK_SIZE
            self.tokens = list(ids[:have])
        self._kept.release(table)
        return have

    def step(self, token_id: int):
        """Evaluate one token; its logits as a backend array (vocab,)."""
        if len(self.tokens) >= self.n_ctx:
            raise LlogosError("context is full")
        if self._decode is None:
            self._decode = self.model.b.decoder(self.model, self.ctx.cache)
        logits = self._decode(np.array([token_id], np.int32), _SLOT0, np.array([self.ctx.n_past], np.int32))
        self.ctx.n_past += 1
        self.tokens.append(token_id)
        return logits[-1]
