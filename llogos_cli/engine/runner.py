"""Turns a step's work into one forward pass over the cache, and samples every row that needs it.

A step of decode rows only (one token each) goes through the backend's decoder, which on a GPU
replays a CUDA graph; a step with prompt chunks runs the forward pass eagerly. Plain greedy rows
take their argmax where the logits are; only the other rows' logits cross to the host.
With a prefix cache, the runner also holds its pool: one entry of BLOCK_SIZE positions per block,
copied into a row's slot when the row starts from cached blocks, and filled from the slot as the
row's blocks are first kept.
"""

import numpy as np

from llogos_cli.engine.prefix_cache import BLOCK_SIZE
from llogos_cli.engine.scheduler import Work
from llogos_cli.model.forward import Batch, Model


class ModelRunner:
    def __init__(self, model: Model, n_slots: int, n_ctx: int, cache_types: tuple[str | None, str | None],
                 n_blocks: int = 0):
        self.model = model
        self.cache = model.new_cache(n_slots, n_ctx, *cache_types)
        self.pool = model.new_cache(n_blocks, BLOCK_SIZE, *cache_types) if n_blocks else None
        self._decode = model.b.decoder(model, self.cache)

    def run(self, work: list[Work]) -> list[tuple[int, list | None]]:
        """Evaluate the work; the next (token id, top logprobs) of each item that samples, in order."""
        for w in work:
            if w.start == 0:   # a new sequence in this slot
                self.cache.reset(w.row.slot)
            for i, block in enumerate(w.prefix):
                self.cache.copy_positions(w.row.slot, i * BLOCK_SIZE, self.pool, block, 0, BLOCK_SIZE)
        sampling = [w for w in work if w.samples]
        if all(w.end - w.start == 1 for w in work):
            logits = self._decode(np.array([w.row.tokens[w.start] for w in work], np.int32),
                                  np.array([w.row.slot for w in work], np.int32),
                                  np.array([w.start for w in work], np.int32))
            if len(sampling) < len(work):
                logits = logits[[i for i, w in enumerate(work) if w.samples]]
        else:
            batch = Batch.join([Batch.run(w.row.tokens[w.start:w.end], w.row.slot, w.start,
                                          [w.end - w.start - 1] if w.samples else []) for w in work])
            logits = self.model.forward(self.cache, batch)
        return self._sample([w.row for w in sampling], logits)

    def keep(self, slot: int, new_blocks: list[tuple[int, int]]) -> None:
        """Copy a slot's KV into the pool: (index of the block in the slot, pool block) pairs."""
        for i, block in new_blocks:
            self.pool.copy_positions(block, 0, self.cache, slot, i * BLOCK_SIZE, BLOCK_SIZE)

    def _sample(self, rows: list, logits) -> list[tuple[int, list | None]]:
        b = self.model.b
        greedy = [i for i, r in enumerate(rows) if r.seq.plain_greedy]
        chosen: list = [None] * len(rows)
        if greedy:
            ids = b.argmax_rows(logits if len(greedy) == len(rows) else logits[greedy])
            for i, token_id in zip(greedy, ids):
                chosen[i] = (int(token_id), None)
        others = [i for i in range(len(rows)) if chosen[i] is None]
        if others:
            host = b.to_host(logits[others])
            for i, row_logits in zip(others, host):
                chosen[i] = rows[i].seq.choose(row_logits)
        return chosen
