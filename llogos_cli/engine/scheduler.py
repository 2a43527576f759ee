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

With keep_slots (llama-server's per-slot prompt cache, for `generate` and `chat`), a finished row
stays parked in its slot, its blocks held and its recurrent state in place, until a new request
takes the slot or the pool needs the blocks. A request continues the parked row's tokens as far as
they agree, to the token: a regenerated reply evaluates only the prompt's last token. Recurrent
state cannot step back, so a row marks it before its prompt's last token (a snapshot the runner
takes), and a request that parts from the parked tokens before their end resumes from that mark.
"""

from collections import deque
from dataclasses import dataclass

from llogos_cli.engine.prefix_cache import BlockManager
from llogos_cli.engine.slots import SlotPool


@dataclass(frozen=True, slots=True)
class Work:
    """Tokens row.tokens[start:end] go into the row's blocks at positions start..end-1, and a
    decoding row's draft (engine/speculation.py) after them, at positions end.."""
    row: object
    start: int
    end: int
    draft: tuple[int, ...] = ()

    @property
    def samples(self) -> bool:
        """The chunk ends at the row's last token, whose logits choose the next one."""
        return self.end == len(self.row.tokens)


class Scheduler:
    def __init__(self, n_slots: int, step_tokens: int, blocks: BlockManager, cache_prefixes: bool = True,
                 keep_slots: bool = False, recurrent: bool = False):
        self.slots = SlotPool(n_slots)
        self.blocks = blocks
        self.cache_prefixes = cache_prefixes  # share full blocks between rows by their hash
        self.keep_slots = keep_slots
        self.recurrent = recurrent            # rows carry state that a KV prefix cannot rebuild
        self.parked: dict[int, object] = {}   # slot -> the finished row still in it, oldest first
        self.step_tokens = max(step_tokens, n_slots)   # room for every row's decode token
        self.waiting: deque = deque()
        self.running: list = []               # in the order they were admitted
        self.n_preempted = 0

    def add(self, row) -> None:
        self.waiting.append(row)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    @property
    def decoding(self) -> list:
        """The running rows whose prompt is in the cache but for its last token: one token a step."""
        return [r for r in self.running if r.n_cached == len(r.tokens) - 1]

    def schedule(self, drafts: dict | None = None) -> list[Work]:
        """The step's work; drafts (row -> tokens drafted for it) go with their decoding rows as
        far as the step's budget and the free blocks allow."""
        self._grow_decoding_rows()
        decoding = sorted(self.decoding, key=lambda r: r.slot)
        budget = self.step_tokens - len(decoding)
        work = []
        for r in decoding:
            draft = self._room_for_draft(r, (drafts or {}).get(r, [])[:budget])
            budget -= len(draft)
            work.append(Work(r, r.n_cached, r.n_cached + 1, tuple(draft)))
        for row in self.running:
            if budget > 0 and row.n_cached < len(row.tokens) - 1:
                work.append(self._prefill(row, budget))
                budget -= work[-1].end - work[-1].start
        while budget > 0 and self.waiting and self.slots.n_free and self._admit(self.waiting[0]):
            row = self.waiting.popleft()
            self.running.append(row)
            work.append(self._prefill(row, budget))
            budget -= work[-1].end - work[-1].start
        return work

    def _room_for_draft(self, row, draft: list[int]) -> list[int]:
        """As much of the draft as the row's blocks hold once it takes the free ones it needs (a
        draft never evicts a parked row or preempts a running one)."""
        B = self.blocks.block_size
        need = min(-(-(row.n_cached + 1 + len(draft)) // B) - len(row.blocks), self.blocks.n_free)
        if need > 0:
            row.blocks += self.blocks.take(need)
        return draft[:len(row.blocks) * B - row.n_cached - 1]

    def _prefill(self, row, budget: int) -> Work:
        """The row's next prompt chunk. A recurrent row that parks stops short of its last token
        to mark its state there (row.mark_at: the runner snapshots it before that token)."""
        end = row.n_cached + min(budget, len(row.tokens) - row.n_cached)
        if self.keep_slots and self.recurrent and end == len(row.tokens) and row.n_cached < end - 1:
            end -= 1
            row.mark_at = end
        return Work(row, row.n_cached, end)

    def finish(self, row, keep: bool = True) -> None:
        """The row is done: its slot frees, and its blocks too unless it parks there (keep_slots;
        never with keep=False, a row cut short whose cache may be half-written)."""
        self.running.remove(row)
        self.slots.give(row.slot)
        if self.keep_slots and keep and not row.shifted:   # a shifted row's KV is not its tokens' alone
            self.parked[row.slot] = row
        else:
            self.blocks.release(row.blocks)

    def _admit(self, row) -> bool:
        """Give the row a slot, the tokens it can start after (a parked row's or the prefix
        cache's) and blocks for the rest; False (and the row unchanged) when the pool cannot hold
        them now."""
        blocks, B = self.blocks, self.blocks.block_size
        slot = self._slot_for(row)
        parked = self.parked.pop(slot, None)
        reuse = row.cache_prompt
        if parked and not reuse:
            blocks.release(parked.blocks)
        n, table, copy, restore, n_sealed = self._continue(parked, row) if parked and reuse else (0, [], None, None, 0)
        matched = blocks.match(row.tokens, len(row.tokens) - 1) if self.cache_prefixes and reuse else []
        if len(matched) * B > n:
            blocks.release(table)
            n, table, copy, restore, n_sealed = len(matched) * B, matched, None, None, len(matched)
        else:
            blocks.release(matched)
        need = -(-len(row.tokens) // B) - len(table) + (copy is not None)
        while need > blocks.n_free and self._evict():
            pass
        if need > blocks.n_free:
            blocks.release(table)
            return False
        if copy is not None:   # the shared block where the row parts from it: its head copied to a block of its own
            table[-1] = blocks.take(1)[0]
            copy = (copy, table[-1], n % B)
            blocks.release([copy[0]])
        row.blocks = table + blocks.take(need - (copy is not None))
        row.slot, row.n_cached, row.n_sealed = self.slots.take(slot), n, n_sealed
        row.copy_block, row.restore = copy, restore
        if not row.started:   # a preempted row's recompute is not a prefix hit of its request
            row.prefix_hit = row.n_cached
        return True

    def _slot_for(self, row) -> int:
        """A free slot: the parked one whose tokens begin the row's furthest if they begin it by at
        least half of what it holds (llama-server's slot similarity), else one with nothing parked,
        else the parked one whose tokens begin it furthest, the one parked longest ago on a tie."""
        best, best_n = next(iter(self.parked), None), 0
        for slot, parked in self.parked.items():
            n = _common(parked.tokens[:parked.n_cached], row.tokens)
            if n > best_n:
                best, best_n = slot, n
        empty = [slot for slot in self.slots.free if slot not in self.parked]
        if empty and (best is None or 2 * best_n < self.parked[best].n_cached):
            return empty[-1]
        return best

    def _continue(self, parked, row) -> tuple:
        """How the row continues the parked row in its slot: (tokens kept, their blocks, the named
        block to copy the head of or None, the recurrent state to restore or None, named blocks at
        the table's head). The parked row's other blocks are released."""
        B = self.blocks.block_size
        n = min(_common(parked.tokens[:parked.n_cached], row.tokens), len(row.tokens) - 1)
        restore = None
        if self.recurrent and n < parked.n_cached:   # state cannot step back: to the mark, or from the start
            mark_at, snapshot = parked.mark or (0, None)
            n, restore = (mark_at, snapshot) if 0 < mark_at <= n else (0, None)
        kept = -(-n // B)
        table = parked.blocks[:kept]
        self.blocks.release(parked.blocks[kept:])
        copy = table[-1] if n % B and self.blocks.named(table[-1]) else None
        return n, table, copy, restore, min(parked.n_sealed, n // B)

    def _evict(self) -> bool:
        """Free the blocks of the row parked longest ago; False when none is."""
        if not self.parked:
            return False
        slot = next(iter(self.parked))
        self.blocks.release(self.parked.pop(slot).blocks)
        return True

    def _grow_decoding_rows(self) -> None:
        """A block more for every decoding row whose blocks are full, the oldest rows first,
        preempting the newest while the pool has none."""
        B = self.blocks.block_size
        for row in list(self.running):
            if row not in self.running or row.n_cached < len(row.blocks) * B:
                continue
            while self.blocks.n_free == 0 and row in self.running:
                if not self._evict():
                    self._preempt(self.running[-1])
            if row in self.running:
                row.blocks += self.blocks.take(1)

    def _preempt(self, row) -> None:
        self.finish(row, keep=False)
        row.slot, row.n_cached, row.n_sealed = -1, 0, 0
        self.waiting.appendleft(row)
        self.n_preempted += 1


def _common(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of a and b."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
