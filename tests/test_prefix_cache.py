"""The prefix cache's block manager: hash chains, reference counts, LRU eviction, a full pool."""

from llogos_cli.engine.prefix_cache import ROOT, BlockManager, block_hash

B = 4


def tokens(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


def stored(manager: BlockManager, prompt: list[int]) -> list[int]:
    """A row that ran `prompt` and keeps its blocks: its block table."""
    table = manager.match(prompt, len(prompt))
    manager.extend(table, prompt)
    return table


def test_a_block_is_named_by_its_tokens_and_everything_before_them():
    a = block_hash(ROOT, [1, 2, 3, 4])
    assert a == block_hash(ROOT, [1, 2, 3, 4])
    assert a != block_hash(ROOT, [1, 2, 3, 5])
    assert block_hash(a, [5, 6, 7, 8]) != block_hash(block_hash(ROOT, [0, 2, 3, 4]), [5, 6, 7, 8])


def test_same_tokens_after_a_different_beginning_do_not_hit():
    m = BlockManager(8, B)
    table = stored(m, [1, 2, 3, 4] + [5, 6, 7, 8])
    m.release(table)
    assert m.match([9, 9, 9, 9] + [5, 6, 7, 8], 8) == []
    assert len(m.match([1, 2, 3, 4] + [5, 6, 7, 8], 8)) == 2


def test_extend_adds_only_full_blocks_and_reports_the_new_ones():
    m = BlockManager(8, B)
    table: list[int] = []
    assert m.extend(table, tokens(3)) == []
    new = m.extend(table, tokens(9))
    assert [i for i, _ in new] == [0, 1] and table == [b for _, b in new]
    assert m.extend(table, tokens(11)) == []          # still two full blocks
    assert [i for i, _ in m.extend(table, tokens(12))] == [2]
    assert len(table) == 3 and len(set(table)) == 3


def test_a_prefix_diverging_mid_block_hits_the_blocks_before_it():
    m = BlockManager(8, B)
    first = tokens(12)
    m.release(stored(m, first))
    second = first[:6] + [7, 7, 7, 7, 7, 7]            # diverges inside the second block
    hit = m.match(second, len(second))
    assert len(hit) == 1
    new = m.extend(hit, second)
    assert [i for i, _ in new] == [1, 2]               # its own second and third blocks


def test_match_keeps_within_the_limit():
    m = BlockManager(8, B)
    prompt = tokens(12)
    m.release(stored(m, prompt))
    assert len(m.match(prompt, 11)) == 2               # the last token is recomputed: 8 of 12 reused
    assert len(m.match(prompt, 12)) == 3


def test_shared_blocks_are_counted_and_freed_by_the_last_user():
    m = BlockManager(4, B)
    a = stored(m, tokens(8))
    b = m.match(tokens(8), 8)
    assert b == a and all(m.blocks[i].refs == 2 for i in a)
    assert m.extend(b, tokens(8)) == []                 # nothing new to copy
    m.release(a)
    assert all(m.blocks[i].refs == 1 for i in b) and m.n_free == 2
    m.release(b)
    assert m.n_free == 4 and b == [] and a == []
    assert len(m.match(tokens(8), 8)) == 2             # released blocks keep their contents


def test_eviction_takes_never_used_blocks_first_then_the_least_recently_used_tail_first():
    m = BlockManager(4, B)
    old = stored(m, tokens(8, 100))
    m.release(old)
    recent = stored(m, tokens(8, 200))                  # the two never-used blocks
    assert set(recent).isdisjoint(old)
    m.release(recent)
    m.release(stored(m, tokens(4, 100)))                # a hit: 100's head is now recent
    third = stored(m, tokens(4, 300))                   # evicts 100's tail, the oldest
    assert len(m.match(tokens(8, 100), 8)) == 1
    m.release(third)


def test_a_full_pool_stops_caching_and_never_hands_out_a_block_in_use():
    m = BlockManager(3, B)
    held = stored(m, tokens(12, 100))
    assert m.n_free == 0
    table: list[int] = []
    assert m.extend(table, tokens(8, 200)) == [] and table == []
    assert len(m.match(tokens(12, 100), 12)) == 3      # what is held is still there to share
    m.release(held)
    assert m.n_free == 0                                 # the match above still holds them


# ---------------------------------------------------------------- the paged cache's blocks
def test_taken_blocks_are_unnamed_and_come_back_before_the_named_ones():
    m = BlockManager(6, B)
    named = stored(m, tokens(8))                        # blocks 0 and 1, named
    m.release(named)
    fresh = m.take(3)
    assert fresh == [2, 3, 4] and all(m.blocks[i].refs == 1 and m.blocks[i].digest == ROOT for i in fresh)
    assert m.n_free == 3
    m.release(fresh)
    assert m.take(3) == [2, 3, 4]                       # unnamed first: the named prefix survives
    assert len(m.match(tokens(8), 8)) == 2


def test_take_evicts_the_least_recently_used_named_block_once_no_unnamed_one_is_left():
    m = BlockManager(2, B)
    m.release(stored(m, tokens(8)))
    assert m.take(1) == [1]                             # the tail goes first
    assert len(m.match(tokens(8), 8)) == 1              # the head is still there to hit


def test_seal_names_full_written_blocks_so_a_later_prompt_hits_them():
    m = BlockManager(8, B)
    prompt = tokens(10)
    table = m.take(3)                                   # a row's table for 10 tokens
    assert m.seal(table, prompt, 6, 0) == 1             # one full block written so far
    assert m.seal(table, prompt, 10, 1) == 2            # the third block is not full yet
    assert m.blocks[table[2]].digest == ROOT
    assert m.match(prompt, 10) == table[:2]             # the same names the hash chain gives
    m.release(table[:2])                                # (the match's references)


def test_seal_continues_the_chain_of_a_matched_prefix():
    m = BlockManager(8, B)
    m.release(stored(m, tokens(8)))
    longer = tokens(12)
    table = m.match(longer, 11)
    assert len(table) == 2
    table += m.take(1)
    assert m.seal(table, longer, 12, 2) == 3
    m.release(table)
    assert len(m.match(longer, 12)) == 3


def test_a_block_sealed_twice_is_shared_and_the_copy_freed():
    m = BlockManager(4, B)
    a, b = m.take(1), m.take(1)
    m.seal(a, tokens(4), 4, 0)
    m.seal(b, tokens(4), 4, 0)                          # the same tokens, written by another row
    assert b == a and m.blocks[a[0]].refs == 2
    assert m.n_free == 3                                # the duplicate went back
    m.release(a)
    m.release(b)
    assert m.n_free == 4 and len(m.match(tokens(4), 4)) == 1


def test_taking_every_block_leaves_none_free():
    m = BlockManager(3, B)
    held = m.take(3)
    assert m.n_free == 0 and sorted(held) == [0, 1, 2]
    m.release(held)
    assert m.n_free == 3
