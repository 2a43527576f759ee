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

from llogos_cli.backends.cpu.cpu_jit import exp32, kernel, parallel_kernel, prange, share_out
from llogos_cli.backends.cpu.cpu_simd_attention import (HEAD_MULTIPLE, KEYS, cached_key_scores, cached_value_sums,
                                                        key_scores, value_sums)

TILE = 32         # prompt positions of one item: with a group's heads, the queries sharing each chunk
CHUNK = 4 * KEYS  # key positions of one chunk: its keys and values (16 KiB each at head size 64) fit L1
# Below any score: where a query has seen nothing yet (fastmath assumes no infinities).
_LOWEST = np.float32(-3.0e38)


def attend(q, k, v, blocks, last, items, scale, window, softcap, sinks, out):
    """_attend, its items handed out one at a time as threads come free."""
    share_out(items.shape[0])
    _attend(q, k, v, blocks, last, items, scale, window, softcap, sinks, out)


@parallel_kernel
def _attend(q, k, v, blocks, last, items, scale, window, softcap, sinks, out):
    """q (T, H, dk): item i is the tokens items[i, 0] to items[i, 1] (consecutive positions of one
    slot, so that the first's block table serves them all) with heads items[i, 2] to items[i, 3] (of
    one KV group). Token t attends its keys at positions [max(0, last[t] + 1 - window), last[t] + 1)
    (window 0: from 0). Position p of token t lies at offset p % B of first index blocks[t, p // B] of
    k (N, n_kv, B, dk) and v (N, n_kv, B, dv), float32. Scores s = scale q·k become
    softcap * tanh(s / softcap) unless softcap is 0; sinks (H,), or none, join each softmax's
    denominator as one more logit. -> out (T, H, dv). KEYS positions at a time in vector registers
    (cpu_simd_attention), the rest one by one."""
    H, dk = q.shape[1], q.shape[2]
    n_kv, B, dv = k.shape[1], k.shape[2], v.shape[3]
    group = H // n_kv
    wide = dk % HEAD_MULTIPLE == 0 and dv % HEAD_MULTIPLE == 0
    for item in prange(items.shape[0]):
        t0, t1, h0, h1 = items[item, 0], items[item, 1], items[item, 2], items[item, 3]
        g, heads = h0 // group, h1 - h0
        n_q = (t1 - t0) * heads                      # query m: token t0 + m // heads, head h0 + m % heads
        # One query reads each chunk once, from memory: ask for the next rows ahead. Many read it
        # again from L1, where asking only spends instructions. The sums are the same either way.
        streamed = n_q == 1
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
        j0 = firsts.min()
        j0 -= j0 % CHUNK                             # the chunk that holds it
        end = np.int64(last[t0:t1].max()) + 1
        while j0 < end:
            j1 = min(j0 + CHUNK, end)                # a chunk may span blocks of the cache: read block by block
            for m in range(n_q):
                t = t0 + m // heads
                a, b = max(j0, firsts[t - t0]), min(j1, np.int64(last[t]) + 1)
                if a >= b:
                    continue
                s0 = a
                while s0 < b:
                    block = s0 // B
                    s1 = min(b, (block + 1) * B)
                    row0 = (np.int64(blocks[t0, block]) * n_kv + g) * B - block * B   # flat row of position 0
                    j = s0
                    while wide and j + KEYS <= s1:
                        if streamed:
                            key_scores(k, (row0 + j) * dk, qs[m], scores, j - a)
                        else:
                            cached_key_scores(k, (row0 + j) * dk, qs[m], scores, j - a)
                        j += KEYS
                    for j in range(j, s1):
                        key = k[blocks[t0, block], g, j - block * B]
                        s = np.float32(0)
                        for i in range(dk):
                            s += qs[m, i] * key[i]
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
                    block = s0 // B
                    s1 = min(b, (block + 1) * B)
                    row0 = (np.int64(blocks[t0, block]) * n_kv + g) * B - block * B
                    j = s0
                    while wide and j + KEYS <= s1:
                        if streamed:
                            value_sums(v, (row0 + j) * dv, scores, j - a, acc[m])
                        else:
                            cached_value_sums(v, (row0 + j) * dv, scores, j - a, acc[m])
                        j += KEYS
                    for j in range(j, s1):
                        p, value = scores[j - a], v[blocks[t0, block], g, j - block * B]
                        for i in range(dv):
                            acc[m, i] += p * value[i]
                    s0 = s1
            j0 = j1
        for m in range(n_q):
            t, h = t0 + m // heads, h0 + m % heads
            for i in range(dv):
                out[t, h, i] = acc[m, i] / total[m]


@kernel
def store_rows(k, v, firsts, ats, k_cache, v_cache):
    """k (T, n_kv, dk) and v (T, n_kv, dv) float32 into the float32 caches at (firsts[t], head, ats[t])."""
    for t in range(k.shape[0]):
        for g in range(k.shape[1]):
            k_cache[firsts[t], g, ats[t], :] = k[t, g]
            v_cache[firsts[t], g, ats[t], :] = v[t, g]
