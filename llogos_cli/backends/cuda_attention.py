"""The KV cache and attention over it.

A layer's cache holds keys and values as (n_kv, n_ctx, row bytes) in f32, f16 or q8_0 rows
(kv_cache.cuh). Attention has two paths. Up to FUSED_MAX_TOKENS queries (decode, short batches)
use the fused kernel, which streams the cached rows once in their stored type. Longer prompts
gather the cached rows to float32 and use two batched GEMMs around the softmax_lengths kernel:
there each cached row serves hundreds of queries, and cuBLAS does that reuse far better than the
fused kernel's one-query-per-block loop.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from llogos_cli.backends import check_cache_type, cuda_ops
from llogos_cli.backends.cuda_kernels import cdiv, check
from llogos_cli.backends.cuda_matmul import get_rows
from llogos_cli.errors import LlogosError

# The GGUF type a cache row is laid out as, for gathering rows with get_rows.
_ROW_TYPE = {"f32": T.F32, "f16": T.F16, "q8_0": T.Q8_0}
ATTENTION_WARPS = 4      # ATTENTION_WARPS in attention.cu
MAX_HEAD_DIM = 256       # MAX_HEAD_DIM in attention.cu
FUSED_MAX_TOKENS = 16
_QUERY_CHUNK = 256       # queries per GEMM round, bounding the score matrix
_THREADS = 256


@dataclass(slots=True)
class KVCache:
    k: Any  # device uint8 (n_kv, n_ctx, bytes per key row)
    v: Any  # device uint8 (n_kv, n_ctx, bytes per value row)
    type_k: str
    type_v: str
    dk: int
    dv: int


def kv_cache(xp, n_ctx: int, n_kv: int, dk: int, dv: int, type_k: str, type_v: str) -> KVCache:
    for cache_type, d in ((type_k, dk), (type_v, dv)):
        check_cache_type(cache_type, d)
        if d % 4 or d > MAX_HEAD_DIM:
            raise LlogosError(f"the CUDA backend supports head sizes that are multiples of 4 up to {MAX_HEAD_DIM}, not {d}")
    return KVCache(xp.zeros((n_kv, n_ctx, _row_bytes(type_k, dk)), np.uint8),
                   xp.zeros((n_kv, n_ctx, _row_bytes(type_v, dv)), np.uint8), type_k, type_v, dk, dv)


def _row_bytes(cache_type: str, d: int) -> int:
    block_size, type_size = GGML_QUANT_SIZES[_ROW_TYPE[cache_type]]
    return d // block_size * type_size


def kv_store(k, cache: KVCache, keys, values, pos) -> None:
    """Write keys (T, n_kv, dk) and values (T, n_kv, dv) at positions pos (device int32, T)."""
    check(pos, np.int32, "pos")
    for x, store, cache_type, d in ((keys, cache.k, cache.type_k, cache.dk), (values, cache.v, cache.type_v, cache.dv)):
        check(x, np.float32, "keys/values")
        check(store, np.uint8, "cache")
        n_tok, n_kv, _ = x.shape
        assert x.shape[1:] == (store.shape[0], d) and pos.shape == (n_tok,)
        per_thread = 32 if cache_type == "q8_0" else 1
        k.function("kv_store", f"kv_store_{cache_type}")(
            (cdiv(x.size // per_thread, _THREADS),), (_THREADS,),
            (x, store, pos, np.int32(n_tok), np.int32(n_kv), np.int32(d), np.int32(store.shape[1])))


def attention(k, q, cache: KVCache, pos0: int, pos, scale: float, window: int):
    """Causal attention of q (T, H, dk) at positions pos0.. (also on the device as pos) over the
    cache; -> (T, H, dv)."""
    check(q, np.float32, "q")
    n_tok, n_head, dk = q.shape
    n_kv = cache.k.shape[0]
    assert dk == cache.dk and n_head % n_kv == 0 and pos0 + n_tok <= cache.k.shape[1]
    if n_tok <= FUSED_MAX_TOKENS:
        return _fused(k, q, cache, pos, scale, window)
    return _gemm(k, q, cache, pos0, scale, window)


def _fused(k, q, cache: KVCache, pos, scale: float, window: int):
    check(pos, np.int32, "pos")
    check(cache.k, np.uint8, "key cache")
    check(cache.v, np.uint8, "value cache")
    n_tok, n_head, dk = q.shape
    out = k.xp.empty((n_tok, n_head, cache.dv), np.float32)
    k.function("attention", f"attention_{cache.type_k}_{cache.type_v}")(
        (n_head, n_tok), (ATTENTION_WARPS * 32,),
        (q, cache.k, cache.v, out, pos, np.int32(n_head), np.int32(cache.k.shape[0]), np.int32(dk),
         np.int32(cache.dv), np.int32(cache.k.shape[1]), np.float32(scale), np.int32(window)))
    return out


def _gemm(k, q, cache: KVCache, pos0: int, scale: float, window: int):
    xp = k.xp
    n_tok, n_head, dk = q.shape
    n_kv, n_ctx, _ = cache.k.shape
    group, n = n_head // n_kv, pos0 + n_tok
    ids = xp.asarray((np.arange(n_kv, dtype=np.int32)[:, None] * n_ctx + np.arange(n, dtype=np.int32)).ravel())
    keys = get_rows(k, cache.k.reshape(n_kv * n_ctx, -1), _ROW_TYPE[cache.type_k], ids).reshape(n_kv, n, dk)
    values = get_rows(k, cache.v.reshape(n_kv * n_ctx, -1), _ROW_TYPE[cache.type_v], ids).reshape(n_kv, n, cache.dv)
    out = xp.empty((n_tok, n_head, cache.dv), np.float32)
    for t0 in range(0, n_tok, _QUERY_CHUNK):
        t1 = min(n_tok, t0 + _QUERY_CHUNK)
        qc = q[t0:t1].reshape(t1 - t0, n_kv, group, dk).transpose(1, 2, 0, 3).reshape(n_kv, group * (t1 - t0), dk)
        scores = xp.matmul(qc, keys.transpose(0, 2, 1))                       # (kv, g*t, n)
        lengths = np.tile(np.arange(pos0 + t0 + 1, pos0 + t1 + 1, dtype=np.int32), n_kv * group)
        probs = cuda_ops.softmax_lengths(k, scores, xp.asarray(lengths), window, scale)
        o = xp.matmul(probs, values)                                           # (kv, g*t, dv)
        out[t0:t1] = o.reshape(n_kv, group, t1 - t0, cache.dv).transpose(2, 0, 1, 3).reshape(t1 - t0, n_head, -1)
    return out
