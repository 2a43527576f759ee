"""A prompt's attention on the CPU a tile at a time (cpu_attention: online softmax over chunks of
keys at fixed positions): a float64 softmax's result within float32 rounding, and every token's
output bit for bit the same whether its run is one step, cut into steps anywhere or a token at a
time (decode rows), beside other slots' rows or not: prompt runs of several tiles and chunks after
earlier tokens of their slot, unpaged and through scattered block tables whose size cuts chunks
short, with windows wider than a chunk, soft-capping and sinks, head sizes on and off the vector
path."""

import numpy as np
import pytest

from llogos_cli.backends.cpu.cpu_attention import CHUNK, TILE
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from tests.test_cpu_attention import bound, reference


def _cache(backend, rng, n_slots, n_ctx, n_kv, dk, dv, block):
    if block is None:
        return backend.kv_cache(n_slots, n_ctx, n_kv, dk, dv, "f32", "f32")
    n_blocks = n_slots * n_ctx // block
    tables = backend.block_tables(n_slots, n_ctx // block)
    tables[:] = rng.permutation(n_blocks).reshape(n_slots, -1)   # each slot's blocks out of order
    return backend.paged_kv_cache(tables, n_blocks, block, n_kv, dk, dv, "f32", "f32")


def _layout(backend, slots, pos):
    return backend.batch_layout(np.asarray(slots, np.int32), np.asarray(pos, np.int32))


# (dk, dv, block): 64 takes the vector path, in blocks of 48 that cut chunks short and unpaged;
# 40 and 24 do not (one position at a time).
HEADS = ((64, 64, None), (64, 64, 48), (40, 24, 16))
# (window, softcap, sinks): a window wider than a chunk, so that its first key moves across chunks.
KINDS = ((0, 0.0, False), (CHUNK + 13, 0.0, False), (0, 30.0, True))


def _prompt(dk, dv, block, window, with_sinks):
    """A slot's keys and values of `before` earlier tokens and T prompt tokens, the prompt's queries."""
    rng = np.random.default_rng(dk + window + int(with_sinks) + (block or 0))
    backend = NumpyBackend("f32", batched=True)
    n_kv, H, before, T = 2, 6, 70, 3 * TILE + 5
    assert before + T > 2 * CHUNK
    cache = _cache(backend, rng, 2, 288, n_kv, dk, dv, block)
    keys = rng.standard_normal((before + T, n_kv, dk), dtype=np.float32)
    values = rng.standard_normal((before + T, n_kv, dv), dtype=np.float32)
    backend.kv_store(cache, keys, values, _layout(backend, np.ones(before + T), np.arange(before + T)))
    q = rng.standard_normal((T, H, dk), dtype=np.float32)
    sinks = rng.standard_normal(H).astype(np.float32) if with_sinks else None
    return backend, cache, keys, values, q, sinks, before


@pytest.mark.parametrize("dk, dv, block", HEADS)
@pytest.mark.parametrize("window, softcap, with_sinks", KINDS)
def test_a_long_prompt_run_matches_float64(dk, dv, block, window, softcap, with_sinks):
    backend, cache, keys, values, q, sinks, before = _prompt(dk, dv, block, window, with_sinks)
    T, H, n_kv = q.shape[0], q.shape[1], keys.shape[1]
    layout = _layout(backend, np.ones(T), np.arange(before, before + T))
    assert len(layout.items(TILE, H, n_kv)) == 4 * n_kv
    scale = 1 / np.sqrt(dk)
    got = backend.attention(q, cache, layout, scale, window, softcap, sinks)
    for t in range(T):
        p = before + t
        lo = max(0, p + 1 - window) if window else 0
        for h in range(H):
            g = h // (H // n_kv)
            k, v = keys[lo:p + 1, g], values[lo:p + 1, g]
            want = reference(q[t, h], k, v, scale, softcap, None if sinks is None else sinks[h])
            assert np.all(np.abs(got[t, h] - want) <= bound(want, q[t, h], k, v, scale)), (t, h)


@pytest.mark.parametrize("dk, dv, block", HEADS)
@pytest.mark.parametrize("window, softcap, with_sinks", KINDS)
@pytest.mark.parametrize("cuts", ((1,), (TILE + 7,), (5, 40, 41, 90), tuple(range(1, 3 * TILE + 5))),
                         ids=("after-one", "mid-tile", "anywhere", "token-by-token"))
def test_a_prompt_cut_into_steps_gives_the_same_bits(dk, dv, block, window, softcap, with_sinks, cuts):
    """Steps of a tile or more go in tiles that start at the step, shorter ones a token at a time:
    each token's sums run over the same chunks in the same order all the same."""
    backend, cache, keys, values, q, sinks, before = _prompt(dk, dv, block, window, with_sinks)
    T, scale = q.shape[0], 1 / np.sqrt(dk)
    whole = backend.attention(q, cache, _layout(backend, np.ones(T), np.arange(before, before + T)), scale, window,
                              softcap, sinks)
    bounds = (0, *cuts, T)
    steps = [backend.attention(q[a:b], cache, _layout(backend, np.ones(b - a), np.arange(before + a, before + b)),
                               scale, window, softcap, sinks) for a, b in zip(bounds[:-1], bounds[1:])]
    assert np.array_equal(np.concatenate(steps), whole)


def test_runs_beside_decode_rows_give_each_token_its_own_bits():
    """One step of a server: decode rows, a short run (speculation's verification) and two prompt
    runs long enough for tiles, each from its own slot: every token's output where it belongs, and
    the bits it has when attended alone."""
    rng = np.random.default_rng(7)
    backend = NumpyBackend("f32", batched=True)
    n_kv, H, dk, dv = 1, 4, 32, 32
    cache = _cache(backend, rng, 5, 160, n_kv, dk, dv, 32)
    history = {0: 9, 1: 40, 2: 3, 3: 0, 4: 77}
    lengths = {0: 1, 1: TILE + 3, 2: 4, 3: TILE, 4: 1}
    for slot in history:
        n = history[slot] + lengths[slot]
        backend.kv_store(cache, rng.standard_normal((n, n_kv, dk), dtype=np.float32),
                         rng.standard_normal((n, n_kv, dv), dtype=np.float32),
                         _layout(backend, np.full(n, slot), np.arange(n)))
    slots = np.concatenate([np.full(n, s) for s, n in lengths.items()])
    pos = np.concatenate([np.arange(history[s], history[s] + n) for s, n in lengths.items()])
    layout = _layout(backend, slots, pos)
    assert len(layout.items(TILE, H, n_kv)) == 3 + (1 + 4 + 1) * H
    q = rng.standard_normal((len(slots), H, dk), dtype=np.float32)
    got = backend.attention(q, cache, layout, 0.2, 0)
    alone = [backend.attention(q[t:t + 1], cache, _layout(backend, slots[t:t + 1], pos[t:t + 1]), 0.2, 0)
             for t in range(len(slots))]
    assert np.array_equal(got, np.concatenate(alone))


def test_keys_past_a_query_are_not_read():
    """The causal mask skips chunks rather than masking them: keys past the run's last position are
    NaN in the cache and the output stays finite; and a query sees nothing of later keys."""
    rng = np.random.default_rng(11)
    backend = NumpyBackend("f32", batched=True)
    cache = _cache(backend, rng, 1, 4 * CHUNK, 1, 16, 16, None)
    cache.k[:] = np.nan
    cache.v[:] = np.nan
    T = 2 * TILE
    layout = _layout(backend, np.zeros(T), np.arange(T))
    backend.kv_store(cache, rng.standard_normal((T, 1, 16), dtype=np.float32),
                     rng.standard_normal((T, 1, 16), dtype=np.float32), layout)
    q = rng.standard_normal((T, 2, 16), dtype=np.float32)
    out = backend.attention(q, cache, layout, 0.25, 0)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[0], np.broadcast_to(cache.v[0, 0, 0], (2, 16)), rtol=1e-6)
