"""Turns a step's work into one forward pass over the cache, and samples every row that needs it.

A step of decode rows only (one token each) is replayed from a CUDA graph where the backend
captures them (engine/decode_graph.py), and so is one whose prompt chunks and drafted rows
(engine/speculation.py) are short (decode_graph.prompt_rows): their tokens go in as rows of their
slot at consecutive positions. Other steps run the forward pass eagerly. Plain greedy rows take their argmax where
the logits are; only the other rows' logits cross to the host.
The cache's KV is a pool of n_blocks blocks of BLOCK_SIZE positions, and the runner writes each
row's block table into the cache's block_tables before a step (in place: a captured decode graph
reads them); rows that share a prefix read the same blocks. Before the pass it carries out what the scheduler
decided for a row's slot: a fresh start, a recurrent state restored or marked, a block's head copied.
"""

import numpy as np

from llogos_cli.engine.decode_graph import BUCKETS, decode_step, prompt_rows
from llogos_cli.engine.prefix_cache import BLOCK_SIZE
from llogos_cli.engine.scheduler import Work
from llogos_cli.model.batch import Batch
from llogos_cli.model.forward import Model
from llogos_cli.model.kv_shift import shift_kv


class ModelRunner:
    def __init__(self, model: Model, n_slots: int, n_ctx: int, cache_types: tuple[str | None, str | None],
                 n_blocks: int):
        self.model = model
        self.cache = model.new_cache(n_slots, n_ctx, *cache_types, n_blocks=n_blocks, block_size=BLOCK_SIZE)
        self._written: dict[int, list[int]] = {}   # slot -> the table last written there (a copy to the GPU)
        self._decode = decode_step(model, self.cache)
        self._prompt_rows = prompt_rows(model)

    def run(self, work: list[Work]) -> list["Choices"]:
        """Evaluate the work; the Choices of each item that samples, in order."""
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
        if self._as_rows(work):
            tokens, slots, pos, picks = _rows(work)
            logits = self._decode(tokens, slots, pos)
            if len(picks) < len(tokens):
                logits = logits[picks]
        else:   # a drafted row's logits at its last token and at each drafted one
            batch = Batch.join([Batch.run(w.row.tokens[w.start:w.end] + list(w.draft), w.row.slot, w.start,
                                          range(w.end - w.start - 1, w.end - w.start + len(w.draft)) if w.samples
                                          else []) for w in work])
            logits = self.model.forward(self.cache, batch)
        return self._sample(sampling, logits)

    def _as_rows(self, work: list[Work]) -> bool:
        """Whether the step goes through the decode step: every item one token (decode rows), or,
        where it takes several rows of a slot, every item short and all in one replay."""
        if all(_length(w) == 1 for w in work):
            return True
        return (self._prompt_rows > 1 and all(_length(w) <= self._prompt_rows for w in work)
                and sum(map(_length, work)) <= BUCKETS[-1])

    def shift(self, row, copies: list[tuple[int, int]], n_keep: int, n_discard: int, n_past: int) -> None:
        """A context shift of the row (engine/context_shift.py): the blocks it no longer shares
        take a copy of the shared ones' KV, then its positions past n_keep + n_discard move down."""
        for src, dst in copies:
            self.cache.copy_block(dst, src, BLOCK_SIZE)
        self.model.backend.write_block_table(self.cache.block_tables, row.slot, row.blocks)
        self._written[row.slot] = list(row.blocks)
        shift_kv(self.model, self.cache, row.slot, n_keep, n_discard, n_past)

    def _sample(self, work: list[Work], logits) -> list["Choices"]:
        b = self.model.backend
        first = np.cumsum([0] + [1 + len(w.draft) for w in work])   # each item's first row of logits
        # A grammar's mask after a drafted token depends on that token: such rows choose on the host.
        greedy = [j for j, w in enumerate(work)
                  if w.row.completion.plain_greedy and not (w.draft and w.row.completion.matcher)]
        chosen: list = [None] * len(work)
        if greedy:
            rows = [i for j in greedy for i in range(first[j], first[j + 1])]
            chosen_logits = logits if len(rows) == len(logits) else logits[rows]
            masks = _masks([work[j].row for j in greedy for _ in range(first[j + 1] - first[j])], logits.shape[1])
            if masks is not None:   # grammar rows: their masks go to the logits, not the logits to the host
                chosen_logits = b.mask_logits(chosen_logits, masks)
            ids = b.argmax_rows(chosen_logits)
            at = 0
            for j in greedy:
                n = first[j + 1] - first[j]
                chosen[j] = Choices(ids=ids[at:at + n])
                at += n
        others = [j for j in range(len(work)) if chosen[j] is None]
        if others:
            host = b.to_host(logits[[i for j in others for i in range(first[j], first[j + 1])]])
            at = 0
            for j in others:
                n = first[j + 1] - first[j]
                chosen[j] = Choices(completion=work[j].row.completion, logits=host[at:at + n])
                at += n
        return chosen


class Choices:
    """A sampling item's next token at its last token and at each drafted one: choices(i) -> (token
    id, top logprobs or None). A row sampled on the host draws position i only when asked, after
    the tokens before it are folded into it, so that its penalties and grammar see them."""
    __slots__ = ("ids", "completion", "logits")

    def __init__(self, ids=None, completion=None, logits=None):
        self.ids, self.completion, self.logits = ids, completion, logits

    def __call__(self, i: int) -> tuple[int, list | None]:
        if self.ids is not None:
            return int(self.ids[i]), None
        return self.completion.choose(self.logits[i])


def _length(w: Work) -> int:
    """The rows an item puts through the forward pass: its chunk's tokens and its draft."""
    return w.end - w.start + len(w.draft)


def _rows(work: list[Work]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """The work as decode rows: (tokens, slots, positions), each item's tokens and draft at
    consecutive positions of its slot; and the rows whose logits are sampled, as the eager pass
    gives them (a sampling item's last token and each drafted one)."""
    tokens, slots, pos, picks = [], [], [], []
    for w in work:
        n = _length(w)
        if w.samples:
            picks += range(len(tokens) + w.end - w.start - 1, len(tokens) + n)
        tokens += w.row.tokens[w.start:w.end] + list(w.draft)
        slots += [w.row.slot] * n
        pos += range(w.start, w.start + n)
    return np.array(tokens, np.int32), np.array(slots, np.int32), np.array(pos, np.int32), picks


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
