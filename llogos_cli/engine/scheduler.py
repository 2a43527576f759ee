"""Decides what each engine step runs: one token for every decoding row, then prompt chunks.

Running rows that are decoding always get their token, so their latency stays one step; the rest
of the step's token budget goes to prompts, first to rows already prefilling and then to waiting
requests admitted into free slots. A prompt longer than what is left is split across steps.
The KV cache is paged: a request is admitted when the blocks for its prompt are free, and a
decoding row takes one more block when it fills its last; when none is left, the most recently
admitted row is preempted (vLLM's recompute preemption): its blocks are freed, and it goes back to
the head of the queue to recompute its tokens later, its sampled tokens kept. The pool holds at
least one full context, so a request that fits alone always runs. With a prefix cache, a request
admitted starts past the longest cached run of blocks that begins its prompt (never its last
token, whose logits are needed), its table pointing at those blocks.
"""

from collections import deque
from dataclasses import dataclass

from llogos_cli.engine.prefix_cache import BlockManager
from llogos_cli.engine.slots import SlotPool


@dataclass(frozen=True, slots=True)
class Work:
    """Tokens row.tokens[start:end] go into the row's blocks at positions start..end-1."""
    row: object
    start: int
    end: int

    @property
    def samples(self) -> bool:
        """The chunk ends at the row's last token, whose logits choose the next one."""
        return self.end == len(self.row.tokens)


class Scheduler:
    def __init__(self, n_slots: int, step_tokens: int, blocks: BlockManager, cache_prefixes: bool = True):
        self.slots = SlotPool(n_slots)
        self.blocks = blocks
        self.cache_prefixes = cache_prefixes  # share full blocks between rows by their hash
        self.step_tokens = max(step_tokens, n_slots)   # room for every row's decode token
        self.waiting: deque = deque()
        self.running: list = []               # in the order they were admitted
        self.n_preempted = 0

    def add(self, row) -> None:
        self.waiting.append(row)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def schedule(self) -> list[Work]:
        self._grow_decoding_rows()
        decoding = sorted((r for r in self.running if r.n_cached == len(r.tokens) - 1), key=lambda r: r.slot)
        work = [Work(r, r.n_cached, r.n_cached + 1) for r in decoding]
        budget = self.step_tokens - len(work)
        for row in self.running:
            if budget > 0 and row.n_cached < len(row.tokens) - 1:
                work.append(Work(row, row.n_cached, row.n_cached + min(budget, len(row.tokens) - row.n_cached)))
                budget -= work[-1].end - work[-1].start
        while budget > 0 and self.waiting and self.slots.n_free and self._admit(self.waiting[0]):
            row = self.waiting.popleft()
            row.slot = self.slots.take()
            self.running.append(row)
            work.append(Work(row, row.n_cached, row.n_cached + min(budget, len(row.tokens) - row.n_cached)))
            budget -= work[-1].end - work[-1].start
        return work

    def finish(self, row) -> None:
        self.running.remove(row)
        self.slots.give(row.slot)
        self.blocks.release(row.blocks)

    def _admit(self, row) -> bool:
        """Take the row's cached prefix and blocks for the rest of its tokens; False (and nothing
        taken) when the pool cannot hold them now."""
        blocks, B = self.blocks, self.blocks.block_size
        matched = blocks.match(row.tokens, len(row.tokens) - 1) if self.cache_prefixes else []
        need = -(-len(row.tokens) // B) - len(matched)
        if need > blocks.n_free:
            blocks.release(matched)
            return False
        row.blocks = matched + blocks.take(need)
        row.n_sealed, row.n_cached = len(matched), len(matched) * B
        if not row.started:   # a preempted row's recompute is not a prefix hit of its request
            row.prefix_hit = row.n_cached
        return True

    def _grow_decoding_rows(self) -> None:
        """A block more for every decoding row whose blocks are full, the oldest rows first,
        preempting the newest while the pool has none."""
        B = self.blocks.block_size
        for row in list(self.running):
            if row not in self.running or row.n_cached < len(row.blocks) * B:
                continue
            while self.blocks.n_free == 0 and row in self.running:
                self._preempt(self.running[-1])
            if row in self.running:
                row.blocks += self.blocks.take(1)

    def _preempt(self, row) -> None:
        self.finish(row)
        row.slot, row.n_cached, row.n_sealed = -1, 0, 0
        self.waiting.appendleft(row)
        self.n_preempted += 1
