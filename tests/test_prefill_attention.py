"""A prompt's attention a tile at a time (cpu_prefill_attention, online softmax over chunks of
keys) against the compiled loop that takes a (token, head) at a time (cpu_attention) on the same
cache: prompt runs long enough for several tiles and several chunks of keys, after earlier tokens
of their slot, unpaged and through scattered block tables, with windows, soft-capping, sinks and
without the causal mask (encoders), head sizes on and off the vector path, and runs beside decode
rows and short runs in one step."""

import numpy as np
import pytest

from llogos_cli.backends.cpu.cpu_attention import attend_rows
from llogos_cli.backends.cpu.cpu_prefill_attention import CHUNK, TILE
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend


def _cache(backend, rng, n_slots, n_ctx, n_kv, dk, dv, block):
    if block is None:
        return backend.kv_cache(n_slots, n_ctx, n_kv, dk, dv, "f32", "f32")
    n_blocks = n_slots * n_ctx // block
    tables = backend.block_tables(n_slots, n_ctx // block)
    tables[:] = rng.permutation(n_blocks).reshape(n_slots, -1)   # each slot's blocks out of order
    return backend.paged_kv_cache(tables, n_blocks, block, n_kv, dk, dv, "f32", "f32")


def _row_by_row(q, cache, layout, last, scale, window, softcap, sinks):
    out = np.empty((q.shape[0], q.shape[1], cache.v.shape[3]), np.float32)
    attend_rows(q, cache.k, cache.v, layout.blocks(cache), last, scale, window, softcap,
                np.empty(0, np.float32) if sinks is None else sinks, out)
    return out


def _store(backend, cache, rng, slots, pos, n_kv, dk, dv):
    layout = backend.batch_layout(np.asarray(slots, np.int32), np.asarray(pos, np.int32))
    backend.kv_store(cache, rng.standard_normal((len(slots), n_kv, dk), dtype=np.float32),
                     rng.standard_normal((len(slots), n_kv, dv), dtype=np.float32), layout)
    return layout


# (dk, dv, block): 64 takes the vector path, in blocks of 48 that cut chunks short and unpaged;
# 40 and 24 do not (one position at a time).
HEADS = ((64, 64, None), (64, 64, 48), (40, 24, 16))


@pytest.mark.parametrize("dk, dv, block", HEADS)
@pytest.mark.parametrize("window, softcap, with_sinks, causal", ((0, 0.0, False, True), (45, 0.0, False, True),
                                                                  (0, 30.0, True, True), (0, 0.0, False, False)))
def test_a_long_prompt_run_matches_row_by_row(dk, dv, block, window, softcap, with_sinks, causal):
    """Several tiles (the last one short) over several chunks of keys, after earlier tokens of the
    slot: every query, with its group's heads sharing the chunks, as the (token, head) loop gives it."""
    rng = np.random.default_rng(dk + window + int(causal))
    backend = NumpyBackend("f32", batched=True)
    n_kv, H, before, T = 2, 6, 70, 3 * TILE + 5
    assert before + T > 2 * CHUNK
    cache = _cache(backend, rng, 2, 288, n_kv, dk, dv, block)
    _store(backend, cache, rng, np.ones(before), np.arange(before), n_kv, dk, dv)
    layout = _store(backend, cache, rng, np.ones(T), np.arange(before, before + T), n_kv, dk, dv)
    assert len(layout.tiles(TILE)) == 4 and len(layout.untiled(TILE)) == 0
    q = rng.standard_normal((T, H, dk), dtype=np.float32)
    sinks = rng.standard_normal(H).astype(np.float32) if with_sinks else None
    scale = 1 / np.sqrt(dk)
    got = backend.attention(q, cache, layout, scale, window, softcap, sinks, causal)
    want = _row_by_row(q, cache, layout, layout.pos if causal else layout.ends(), scale, window, softcap, sinks)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_runs_beside_decode_rows_match_row_by_row():
    """One step of a server: decode rows, a short run (speculation's verification) and two prompt
    runs long enough for tiles, each from its own slot: tiles for the long runs, the (token, head)
    loop for the rest, every token's output where it belongs."""
    rng = np.random.default_rng(7)
    backend = NumpyBackend("f32", batched=True)
    n_kv, H, dk, dv = 1, 4, 32, 32
    cache = _cache(backend, rng, 5, 160, n_kv, dk, dv, 32)
    history = {0: 9, 1: 40, 2: 3, 3: 0, 4: 77}
    for slot, n in history.items():
        if n:
            _store(backend, cache, rng, np.full(n, slot), np.arange(n), n_kv, dk, dv)
    lengths = {0: 1, 1: TILE + 3, 2: 4, 3: TILE, 4: 1}
    slots = np.concatenate([np.full(n, s) for s, n in lengths.items()])
    pos = np.concatenate([np.arange(history[s], history[s] + n) for s, n in lengths.items()])
    layout = _store(backend, cache, rng, slots, pos, n_kv, dk, dv)
    assert len(layout.tiles(TILE)) == 3 and len(layout.untiled(TILE)) == 1 + 4 + 1
    q = rng.standard_normal((len(slots), H, dk), dtype=np.float32)
    got = backend.attention(q, cache, layout, 0.2, 0)
    np.testing.assert_allclose(got, _row_by_row(q, cache, layout, layout.pos, 0.2, 0, 0.0, None), rtol=2e-5, atol=2e-6)


def test_keys_past_a_query_are_not_read():
    """The causal mask skips chunks rather than masking them: keys past the run's last position are
    NaN in the cache and the output stays finite; and a query sees nothing of later keys."""
    rng = np.random.default_rng(11)
    backend = NumpyBackend("f32", batched=True)
    cache = _cache(backend, rng, 1, 4 * CHUNK, 1, 16, 16, None)
    cache.k[:] = np.nan
    cache.v[:] = np.nan
    T = 2 * TILE
    layout = _store(backend, cache, rng, np.zeros(T), np.arange(T), 1, 16, 16)
    q = rng.standard_normal((T, 2, 16), dtype=np.float32)
    out = backend.attention(q, cache, layout, 0.25, 0)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[0], np.broadcast_to(cache.v[0, 0, 0], (2, 16)), rtol=1e-6)
