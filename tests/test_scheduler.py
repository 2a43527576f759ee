"""The scheduler's books: admission by blocks, preemption, and slots that keep a finished row
(keep_slots) for the next request to continue. Rows here are stand-ins; the engine's tests run the
same decisions through the model."""

from dataclasses import dataclass, field

from llogos_cli.engine.prefix_cache import BlockManager
from llogos_cli.engine.scheduler import Scheduler


@dataclass(eq=False)
class FakeRow:
    """What the scheduler reads and writes of a row (engine.batch.Row's bookkeeping fields)."""
    tokens: list[int]
    slot: int = -1
    n_cached: int = 0
    blocks: list[int] = field(default_factory=list)
    n_sealed: int = 0
    prefix_hit: int = 0
    started: float = 0.0
    copy_block: tuple | None = None
    restore: list | None = None
    mark_at: int = -1
    mark: tuple | None = None
    cache_prompt: bool = True
    shifted: bool = False


def test_a_row_is_admitted_by_the_blocks_of_its_prompt_and_waits_when_they_are_not_free():
    scheduler = Scheduler(4, 512, BlockManager(5, 4))
    first, second = FakeRow(list(range(10))), FakeRow(list(range(100, 110)))
    scheduler.add(first)
    scheduler.add(second)
    work = scheduler.schedule()
    assert [w.row for w in work] == [first] and len(first.blocks) == 3   # 10 tokens: 3 blocks of 4
    assert list(scheduler.waiting) == [second]                           # 3 more than the 2 left


def test_a_decoding_row_that_fills_its_blocks_preempts_the_newest_row():
    scheduler = Scheduler(2, 512, BlockManager(4, 4))
    old, new = FakeRow(list(range(8))), FakeRow(list(range(100, 108)))
    for row in (old, new):
        scheduler.add(row)
        scheduler.schedule()
        row.n_cached = len(row.tokens) - 1   # prefilled; its next token lands in its second block
    assert scheduler.blocks.n_free == 0
    for row in (old, new):
        row.n_cached += 1
        row.tokens.append(1)                 # a token sampled: the next one needs a third block
    new.started = 1.0
    work = scheduler.schedule()
    assert [w.row for w in work] == [old] and len(old.blocks) == 3
    assert list(scheduler.waiting) == [new] and new.blocks == [] and (new.slot, new.n_cached) == (-1, 0)
    assert scheduler.n_preempted == 1 and scheduler.slots.n_free == 1


def run(scheduler: Scheduler, row: FakeRow, generated: list[int] = ()) -> None:
    """Admit the row and run it as the engine would: its prompt, then each generated token, and
    finish it (the last token sampled is never evaluated)."""
    scheduler.add(row)
    while row.n_cached < len(row.tokens):   # the prompt, its last token in a chunk of its own or not
        for w in scheduler.schedule():
            if w.row.mark_at == w.start:
                w.row.mark = (w.start, f"state at {w.start}")
            w.row.n_cached = w.end
            if scheduler.cache_prefixes:
                w.row.n_sealed = scheduler.blocks.seal(w.row.blocks, w.row.tokens, w.end, w.row.n_sealed)
    for token in generated:
        row.tokens.append(token)
        for w in scheduler.schedule():
            w.row.n_cached = w.end
    row.tokens.append(99)   # the token it ends on, sampled and never evaluated
    scheduler.finish(row)


def test_a_finished_row_parks_and_the_next_request_continues_it_to_the_token():
    scheduler = Scheduler(1, 512, BlockManager(8, 4), cache_prefixes=False, keep_slots=True)
    first = FakeRow(list(range(10)))
    run(scheduler, first, [50, 51])
    assert scheduler.parked == {0: first} and first.n_cached == 12 and scheduler.blocks.n_free == 5
    held = list(first.blocks)
    nxt = FakeRow(list(range(10)) + [50, 77, 78])   # parts from it after 11 tokens
    scheduler.add(nxt)
    work = scheduler.schedule()
    assert [(w.start, w.end) for w in work] == [(11, 13)] and nxt.prefix_hit == 11
    assert nxt.blocks[:3] == held[:3] and nxt.copy_block is None   # its own partial block, written on
    assert not scheduler.parked


def test_a_row_that_may_not_reuse_the_cache_evaluates_its_whole_prompt():
    scheduler = Scheduler(1, 512, BlockManager(8, 4), cache_prefixes=True, keep_slots=True)
    first = FakeRow(list(range(10)))
    run(scheduler, first, [50, 51])
    again = FakeRow(list(range(10)) + [50, 77], cache_prompt=False)   # parked and named blocks begin it
    scheduler.add(again)
    work = scheduler.schedule()
    assert work[0].start == 0 and again.prefix_hit == 0 and again.copy_block is None
    assert not set(again.blocks) & set(first.blocks[:2])   # the named blocks of its first 8 tokens are not shared


def test_a_parked_row_parted_from_inside_a_named_block_copies_that_blocks_head():
    scheduler = Scheduler(1, 512, BlockManager(8, 4), cache_prefixes=True, keep_slots=True)
    first = FakeRow(list(range(10)))
    run(scheduler, first)
    named = first.blocks[1]
    assert scheduler.blocks.named(named)                  # tokens 4-7, sealed for prefix reuse
    nxt = FakeRow(list(range(6)) + [70, 71])
    scheduler.add(nxt)
    [w] = scheduler.schedule()
    assert (w.start, w.end) == (6, 8) and nxt.blocks[0] == first.blocks[0]
    assert nxt.copy_block == (named, nxt.blocks[1], 2) and nxt.blocks[1] != named
    assert scheduler.blocks.named(named)                  # the cached block itself is left whole


def test_parked_rows_are_evicted_before_a_running_row_is_preempted():
    scheduler = Scheduler(2, 512, BlockManager(4, 4), cache_prefixes=False, keep_slots=True)
    done = FakeRow(list(range(5)))
    run(scheduler, done)                                   # parks holding 2 blocks
    busy = FakeRow(list(range(100, 108)))
    scheduler.add(busy)
    scheduler.schedule()
    busy.n_cached = 7
    busy.tokens.append(1)
    busy.n_cached = 8                                      # its 9th token needs a third block
    busy.tokens.append(2)
    scheduler.schedule()
    assert len(busy.blocks) == 3 and not scheduler.parked and scheduler.n_preempted == 0


def test_a_request_goes_to_the_free_slot_whose_tokens_begin_it_furthest():
    scheduler = Scheduler(3, 512, BlockManager(16, 4), cache_prefixes=False, keep_slots=True)
    a, b = FakeRow([1, 2, 3, 4, 5, 6]), FakeRow([1, 2, 9, 9, 9])
    run(scheduler, a)
    run(scheduler, b)
    assert {a.slot, b.slot} == {0, 1} and set(scheduler.parked) == {0, 1}
    nxt = FakeRow([1, 2, 9, 9, 7])
    scheduler.add(nxt)
    scheduler.schedule()
    assert nxt.slot == b.slot and nxt.prefix_hit == 4 and scheduler.parked == {a.slot: a}
    fresh = FakeRow([40, 41])
    scheduler.add(fresh)
    scheduler.schedule()
    assert fresh.slot == 2 and scheduler.parked == {a.slot: a}   # an empty slot before a parked one


def test_recurrent_rows_mark_their_state_and_resume_only_from_the_mark_or_their_end():
    scheduler = Scheduler(1, 512, BlockManager(8, 4), cache_prefixes=False, keep_slots=True, recurrent=True)
    first = FakeRow(list(range(9)))
    run(scheduler, first, [20, 21])
    assert first.mark == (8, "state at 8")                # taken before the prompt's last token
    cases = [(list(range(9)) + [20, 21, 99, 5], 11, None),   # all it holds: the state as it is
             (list(range(9)) + [20, 30], 8, "state at 8"),   # parts after the mark: back to it
             ([0, 1, 2, 7, 7], 0, None)]                      # parts before it: from the start
    for tokens, start, restore in cases:
        scheduler = Scheduler(1, 512, BlockManager(8, 4), cache_prefixes=False, keep_slots=True, recurrent=True)
        run(scheduler, FakeRow(list(range(9))), [20, 21])
        nxt = FakeRow(tokens)
        scheduler.add(nxt)
        work = scheduler.schedule()
        assert work[0].start == start and nxt.restore == restore, tokens
