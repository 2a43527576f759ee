"""Launcher of rope_store.cu: the queries and keys of a batch turned by RoPE and the keys and values
stored into a layer's KV cache in one launch, where rope and kv_store took four (the launch budget,
bench/launch_budget.py), for every pair of cache types."""

import numpy as np

from llogos_cli.backends import CACHE_BLOCKS
from llogos_cli.backends.cuda.cuda_attention import KVCache, check_where
from llogos_cli.backends.cuda.cuda_batch import Layout
from llogos_cli.backends.cuda.cuda_kernels import cdiv, check

_THREADS = 256


def rope_kv_store(k, cache: KVCache, q, keys, values, layout: Layout, factors, dims: int, base: float,
                  freq_scale: float, neox: bool, attn_factor: float = 1.0):
    """q (T, H, dk) and keys (T, n_kv, dk) turned at the layout's positions as cuda_ops.rope turns
    them; the keys and values (T, n_kv, dv) stored as kv_store stores them; -> the turned q."""
    check_where(cache, layout)
    for x, name in ((q, "q"), (keys, "keys"), (values, "values"), (factors, "factors")):
        check(x, np.float32, name)
    for store in (cache.k, cache.v):
        check(store, np.uint8, "cache")
    n_tok, n_head, dk = q.shape
    n_kv = cache.k.shape[1]
    assert keys.shape == (n_tok, n_kv, cache.dk) and values.shape == (n_tok, n_kv, cache.dv) and dk == cache.dk
    assert layout.pos.shape == (n_tok,) and dims % 2 == 0 and dims <= dk and factors.shape == (dims // 2,)
    # A thread a query feature, or a block of a key or value row (each type's QK in kv_cache.cuh).
    k_unit, v_unit = CACHE_BLOCKS.get(cache.type_k, 1), CACHE_BLOCKS.get(cache.type_v, 1)
    units = n_tok * (n_head * dk + n_kv * (dk // k_unit + cache.dv // v_unit))
    out = k.xp.empty_like(q)
    k.function("rope_store", f"rope_store_{'neox' if neox else 'norm'}_{cache.type_k}_{cache.type_v}")(
        (cdiv(units, _THREADS),), (_THREADS,),
        (q, keys, values, out, cache.k, cache.v, layout.slots, layout.pos, factors, np.int32(n_tok), np.int32(n_head),
         np.int32(n_kv), np.int32(dk), np.int32(cache.dv), np.int32(dims), np.float32(base), np.float32(freq_scale),
         np.float32(attn_factor), *cache.where(layout.slots)))
    return out
