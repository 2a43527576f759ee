"""The KV cache and attention over it, for a batch of runs from several cache slots.

A layer's cache holds keys and values as (n_slots, n_kv, n_ctx, row bytes) in f32, f16, q8_0,
q4_0 or iq4_nl rows (kv_cache.cuh), or, paged, as (n_blocks, n_kv, block_size, row bytes) that slots reach
through device block tables (kv_where in kv_cache.cuh), which the kernels read as they run. Attention has two paths. Runs of up to FUSED_MAX_TOKENS queries (decode rows,
short chunks) use the fused kernel, which streams each query's cached rows once in their stored
type, all such runs of a batch in one launch; where the cache holds many positions a slot
(split_chunks) that launch splits each query's keys into chunks over many blocks and merges their partial softmaxes
(flash-decoding, attention_split.cu + attention_combine.cu). Longer runs (prompt chunks) gather their slot's
cached rows to float32 and use two batched GEMMs around the softmax_lengths kernel: there each
cached row serves hundreds of queries, and cuBLAS does that reuse far better than the fused
kernel's one-query-per-block loop. Each chunk of QUERY_CHUNK queries multiplies only the keys
its queries see, and runs of F16_MIN_TOKENS or more from caches not of f32 rows multiply in f16
on tensor cores (f32 sums), within the bound docs/PERF.md (section flashpre) derives. Of those,
runs of FLASH_MIN_TOKENS or more that flash_takes covers (causal, f16 or q8_0 rows, head sizes
64/128/256) take one flash-attention kernel instead (attention_flash.cu): the same f16 rounding,
with no score matrix in memory and each K/V tile read once for a block of queries of all the
heads of a KV group.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType

from llogos_cli.backends import QUERY_CHUNK, check_cache_type
from llogos_cli.backends.cuda import cuda_ops
from llogos_cli.backends.cuda.cuda_batch import Layout
from llogos_cli.backends.cuda.cuda_kernels import cdiv, check
from llogos_cli.backends.cuda.cuda_matmul import Q8_RUN, get_rows
from llogos_cli.errors import LlogosError

# The GGUF type a cache row is laid out as, for gathering rows with get_rows.
_ROW_TYPE = {"f32": QType.F32, "f16": QType.F16, "q8_0": QType.Q8_0, "q4_0": QType.Q4_0, "iq4_nl": QType.IQ4_NL}
ATTENTION_WARPS = 4      # ATTENTION_WARPS in attention.cu
MAX_HEAD_DIM = 256       # MAX_HEAD_DIM in attention.cu
FUSED_MAX_TOKENS = 16
# Split-K decode (attention_split.cu + attention_combine.cu): the fused kernel's grid of (query,
# head) blocks, each walking all its keys, is a few dozen blocks for a decode step of a small
# model, most of a large GPU idle at depth. A fused launch splits each query's keys instead into
# enough chunks for about SPLIT_BLOCKS blocks (several per SM of a 132-SM H100), no chunk shorter
# than SPLIT_MIN_KEYS keys: a chunk's partial (dv floats a head) is then small beside the rows it
# reads, and a shallow query takes one chunk, as many blocks as the fused kernel's groups. Whether
# to split is fixed by the cache's positions per slot, not by the depth, so that a captured decode
# step replays at any depth (cuda_batch): a cache of fewer than SPLIT_MIN_POSITIONS positions a
# slot never splits. That bound is not measured yet: below it a query has at most 4 chunks, and
# the split costs a launch; bench_longctx's split and unsplit decode are the figures to set it by.
SPLIT_MIN_POSITIONS = 1024
SPLIT_BLOCKS = 512
SPLIT_WARPS = 4          # SPLIT_WARPS in attention_split.cu
SPLIT_MIN_KEYS = 256
SPLIT_MAX_GROUP = 8      # MAX_GROUP in attention_split.cu: query heads a block holds
SPLIT_MAX_CHUNKS = 256   # MAX_CHUNKS in attention_combine.cu
# Prompt runs of this many queries or more multiply in f16 on tensor cores (_products_f16), the
# scores and the weighted values alike; shorter ones keep float32 GEMMs, within the NumPy backend's
# rounding. Not measured yet: bench_longctx's prefill at 8192 is the figure to set it by.
F16_MIN_TOKENS = 512
# Flash attention (attention_flash.cu): prompt runs of FLASH_MIN_TOKENS queries or more take one
# fused kernel, both products on f16 tensor cores and no score matrix in memory, where
# flash_takes says it covers the run (else the GEMM path). It rounds as the f16 GEMM path does, so
# it starts where that one does; bench_longctx --attention gemm times the GEMM path beside it.
FLASH_MIN_TOKENS = F16_MIN_TOKENS
FLASH_TYPES = {("f16", "f16"), ("f16", "q8_0"), ("q8_0", "f16"), ("q8_0", "q8_0")}   # attention_flash.cu's
FLASH_HEAD_DIMS = (64, 128, 256)
FLASH_WARPS = 4          # FLASH_WARPS in attention_flash.cu
FLASH_ROWS = 64          # FLASH_ROWS in attention_flash.cu: (query, head) rows a block holds
_THREADS = 256
_COMBINE_THREADS = 128   # COMBINE_THREADS in attention_combine.cu


@dataclass(slots=True)
class KVCache:
    k: Any  # device uint8 (n_slots, n_kv, n_ctx, bytes per key row)
    v: Any  # device uint8 (n_slots, n_kv, n_ctx, bytes per value row)
    type_k: str
    type_v: str
    dk: int
    dv: int
    tables: Any = None   # paged: device int32 (n_slots, max blocks per slot), shared by every layer

    def where(self, fallback) -> tuple:
        """The kernels' kv_where arguments after the cache: tables (fallback, never read, when
        unpaged), paged, max_blocks, block_size (unpaged: a slot is one block of n_ctx)."""
        block_size = np.int32(self.k.shape[2])
        if self.tables is None:
            return fallback, np.int32(0), np.int32(1), block_size
        return self.tables, np.int32(1), np.int32(self.tables.shape[1]), block_size


def paged_kv_cache(xp, tables, n_blocks: int, block_size: int, n_kv: int, dk: int, dv: int, type_k: str,
                   type_v: str) -> KVCache:
    cache = kv_cache(xp, n_blocks, block_size, n_kv, dk, dv, type_k, type_v)
    cache.tables = tables
    return cache


def kv_cache(xp, n_slots: int, n_ctx: int, n_kv: int, dk: int, dv: int, type_k: str, type_v: str) -> KVCache:
    for cache_type, d in ((type_k, dk), (type_v, dv)):
        check_cache_type(cache_type, d)
        if d % 4 or d > MAX_HEAD_DIM:
            raise LlogosError(f"the CUDA backend supports head sizes that are multiples of 4 up to {MAX_HEAD_DIM}, not {d}")
    return KVCache(xp.zeros((n_slots, n_kv, n_ctx, _row_bytes(type_k, dk)), np.uint8),
                   xp.zeros((n_slots, n_kv, n_ctx, _row_bytes(type_v, dv)), np.uint8), type_k, type_v, dk, dv)


def _row_bytes(cache_type: str, d: int) -> int:
    block_size, type_size = GGML_QUANT_SIZES[_ROW_TYPE[cache_type]]
    return d // block_size * type_size


def check_where(cache: KVCache, layout: Layout) -> None:
    """The layout's slots and positions inside the cache, as a kernel storing there needs them."""
    check(layout.slots, np.int32, "slots")
    check(layout.pos, np.int32, "pos")
    n_slots, _, n_ctx, _ = cache.k.shape
    if cache.tables is not None:
        check(cache.tables, np.int32, "block tables")
        n_slots, n_ctx = cache.tables.shape[0], cache.tables.shape[1] * n_ctx
    if layout.max_slot >= n_slots or layout.max_pos >= n_ctx:  # the kernel would write past the cache
        raise LlogosError(f"a batch writes at slot {layout.max_slot}, position {layout.max_pos}: "
                          f"outside the KV cache of {n_slots} slots x {n_ctx} positions")


def kv_store(k, cache: KVCache, keys, values, layout: Layout) -> None:
    """Write keys (T, n_kv, dk) and values (T, n_kv, dv): token t at (slots[t], pos[t]) of the layout."""
    check_where(cache, layout)
    n_kv = cache.k.shape[1]
    for x, store, cache_type, d in ((keys, cache.k, cache.type_k, cache.dk), (values, cache.v, cache.type_v, cache.dv)):
        check(x, np.float32, "keys/values")
        check(store, np.uint8, "cache")
        n_tok = x.shape[0]
        assert x.shape[1:] == (n_kv, d) and layout.slots.shape == layout.pos.shape == (n_tok,)
        per_thread = GGML_QUANT_SIZES[_ROW_TYPE[cache_type]][0]   # a thread stores a block
        k.function("kv_store", f"kv_store_{cache_type}")(
            (cdiv(x.size // per_thread, _THREADS),), (_THREADS,),
            (x, store, layout.slots, layout.pos, np.int32(n_tok), np.int32(n_kv), np.int32(d),
             *cache.where(layout.slots)))


def kv_shift(k, cache: KVCache, slot: int, src: int, n: int, delta: int, rope: tuple | None, ones) -> None:
    """Positions src..src+n-1 of slot move to src-delta.., keys turned by -delta positions with
    rope = (dims, base, freq_scale, neox, factors or None; ones: factors of 1) or only moved."""
    dims, base, freq_scale, neox, factors = rope or (0, 0.0, 1.0, False, None)
    factors = ones(max(1, dims // 2)) if factors is None else factors
    check(factors, np.float32, "factors")
    if cache.tables is not None:
        check(cache.tables, np.int32, "block tables")
    for store, cache_type, d, turn in ((cache.k, cache.type_k, cache.dk, rope is not None),
                                       (cache.v, cache.type_v, cache.dv, False)):
        check(store, np.uint8, "cache")
        n_kv = store.shape[1]
        # Chunks of at most delta positions: a launch never reads a row that it writes.
        for first in range(src, src + n, delta):
            count = min(delta, src + n - first)
            k.function("kv_shift", f"kv_shift_{cache_type}_{'neox' if neox else 'norm'}")(
                (cdiv(count * n_kv, _THREADS),), (_THREADS,),
                (store, np.int32(slot), np.int32(first), np.int32(count), np.int32(delta), np.int32(n_kv),
                 np.int32(d), np.int32(turn), np.int32(dims), np.float32(base), np.float32(freq_scale), factors,
                 *cache.where(factors)))


def split_chunks(cache: KVCache, n_tok: int, n_head: int) -> int:
    """Chunks each query's keys are split into in a fused launch of n_tok queries; 1: not split."""
    n_kv = cache.k.shape[1]
    if n_head // n_kv > SPLIT_MAX_GROUP:
        return 1
    positions = cache.k.shape[2] * (1 if cache.tables is None else cache.tables.shape[1])
    if positions < SPLIT_MIN_POSITIONS:
        return 1
    return max(1, min(cdiv(SPLIT_BLOCKS, n_tok * n_kv), positions // SPLIT_MIN_KEYS, SPLIT_MAX_CHUNKS))


def fused_only(layout: Layout) -> bool:
    """Whether the fused kernel takes every run of the batch (none long enough for the GEMM path)."""
    return all(t1 - t0 <= FUSED_MAX_TOKENS for _, t0, t1 in layout.runs)


def attention(k, q, cache: KVCache, layout: Layout, scale: float, window: int, softcap: float = 0.0, sinks=None,
              ends=None, x8=None):
    """Each query of q (T, H, dk) over its own slot's cached keys up to its position (with ends,
    device int32 (T,) of Layout.ends(): up to its run's last, not causal), scores soft-capped by
    softcap unless 0, and each head's sink (sinks (H,)) joining its softmax's denominator if
    given; -> (T, H, dv). x8: q8_buffers of (T, H * dv), filled with the output's 8-bit form on
    the way (a batch the fused kernel takes whole, fused_only; dv in whole runs)."""
    check(q, np.float32, "q")
    if sinks is not None:
        check(sinks, np.float32, "sinks")
        assert sinks.shape == (q.shape[1],)
    n_tok, n_head, dk = q.shape
    assert dk == cache.dk and n_head % cache.k.shape[1] == 0
    assert x8 is None or (fused_only(layout) and cache.dv % Q8_RUN == 0)
    out = k.xp.empty((n_tok, n_head, cache.dv), np.float32)
    for t0, t1, slot in _spans(layout.runs):
        s = slice(t0, t1)
        if slot is None:
            _fused(k, q[s], cache, layout.slots[s], (layout.pos if ends is None else ends)[s], scale, window, softcap,
                   sinks, out[s], None if x8 is None else (x8[0][s], x8[1][s]))
        elif flash_takes(cache, t1 - t0, q.shape[1], ends is None):
            _flash(k, q[s], cache, slot, int(layout.host_pos[t0]), scale, window, softcap, sinks, out[s])
        else:
            out[s] = _gemm(k, q[s], cache, slot, int(layout.host_pos[t0]), scale, window, softcap, sinks, ends is None)
    return out


def flash_takes(cache: KVCache, n_tok: int, n_head: int, causal: bool) -> bool:
    """Whether attention_flash.cu takes a prompt run of n_tok queries: causal runs of
    FLASH_MIN_TOKENS or more from caches of FLASH_TYPES, keys and values of one head size of
    FLASH_HEAD_DIMS, a KV group's heads within a block's rows. Windows, soft caps and sinks it
    takes all. Not causal (an encoder's runs) or any other cache: the GEMM path."""
    return (causal and n_tok >= FLASH_MIN_TOKENS and (cache.type_k, cache.type_v) in FLASH_TYPES
            and cache.dk == cache.dv in FLASH_HEAD_DIMS and n_head // cache.k.shape[1] <= FLASH_ROWS)


def _flash(k, q, cache: KVCache, slot: int, pos0: int, scale: float, window: int, softcap: float, sinks, out) -> None:
    """One run of q (T, H, d) at positions pos0.. of `slot` into out (T, H, d), as flash_takes allows."""
    check(q, np.float32, "q")
    check(out, np.float32, "out")
    check(cache.k, np.uint8, "key cache")
    check(cache.v, np.uint8, "value cache")
    n_tok, n_head, d = q.shape
    n_kv = cache.k.shape[1]
    per_block = FLASH_ROWS // (n_head // n_kv)   # queries a block holds, all heads of its KV group
    k.function("attention_flash", f"attention_flash_{cache.type_k}_{cache.type_v}_d{d}")(
        (cdiv(n_tok, per_block), n_kv), (FLASH_WARPS * 32,),
        (q, cache.k, cache.v, out, np.int32(slot), np.int32(pos0), np.int32(n_tok), np.int32(n_head),
         np.int32(n_kv), np.float32(scale), np.int32(window), np.float32(softcap),
         q if sinks is None else sinks, np.int32(sinks is not None),   # q: a pointer the kernel then never reads
         *cache.where(q)))   # q, likewise, unpaged


def _spans(runs) -> list[tuple[int, int, int | None]]:
    """(t0, t1, slot) of each long run, and (t0, t1, None) of consecutive short runs, which the
    fused kernel takes in one launch: a batch of decode rows is a single span."""
    spans = []
    for slot, t0, t1 in runs:
        if t1 - t0 > FUSED_MAX_TOKENS:
            spans.append((t0, t1, slot))
        elif spans and spans[-1][2] is None:
            spans[-1] = (spans[-1][0], t1, None)
        else:
            spans.append((t0, t1, None))
    return spans


def _fused(k, q, cache: KVCache, slots, pos, scale: float, window: int, softcap: float, sinks, out, x8) -> None:
    if x8 is not None:
        check(x8[0], np.int8, "xq")
        check(x8[1], np.float32, "xs")
    check(slots, np.int32, "slots")
    check(pos, np.int32, "pos")
    check(cache.k, np.uint8, "key cache")
    check(cache.v, np.uint8, "value cache")
    check(out, np.float32, "out")
    n_tok, n_head, dk = q.shape
    n_kv = cache.k.shape[1]
    n_chunks = split_chunks(cache, n_tok, n_head)
    if n_chunks > 1:
        _split(k, q, cache, slots, pos, scale, window, softcap, sinks, out, x8, n_chunks)
        return
    k.function("attention", f"attention_{cache.type_k}_{cache.type_v}")(
        (n_head, n_tok), (ATTENTION_WARPS * 32,),
        (q, cache.k, cache.v, out, slots, pos, np.int32(n_head), np.int32(n_kv), np.int32(dk),
         np.int32(cache.dv), np.float32(scale), np.int32(window), np.float32(softcap),
         q if sinks is None else sinks, np.int32(sinks is not None),   # q: a pointer the kernel then never reads
         *((out, out) if x8 is None else x8), np.int32(x8 is not None),  # out, likewise
         *cache.where(slots)))


def _split(k, q, cache: KVCache, slots, pos, scale: float, window: int, softcap: float, sinks, out, x8,
           n_chunks: int) -> None:
    """The fused launch's work split along the keys: each chunk's partial softmax per head, then
    their merge (attention_split.cu, attention_combine.cu)."""
    n_tok, n_head, dk = q.shape
    n_kv = cache.k.shape[1]
    part_ml = k.xp.empty((n_tok, n_head, n_chunks, 2), np.float32)
    part_acc = k.xp.empty((n_tok, n_head, n_chunks, cache.dv), np.float32)
    k.function("attention_split", f"attention_split_{cache.type_k}_{cache.type_v}")(
        (n_kv, n_chunks, n_tok), (SPLIT_WARPS * 32,),
        (q, cache.k, cache.v, part_ml, part_acc, slots, pos, np.int32(n_head), np.int32(n_kv), np.int32(dk),
         np.int32(cache.dv), np.float32(scale), np.int32(window), np.float32(softcap), np.int32(SPLIT_MIN_KEYS),
         *cache.where(slots)))
    k.function("attention_combine", "attention_combine")(
        (n_head, n_tok), (_COMBINE_THREADS,),
        (part_ml, part_acc, out, np.int32(n_head), np.int32(n_chunks), np.int32(cache.dv),
         q if sinks is None else sinks, np.int32(sinks is not None),
         *((out, out) if x8 is None else x8), np.int32(x8 is not None)))


def _gemm(k, q, cache: KVCache, slot: int, pos0: int, scale: float, window: int, softcap: float, sinks,
          causal: bool = True):
    """One run of q (T, H, dk) at positions pos0.. of `slot`, each query up to its own position
    or (not causal) up to the run's last; -> (T, H, dv). Each chunk of QUERY_CHUNK queries
    multiplies only the keys one of its queries sees (causal: none past its last query; window:
    none before its first query's window), and a run of F16_MIN_TOKENS or more from a cache not
    of f32 rows multiplies in f16 on tensor cores (_products_f16)."""
    xp = k.xp
    n_tok, n_head, dk = q.shape
    _, n_kv, span, _ = cache.k.shape   # positions per block (unpaged: a slot is one block of n_ctx)
    group = n_head // n_kv
    # Keys from the first one the run's first query sees (all of them without a window).
    end = pos0 + n_tok
    start = max(0, (pos0 + 1 if causal else end) - window) if window else 0
    n = end - start
    positions = np.arange(start, end, dtype=np.int32)
    if cache.tables is None:
        first, at = np.full(n, slot, np.int32), positions
    else:   # the slot's blocks, read back from the device: a prompt chunk's launches are not captured
        first, at = k.to_host(cache.tables[slot])[positions // span], positions % span
    rows = (first[None, :] * n_kv + np.arange(n_kv, dtype=np.int32)[:, None]) * span + at[None, :]   # (n_kv, n)
    ids = xp.asarray(rows.ravel().astype(np.int32))
    keys = get_rows(k, cache.k.reshape(-1, cache.k.shape[3]), _ROW_TYPE[cache.type_k], ids).reshape(n_kv, n, dk)
    values = get_rows(k, cache.v.reshape(-1, cache.v.shape[3]), _ROW_TYPE[cache.type_v], ids).reshape(n_kv, n, cache.dv)
    f16 = uses_f16(cache, n_tok)
    if f16:
        keys, values = keys.astype(np.float16), values.astype(np.float16)
    out = xp.empty((n_tok, n_head, cache.dv), np.float32)
    for t0 in range(0, n_tok, QUERY_CHUNK):
        t1 = min(n_tok, t0 + QUERY_CHUNK)
        # The keys [a, b) (counted from `start`) that some query of the chunk sees.
        a = max(0, pos0 + t0 + 1 - window - start) if window and causal else 0
        b = pos0 + t1 - start if causal else n
        qc = q[t0:t1].reshape(t1 - t0, n_kv, group, dk).transpose(1, 2, 0, 3).reshape(n_kv, group * (t1 - t0), dk)
        # Query t sees the keys before pos0 + t + 1 (not causal: all of them), counted from `a`.
        seen = (np.arange(pos0 + t0 + 1 - start - a, pos0 + t1 + 1 - start - a, dtype=np.int32) if causal
                else np.full(t1 - t0, b - a, np.int32))
        lengths = xp.asarray(np.tile(seen, n_kv * group))
        if f16:
            o = _products_f16(k, qc, keys[:, a:b], values[:, a:b], lengths, window, scale, softcap, sinks)
        else:
            scores = xp.matmul(qc, keys[:, a:b].transpose(0, 2, 1))                 # (kv, g*t, b-a)
            probs = cuda_ops.softmax_lengths(k, scores, lengths, window, scale, softcap, sinks)  # rows by head
            o = xp.matmul(probs, values[:, a:b])                                    # (kv, g*t, dv)
        out[t0:t1] = o.reshape(n_kv, group, t1 - t0, cache.dv).transpose(2, 0, 1, 3).reshape(t1 - t0, n_head, -1)
    return out


def uses_f16(cache: KVCache, n_tok: int) -> bool:
    """Whether a prompt run of n_tok queries takes f16 tensor-core products (_products_f16): runs
    of F16_MIN_TOKENS or more, from caches of f16 or quantized rows (an f32 cache asks for float32
    attention, and may hold values past f16's range)."""
    return n_tok >= F16_MIN_TOKENS and "f32" not in (cache.type_k, cache.type_v)


def _products_f16(k, qc, keys, values, lengths, window: int, scale: float, softcap: float, sinks):
    """The chunk's attention with both products in f16 on tensor cores (gemm_f16: f16 inputs,
    float32 sums): qc (kv, R, dk) float32 queries, keys (kv, n, dk) and values (kv, n, dv)
    float16; -> (kv, R, dv). The queries are scaled before rounding, further from f16's largest
    value (65504, which queries and cached rows are taken to stay within, as llama.cpp's f16
    attention takes them). Error bound: docs/PERF.md, section flashpre."""
    xp = k.xp
    n_kv, n_rows, _ = qc.shape
    n, dv = keys.shape[1], values.shape[2]
    q16 = (qc * np.float32(scale)).astype(np.float16, order="C")   # qc: a strided view of q where a group is one head
    scores = xp.empty((n_kv, n_rows, n), np.float32)
    for h in range(n_kv):
        k.gemm_f16(q16[h], xp.ascontiguousarray(keys[h]), scores[h])
    probs = cuda_ops.softmax_lengths(k, scores, lengths, window, 1.0, softcap, sinks)
    del scores   # at most the float32 path's 8 bytes a score held at once: probabilities in f32, then f16
    probs = probs.astype(np.float16)
    values_t = xp.ascontiguousarray(values.transpose(0, 2, 1))   # (kv, dv, n): gemm_f16's b
    o = xp.empty((n_kv, n_rows, dv), np.float32)
    for h in range(n_kv):
        k.gemm_f16(probs[h], values_t[h], o[h])
    return o
