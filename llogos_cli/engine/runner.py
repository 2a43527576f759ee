"""Turns a step's work into one forward pass over the cache, and samples every row that needs it.

A step of decode rows only (one token each) is replayed from a CUDA graph where the backend
captures them (engine/decode_graph.py); a step with prompt chunks runs the forward pass eagerly.
Plain greedy rows take their argmax where the logits are; only the other rows' logits cross to
the host.
The cache's KV is a pool of n_blocks blocks of BLOCK_SIZE positions, and the runner writes each
row's block table into the cache's block_tables before a step (in place: a captured decode graph
reads them); rows that share a prefix read the same blocks. Before the pass it carries out what the scheduler
decided for a row's slot: a fresh start, a recurrent state restored or marked, a block's head copied.
"""

import numpy as np

from llogos_cli.engine.decode_graph import decode_step
from llogos_cli.engine.prefix_cache import BLOCK_SIZE
from llogos_cli.engine.scheduler import Work
from llogos_cli.model.batch import Batch
from llogos_cli.model.forward import Model


class ModelRunner:
    def __init__(self, model: Model, n_slots: int, n_ctx: int, cache_types: tuple[str | None, str | None],
                 n_blocks: int):
        self.model = model
        self.cache = model.new_cache(n_slots, n_ctx, *cache_types, n_blocks=n_blocks, block_size=BLOCK_SIZE)
        self._written: dict[int, list[int]] = {}   # slot -> the table last written there (a copy to the GPU)
        self._decode = decode_step(model, self.cache)

    def run(self, work: list[Work]) -> list[tuple[int, list | None]]:
        """Evaluate the work; the next (token id, top logprobs) of each item that samples, in order."""
        for w in work:
            row = w.row
            if w.start == 0:   # a new sequence in this slot
                self.cache.reset(row.slot)
            if row.restore is not None:   # a parked row's state, marked before its prompt's last token
                self.cache.restore(row.slot, row.restore)
                row.restore = None
            if row.copy_block is not None:   # (source, destination, positions): a shared block's head
                src, dst, n = row.copy_block
                self.cache.copy_block(dst, src, n)
                row.copy_block = None
            if row.mark_at == w.start:
                row.mark = (w.start, self.cache.snapshot(row.slot))
            if self._written.get(w.row.slot) != w.row.blocks:   # a decoding row's changes every 16 tokens
                self.model.backend.write_block_table(self.cache.block_tables, w.row.slot, w.row.blocks)
                self._written[w.row.slot] = list(w.row.blocks)
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

    def _sample(self, rows: list, logits) -> list[tuple[int, list | None]]:
        b = self.model.backend
        greedy = [i for i, r in enumerate(rows) if r.completion.plain_greedy]
        chosen: list = [None] * len(rows)
        if greedy:
            chosen_logits = logits if len(greedy) == len(rows) else logits[greedy]
            masks = _masks([rows[i] for i in greedy], logits.shape[1])
            if masks is not None:   # grammar rows: their masks go to the logits, not the logits to the host
                chosen_logits = b.mask_logits(chosen_logits, masks)
            ids = b.argmax_rows(chosen_logits)
            for i, token_id in zip(greedy, ids):
                chosen[i] = (int(token_id), None)
        others = [i for i in range(len(rows)) if chosen[i] is None]
        if others:
            host = b.to_host(logits[others])
            for i, row_logits in zip(others, host):
                chosen[i] = rows[i].completion.choose(row_logits)
        return chosen


def _masks(rows: list, n: int) -> np.ndarray | None:
    """The rows' grammar bitmasks over n logits, (rows, words) uint32; every bit set for a row
    without a grammar; None if no row has one."""
    bits = [r.completion.mask_bits() for r in rows]
    if all(b is None for b in bits):
        return None
    words = -(-n // 32)
    out = np.full((len(rows), words), 0xFFFFFFFF, np.uint32)
    for j, b in enumerate(bits):
        if b is not None:
            out[j] = 0
            out[j, :min(words, len(b))] = b[:words]
    return out
