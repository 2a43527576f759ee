"""Decides what each engine step runs: one token for every decoding row, then prompt chunks.

Running rows that are decoding always get their token, so their latency stays one step; the rest
of the step's token budget goes to prompts, first to rows already prefilling and then to waiting
requests admitted into free slots. A prompt longer than what is left is split across steps.
With a prefix cache, a request admitted starts past the longest cached run of blocks that begins
its prompt (never its last token, whose logits are needed), and holds those blocks until it ends.
"""

from collections import deque
from dataclasses import dataclass

from llogos_cli.engine.prefix_cache import BlockManager
from llogos_cli.engine.slots import SlotPool


@dataclass(frozen=True, slots=True)
class Work:
    """Tokens row.tokens[start:end] go into the row's slot at positions start..end-1, after the
    prefix cache's blocks `prefix` (which hold tokens[:start]) are copied into it."""
    row: object
    start: int
    end: int
    prefix: tuple[int, ...] = ()

    @property
    def samples(self) -> bool:
        """The chunk ends at the row's last token, whose logits choose the next one."""
        return self.end == len(self.row.tokens)


class Scheduler:
    def __init__(self, n_slots: int, step_tokens: int, blocks: BlockManager | None = None):
        self.slots = SlotPool(n_slots)
        self.blocks = blocks
        self.step_tokens = max(step_tokens, n_slots)   # room for every row's decode token
        self.waiting: deque = deque()
        self.running: list = []

    def add(self, row) -> None:
        self.waiting.append(row)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def schedule(self) -> list[Work]:
        decoding = sorted((r for r in self.running if r.n_cached == len(r.tokens) - 1), key=lambda r: r.slot)
        work = [Work(r, r.n_cached, r.n_cached + 1) for r in decoding]
        budget = self.step_tokens - len(work)
        for row in self.running:
            if budget > 0 and row.n_cached < len(row.tokens) - 1:
                work.append(Work(row, row.n_cached, row.n_cached + min(budget, len(row.tokens) - row.n_cached)))
                budget -= work[-1].end - work[-1].start
        while budget > 0 and self.waiting and self.slots.n_free:
            row = self.waiting.popleft()
            row.slot = self.slots.take()
            if self.blocks is not None:
                row.blocks = self.blocks.match(row.tokens, len(row.tokens) - 1)
                row.prefix_hit = row.n_cached = len(row.blocks) * self.blocks.block_size
            self.running.append(row)
            work.append(Work(row, row.n_cached, row.n_cached + min(budget, len(row.tokens) - row.n_cached),
                             tuple(row.blocks)))
            budget -= work[-1].end - work[-1].start
        return work

    def finish(self, row) -> None:
        self.running.remove(row)
        self.slots.give(row.slot)
        if self.blocks is not None:
            self.blocks.release(row.blocks)
