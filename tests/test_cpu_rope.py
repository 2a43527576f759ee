"""The CPU's RoPE-and-store of a layer in one compiled call (cpu_rope.rope_store_rows, the backend's
rope_kv_store where numba is loaded and the cache is float32 or float16) against its parts, rope of q and k
then kv_store: the same turned queries and the same cache, bit for bit, for decode rows and prompt
runs, unpaged and through block tables, both pair styles, partial rotation, frequency factors and
an attention factor."""

import numpy as np
import pytest

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend


def _cache(b, paged, rng, n_kv, d, types=("f32", "f32")):
    if not paged:
        return b.kv_cache(3, 32, n_kv, d, d, *types)
    tables = b.block_tables(3, 4)
    tables[:] = rng.permutation(12).reshape(3, 4)   # each slot's blocks scattered over the pool
    return b.paged_kv_cache(tables, 12, 8, n_kv, d, d, *types)


@pytest.mark.parametrize("types", (("f32", "f32"), ("f16", "f16"), ("f16", "f32")))
@pytest.mark.parametrize("paged", (False, True))
@pytest.mark.parametrize("neox", (False, True))
@pytest.mark.parametrize("dims, with_factors, attn_factor", ((64, False, 1.0), (32, True, 1.3)))
@pytest.mark.parametrize("slots, pos", (([2, 0], [9, 30]), ([1] * 5, [3, 4, 5, 6, 7])))
def test_fused_matches_rope_then_store(types, paged, neox, dims, with_factors, attn_factor, slots, pos):
    rng = np.random.default_rng(dims + 2 * neox + paged)
    b = NumpyBackend("quantized")
    assert b._jit
    n_head, n_kv, d = 6, 2, 64
    factors = rng.uniform(1, 4, dims // 2).astype(np.float32) if with_factors else None
    slots, pos = np.array(slots, np.int32), np.array(pos, np.int32)
    q = rng.standard_normal((len(slots), n_head, d), dtype=np.float32)
    k = rng.standard_normal((len(slots), n_kv, d), dtype=np.float32)
    v = rng.standard_normal((len(slots), n_kv, d), dtype=np.float32)
    caches = [_cache(b, paged, np.random.default_rng(1), n_kv, d, types) for _ in range(2)]
    layout = b.batch_layout(slots, pos)
    turn = (dims, 10000.0, 0.5, neox, factors, attn_factor)
    fused = b.rope_kv_store(caches[0], q, k, v, layout, *turn)
    parted = b.rope(q, layout.pos, *turn)
    b.kv_store(caches[1], b.rope(k, layout.pos, *turn), v, layout)
    np.testing.assert_array_equal(fused, parted)
    np.testing.assert_array_equal(caches[0].k, caches[1].k)
    np.testing.assert_array_equal(caches[0].v, caches[1].v)
    assert np.any(caches[0].k != 0) and not np.array_equal(fused[..., :dims], q[..., :dims])
    np.testing.assert_array_equal(fused[..., dims:], q[..., dims:])   # past the rotated pairs: copied


def test_layers_of_one_step_each_turn_by_their_own_rotation():
    """rope_kv_store keeps a step's table with its layout for the next layer: a layer of another
    base or other factors in the same step (Gemma 3's local and global layers) turns by its own."""
    rng = np.random.default_rng(3)
    b = NumpyBackend("quantized")
    slots, pos = np.array([0, 2], np.int32), np.array([5, 17], np.int32)
    q = rng.standard_normal((2, 4, 32), dtype=np.float32)
    k = rng.standard_normal((2, 2, 32), dtype=np.float32)
    factors = rng.uniform(1, 4, 16).astype(np.float32)
    layout = b.batch_layout(slots, pos)
    for turn in ((32, 10000.0, 1.0, True, None, 1.0), (32, 1e6, 1.0, True, None, 1.0),
                 (32, 1e6, 1.0, True, factors, 1.0), (32, 1e6, 0.25, True, factors, 1.0), (32, 1e6, 1.0, True, None, 1.0)):
        cache = b.kv_cache(3, 32, 2, 32, 32, "f32", "f32")
        fused = b.rope_kv_store(cache, q, k, k, layout, *turn)
        alone = NumpyBackend("quantized")   # nothing kept from another rotation
        np.testing.assert_array_equal(fused, alone.rope(q, pos, *turn))
        np.testing.assert_array_equal(cache.k[slots, :, pos], alone.rope(k, pos, *turn))
