"""Attention as one compiled loop (the CPU paths that have numba loaded), flash-style: a work item
is a group of queries of one KV group (a tile of a prompt's consecutive positions with all of the
group's heads, or one head of one decode row), read against its keys and values a chunk of CHUNK
positions at a time, each chunk read from memory once for all of the item's queries and used while
it is in the first-level cache. A row's heads read keys and values where the cache holds them,
unpaged or through a block table, with no gathered copy. The (token, head) loop this replaced read a
prompt token's keys and values again for every head and every later token: at a few thousand
positions those are megabytes a layer, more than the second-level cache holds (docs/PERF.md).

The softmax is online: each query keeps the largest score so far, the sum of its exponentials and
the probability-weighted sum of values, rescaled when a later chunk brings a larger score. Chunks
lie at fixed positions (multiples of CHUNK, counted from position 0; one may span blocks of a paged
cache, read block by block),
and each query's sums run over them in order whatever item it is in, so that a token's result does
not depend on how its prompt was cut into steps: one step, several, a prefix-cache hit or a token at
a time give the same bits, where one rounding apart in a layer grows past the 8-bit activations of
the products into logits 0.1-0.4 apart. A query's chunks past its own position (the causal mask) are
never read, nor those before its window.
"""

import numpy as np
from numba import types
from numba.extending import overload

from llogos_cli.backends.cpu.cpu_jit import exp32, f16_at, kernel, parallel_kernel, prange, share_out
from llogos_cli.backends.cpu.cpu_simd_attention import (HEAD_MULTIPLE, KEYS, as_float, cached_key_scores,
                                                        cached_value_sums, half_bits, key_scores, value_sums)
from llogos_cli.backends.cpu.kv_quant import BLOCK, BLOCK_BYTES

TILE = 32         # prompt positions of one item: with a group's heads, the queries sharing each chunk
CHUNK = 4 * KEYS  # key positions of one chunk: its keys and values (16 KiB each at head size 64) fit L1
# Below any score: where a query has seen nothing yet (fastmath assumes no infinities).
_LOWEST = np.float32(-3.0e38)


def attend(q, k, v, levels_k, levels_v, blocks, last, items, scale, window, softcap, sinks, out):
    """_attend, its items handed out one at a time as threads come free."""
    share_out(items.shape[0])
    _attend(q, k, v, levels_k, levels_v, blocks, last, items, scale, window, softcap, sinks, out)


@parallel_kernel
def _attend(q, k, v, levels_k, levels_v, blocks, last, items, scale, window, softcap, sinks, out):
    """q (T, H, dk): item i is the tokens items[i, 0] to items[i, 1] (consecutive positions of one
    slot, so that the first's block table serves them all) with heads items[i, 2] to items[i, 3] (of
    one KV group). Token t attends its keys at positions [max(0, last[t] + 1 - window), last[t] + 1)
    (window 0: from 0). Position p of token t lies at offset p % B of first index blocks[t, p // B] of
    k (N, n_kv, B, dk) and v (N, n_kv, B, dv): float32, float16 as uint16 bit patterns, or rows of
    4-bit blocks (uint8, kv_quant's layout) whose nibble n means levels_k[n] (levels_v[n]) times the
    block's scale, decoded a chunk at a time into float32 scratch. Scores s = scale q·k become
    softcap * tanh(s / softcap) unless softcap is 0; sinks (H,), or none, join each softmax's
    denominator as one more logit. -> out (T, H, dv). KEYS positions at a time in vector registers
    (cpu_simd_attention), the rest one by one."""
    H, dk, dv = q.shape[1], q.shape[2], out.shape[2]
    n_kv, B = k.shape[1], k.shape[2]
    group = H // n_kv
    wide = dk % HEAD_MULTIPLE == 0 and dv % HEAD_MULTIPLE == 0
    for item in prange(items.shape[0]):
        t0, t1, h0, h1 = items[item, 0], items[item, 1], items[item, 2], items[item, 3]
        g, heads = h0 // group, h1 - h0
        n_q = (t1 - t0) * heads                      # query m: token t0 + m // heads, head h0 + m % heads
        # One query reads each chunk once, from memory: ask for the next rows ahead. Many read it
        # again from L1, where asking only spends instructions, as does a decoded chunk. The sums
        # are the same either way.
        streamed_k, streamed_v = n_q == 1 and not _packed(k), n_q == 1 and not _packed(v)
        qs = np.empty((n_q, dk), np.float32)
        top = np.empty(n_q, np.float32)              # the largest score so far
        total = np.empty(n_q, np.float32)            # Σ exp(score - top)
        acc = np.zeros((n_q, dv), np.float32)        # Σ exp(score - top) · value
        firsts = np.empty(t1 - t0, np.int64)
        for m in range(n_q):
            t, h = t0 + m // heads, h0 + m % heads
            for i in range(dk):
                qs[m, i] = q[t, h, i] * np.float32(scale)
            # A sink is one more logit whose value is nothing: it starts the sums.
            top[m] = sinks[h] if sinks.size else _LOWEST
            total[m] = np.float32(1) if sinks.size else np.float32(0)
        for t in range(t0, t1):
            firsts[t - t0] = max(np.int64(0), np.int64(last[t]) + 1 - window) if window > 0 else np.int64(0)
        scores = np.empty(CHUNK, np.float32)
        scratch_k, scratch_v = _scratch(k, dk), _scratch(v, dv)
        keys, values = _flat(k, scratch_k), _flat(v, scratch_v)   # what the rows' flat indices index
        first = firsts.min()
        j0 = first - first % CHUNK                   # the chunk that holds it
        end = np.int64(last[t0:t1].max()) + 1
        while j0 < end:
            j1 = min(j0 + CHUNK, end)                # a chunk may span blocks of the cache: read block by block
            lo = max(j0, first)                      # the first position any query reads in it
            _decode(k, levels_k, blocks, t0, g, lo, j1, dk, scratch_k)
            _decode(v, levels_v, blocks, t0, g, lo, j1, dv, scratch_v)
            for m in range(n_q):
                t = t0 + m // heads
                a, b = max(j0, firsts[t - t0]), min(j1, np.int64(last[t]) + 1)
                if a >= b:
                    continue
                s0 = a
                while s0 < b:
                    s1 = min(b, (s0 // B + 1) * B)
                    row = _row(k, blocks, t0, g, s0, lo, dk)   # position s0's; the next ones follow to s1
                    j = s0
                    while wide and j + KEYS <= s1:
                        if streamed_k:
                            key_scores(keys, row + (j - s0) * dk, qs[m], scores, j - a)
                        else:
                            cached_key_scores(keys, row + (j - s0) * dk, qs[m], scores, j - a)
                        j += KEYS
                    for j in range(j, s1):
                        at = row + (j - s0) * dk
                        s = np.float32(0)
                        for i in range(dk):
                            s += qs[m, i] * as_float(keys[at + i])
                        scores[j - a] = s
                    s0 = s1
                n = b - a
                if softcap != 0:
                    for j in range(n):
                        scores[j] = np.float32(softcap) * np.tanh(scores[j] / np.float32(softcap))
                high = top[m]
                for j in range(n):
                    high = max(high, scores[j])
                if high > top[m]:
                    shrink = exp32(top[m] - high)
                    total[m] *= shrink
                    for i in range(dv):
                        acc[m, i] *= shrink
                    top[m] = high
                added = np.float32(0)
                for j in range(n):
                    scores[j] = exp32(scores[j] - high)
                    added += scores[j]
                total[m] += added
                s0 = a
                while s0 < b:
                    s1 = min(b, (s0 // B + 1) * B)
                    row = _row(v, blocks, t0, g, s0, lo, dv)
                    j = s0
                    while wide and j + KEYS <= s1:
                        if streamed_v:
                            value_sums(values, row + (j - s0) * dv, scores, j - a, acc[m])
                        else:
                            cached_value_sums(values, row + (j - s0) * dv, scores, j - a, acc[m])
                        j += KEYS
                    for j in range(j, s1):
                        p, at = scores[j - a], row + (j - s0) * dv
                        for i in range(dv):
                            acc[m, i] += p * as_float(values[at + i])
                    s0 = s1
            j0 = j1
        for m in range(n_q):
            t, h = t0 + m // heads, h0 + m % heads
            for i in range(dv):
                out[t, h, i] = acc[m, i] / total[m]


# ------------------------------------------------------------------ what each cache type reads as
# The kernel above compiled once per pair of cache arrays' types; these choose, by the type, how a
# row is found and read. A float cache is read where it lies; a packed one (uint8 rows of 4-bit
# blocks) is decoded a chunk at a time into scratch, whose row r is the chunk's position lo + r.
def _packed(cache):
    """Whether the cache holds packed 4-bit rows."""


def _scratch(cache, d):
    """Room for a chunk of decoded rows of d elements (none for a float cache)."""


def _flat(cache, scratch):
    """The one-dimensional array that rows are read from: the cache, or the scratch it is decoded into."""


def _row(cache, blocks, t0, g, j, lo, d):
    """The flat index in _flat(cache, ...) of the row of position j of KV group g (token t0's table)."""


def _decode(cache, levels, blocks, t0, g, lo, hi, d, scratch):
    """A packed cache's rows of positions [lo, hi) of group g, decoded into scratch rows 0, 1, ...:
    element i of a block is its f16 scale times levels[nibble], as kv_quant.dequantize has it."""


def _is_packed(cache) -> bool:
    return cache.dtype == types.uint8


@overload(_packed, inline="always")
def _packed_impl(cache):
    packed = _is_packed(cache)
    return lambda cache: packed


@overload(_scratch, inline="always")
def _scratch_impl(cache, d):
    if _is_packed(cache):
        return lambda cache, d: np.empty(CHUNK * d, np.float32)
    return lambda cache, d: np.empty(0, np.float32)


@overload(_flat, inline="always")
def _flat_impl(cache, scratch):
    if _is_packed(cache):
        return lambda cache, scratch: scratch
    return lambda cache, scratch: cache.reshape(cache.size)


@overload(_row, inline="always")
def _row_impl(cache, blocks, t0, g, j, lo, d):
    if _is_packed(cache):
        return lambda cache, blocks, t0, g, j, lo, d: (j - lo) * d
    def row(cache, blocks, t0, g, j, lo, d):
        B = cache.shape[2]
        return ((np.int64(blocks[t0, j // B]) * cache.shape[1] + g) * B + j % B) * d
    return row


@overload(_decode, inline="always")
def _decode_impl(cache, levels, blocks, t0, g, lo, hi, d, scratch):
    if not _is_packed(cache):
        return lambda cache, levels, blocks, t0, g, lo, hi, d, scratch: None

    def decode(cache, levels, blocks, t0, g, lo, hi, d, scratch):
        B, half = cache.shape[2], BLOCK // 2
        linear = levels[0] == np.float32(-8)   # q4_0's n - 8: arithmetic that vectorizes, where a table does not
        for j in range(lo, hi):
            packed, o = cache[blocks[t0, j // B], g, j % B], (j - lo) * d
            for blk in range(d // BLOCK):
                at, scale, out = blk * BLOCK_BYTES + 2, f16_at(packed, blk * BLOCK_BYTES), o + blk * BLOCK
                if linear:
                    for i in range(half):
                        byte = np.int32(packed[at + i])
                        scratch[out + i] = scale * np.float32((byte & 15) - 8)
                        scratch[out + half + i] = scale * np.float32((byte >> 4) - 8)
                else:
                    for i in range(half):
                        byte = packed[at + i]
                        scratch[out + i] = scale * levels[byte & 15]
                        scratch[out + half + i] = scale * levels[byte >> 4]
    return decode


def put_row(x, row):
    """Row x (float32) into a cache's row: float32, or float16 as uint16 bit patterns."""


@overload(put_row, inline="always")
def _put_impl(x, row):
    if row.dtype == types.float32:
        def copy(x, row):
            row[:] = x
        return copy

    def narrow(x, row):
        for i in range(x.shape[0]):
            row[i] = half_bits(x[i])
    return narrow


@kernel
def store_rows(k, v, firsts, ats, k_cache, v_cache):
    """k (T, n_kv, dk) and v (T, n_kv, dv) float32 into the float32 or float16 (uint16) caches at
    (firsts[t], head, ats[t])."""
    for t in range(k.shape[0]):
        for g in range(k.shape[1]):
            put_row(k[t, g], k_cache[firsts[t], g, ats[t]])
            put_row(v[t, g], v_cache[firsts[t], g, ats[t]])
