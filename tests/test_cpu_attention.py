"""The compiled attention (cpu_attention) against a float64 softmax over the same keys, for decode
rows and prompt runs, unpaged and through block tables, with windows, soft-capping and sinks, head
sizes that take the vector path (cpu_simd_attention: multiples of 16) and ones that do not, and
the backend's use of it."""

import numpy as np
import pytest

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend


def reference(q, keys, values, scale, softcap, sink):
    """One head: q (dk,), keys (n, dk), values (n, dv) in float64; sink a logit or None."""
    s = keys.astype(np.float64) @ q.astype(np.float64) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    top = max(s.max(), sink) if sink is not None else s.max()
    e = np.exp(s - top)
    total = e.sum() + (np.exp(sink - top) if sink is not None else 0)
    return e @ values.astype(np.float64) / total


def bound(want, q, keys, values, scale):
    """float32 sums over dk (scores) and n (weights) terms of magnitude ~|q||k| and ~|v|."""
    n, dk = keys.shape
    return 16 * np.sqrt(max(dk, n)) * np.finfo(np.float32).eps * (1 + np.abs(want) + np.abs(values).max() * np.abs(
        q).sum() * np.abs(keys).max() * scale)


# (dk, dv, block size): 24 is not a multiple of 16 (one position at a time); 64 and 48 are, in
# blocks of 32 that hold two runs of 16 and then a rest, and unpaged.
HEADS = ((32, 24, 8), (64, 48, 32))


@pytest.mark.parametrize("paged", (False, True))
@pytest.mark.parametrize("window, softcap, with_sinks", ((0, 0.0, False), (5, 0.0, False), (0, 30.0, False),
                                                           (7, 0.0, True), (37, 0.0, False)))
@pytest.mark.parametrize("dk, dv, block", HEADS)
def test_rows_match_float64(paged, window, softcap, with_sinks, dk, dv, block):
    rng = np.random.default_rng(int(paged) * 10 + window)
    b = NumpyBackend("f32", batched=True)
    assert b.compiled_attention is not None
    n_slots, n_ctx, n_kv, H = 5, 64, 2, 6
    lengths = np.array([1, 17, 64, 9, 50])
    if paged:   # each slot's blocks scattered over the pool, out of order
        n_blocks = n_slots * n_ctx // block
        tables = b.block_tables(n_slots, n_ctx // block)
        tables[:] = rng.permutation(n_blocks).reshape(n_slots, -1)
        cache = b.paged_kv_cache(tables, n_blocks, block, n_kv, dk, dv, "f32", "f32")
    else:
        cache = b.kv_cache(n_slots, n_ctx, n_kv, dk, dv, "f32", "f32")
    keys = rng.standard_normal((n_slots, n_ctx, n_kv, dk), dtype=np.float32)
    values = rng.standard_normal((n_slots, n_ctx, n_kv, dv), dtype=np.float32)
    for s in range(n_slots):   # each slot's history stored through the backend
        pos = np.arange(lengths[s], dtype=np.int32)
        b.kv_store(cache, keys[s, :lengths[s]], values[s, :lengths[s]],
                   b.batch_layout(np.full(lengths[s], s, np.int32), pos))
    rows = np.array([3, 0, 2, 4], np.int32)   # slots out of order; slot 1 not decoding
    pos = (lengths[rows] - 1).astype(np.int32)
    q = rng.standard_normal((len(rows), H, dk), dtype=np.float32)
    sinks = rng.standard_normal(H).astype(np.float32) if with_sinks else None
    scale = 1 / np.sqrt(dk)
    got = b.attention(q, cache, b.batch_layout(rows, pos), scale, window, softcap, sinks)
    for r, s in enumerate(rows):
        lo = max(0, pos[r] + 1 - window) if window else 0
        for h in range(H):
            g = h // (H // n_kv)
            want = reference(q[r, h], keys[s, lo:pos[r] + 1, g], values[s, lo:pos[r] + 1, g], scale, softcap,
                             None if sinks is None else sinks[h])
            assert np.all(np.abs(got[r, h] - want) <= bound(want, q[r, h], keys[s, lo:pos[r] + 1, g],
                                                             values[s, lo:pos[r] + 1, g], scale)), (r, h)


@pytest.mark.parametrize("paged", (False, True))
@pytest.mark.parametrize("window", (0, 21))
@pytest.mark.parametrize("dk, dv, block", HEADS)
def test_a_prompt_run_matches_float64(paged, window, dk, dv, block):
    """A prompt chunk after earlier tokens of its slot: each of its tokens attends causally, the
    chunk's own keys included, through the same compiled loop as decode rows."""
    rng = np.random.default_rng(window + dk)
    b = NumpyBackend("f32", batched=True)
    n_slots, n_ctx, n_kv, H, before, T = 2, 96, 2, 4, 23, 51
    if paged:
        tables = b.block_tables(n_slots, n_ctx // block)
        tables[:] = rng.permutation(n_slots * n_ctx // block).reshape(n_slots, -1)
        cache = b.paged_kv_cache(tables, n_slots * n_ctx // block, block, n_kv, dk, dv, "f32", "f32")
    else:
        cache = b.kv_cache(n_slots, n_ctx, n_kv, dk, dv, "f32", "f32")
    keys = rng.standard_normal((before + T, n_kv, dk), dtype=np.float32)
    values = rng.standard_normal((before + T, n_kv, dv), dtype=np.float32)
    slot = np.int32(1)
    b.kv_store(cache, keys[:before], values[:before], b.batch_layout(np.full(before, slot), np.arange(before, dtype=np.int32)))
    layout = b.batch_layout(np.full(T, slot), np.arange(before, before + T, dtype=np.int32))
    b.kv_store(cache, keys[before:], values[before:], layout)
    q = rng.standard_normal((T, H, dk), dtype=np.float32)
    scale = 1 / np.sqrt(dk)
    got = b.attention(q, cache, layout, scale, window)
    for t in range(T):
        p = before + t
        lo = max(0, p + 1 - window) if window else 0
        for h in range(H):
            g = h // (H // n_kv)
            want = reference(q[t, h], keys[lo:p + 1, g], values[lo:p + 1, g], scale, 0.0, None)
            assert np.all(np.abs(got[t, h] - want) <= bound(want, q[t, h], keys[lo:p + 1, g], values[lo:p + 1, g],
                                                            scale)), (t, h)


def test_rows_beside_a_prompt_run_match_numpy():
    """A step holding decode rows and a prompt chunk: the compiled loop agrees with the f32
    backend's NumPy attention (rows attended all at once, the chunk causally)."""
    rng = np.random.default_rng(3)
    compiled, plain = NumpyBackend("f32", batched=True), NumpyBackend("f32")
    assert plain.compiled_attention is None
    outs = []
    for b in (compiled, plain):
        cache = b.kv_cache(3, 16, 1, 8, 8, "f32", "f32")
        rng = np.random.default_rng(3)
        slots, pos = np.array([0, 1, 1, 1, 2], np.int32), np.array([0, 0, 1, 2, 0], np.int32)
        layout = b.batch_layout(slots, pos)
        b.kv_store(cache, rng.standard_normal((5, 1, 8), dtype=np.float32),
                   rng.standard_normal((5, 1, 8), dtype=np.float32), layout)
        outs.append(b.attention(rng.standard_normal((5, 2, 8), dtype=np.float32), cache, layout, 0.3, 0))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)
