"""Decode rows' compiled attention (cpu_attention) against a float64 softmax over the same keys,
unpaged and through block tables, with windows, soft-capping and sinks, and the backend's use of it."""

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


@pytest.mark.parametrize("paged", (False, True))
@pytest.mark.parametrize("window, softcap, with_sinks", ((0, 0.0, False), (5, 0.0, False), (0, 30.0, False),
                                                           (7, 0.0, True)))
def test_rows_match_float64(paged, window, softcap, with_sinks):
    rng = np.random.default_rng(int(paged) * 10 + window)
    b = NumpyBackend("f32", batched=True)
    assert b.compiled_attention is not None
    n_slots, n_ctx, n_kv, H, dk, dv, block = 5, 40, 2, 6, 32, 24, 8
    lengths = np.array([1, 17, 40, 9, 24])
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
            # float32 sums over dk (scores) and n (weights) terms of magnitude ~|q||k| and ~|v|
            bound = 16 * np.sqrt(max(dk, pos[r] + 1)) * np.finfo(np.float32).eps * (1 + np.abs(want) + np.abs(
                values[s, lo:pos[r] + 1, g]).max() * np.abs(q[r, h]).sum() * np.abs(keys[s, :, g]).max() * scale)
            assert np.all(np.abs(got[r, h] - want) <= bound), (r, h)


def test_rows_beside_a_prompt_run_match_numpy():
    """A step holding decode rows and a prompt chunk: the rows through the compiled loop agree with
    the f32 backend's NumPy attention, and the chunk is left to it."""
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
