"""A prompt's attention a tile at a time (flash-style): the queries of TILE consecutive positions of
one run and every query head of one KV group against the run's keys, CHUNK positions of keys and
values at a time, each chunk read from memory once for all of the tile's queries and used while it
is in the first-level cache. cpu_attention's loop, a (token, head) at a time, reads a token's keys
and values again for every head and every later token of the prompt: at a few thousand positions
those are megabytes a layer, more than the second-level cache holds, and the prompt's time went to
reading them (docs/PERF.md).

The softmax is online: each query keeps the largest score so far, the sum of its exponentials and
the probability-weighted sum of values, rescaled when a later chunk brings a larger score; the
result equals the two-pass softmax's within float32 rounding. A query's chunks past its own
position (the causal mask) are never read, nor those before its window.
"""

import numpy as np

from llogos_cli.backends.cpu.cpu_jit import exp32, parallel_kernel, prange, share_out
from llogos_cli.backends.cpu.cpu_simd_attention import HEAD_MULTIPLE, KEYS, cached_key_scores, cached_value_sums

TILE = 32         # query positions of one tile: with a group's heads, the queries sharing each chunk
CHUNK = 4 * KEYS  # key positions of one chunk: its keys and values (16 KiB each at head size 64) fit L1
# Below any score: where a query has seen nothing yet (fastmath assumes no infinities).
_LOWEST = np.float32(-3.0e38)


def attend_tiles(q, k, v, blocks, last, tile_bounds, scale, window, softcap, sinks, out):
    """_attend_tiles, its (tile, KV group) pairs handed out one at a time as threads come free."""
    share_out(tile_bounds.shape[0] * k.shape[1])
    _attend_tiles(q, k, v, blocks, last, tile_bounds, scale, window, softcap, sinks, out)


@parallel_kernel
def _attend_tiles(q, k, v, blocks, last, tile_bounds, scale, window, softcap, sinks, out):
    """As cpu_attention._attend_rows for the tokens of the tiles (rows tile_bounds[i, 0] to
    tile_bounds[i, 1] of q, consecutive positions of one slot, so that the first's block table
    serves them all): token t attends positions [max(0, last[t] + 1 - window), last[t] + 1) of
    k (N, n_kv, B, dk) and v (N, n_kv, B, dv) through blocks (T, max blocks); -> out (T, H, dv)."""
    H, dk = q.shape[1], q.shape[2]
    n_kv, B, dv = k.shape[1], k.shape[2], v.shape[3]
    group = H // n_kv
    wide = dk % HEAD_MULTIPLE == 0 and dv % HEAD_MULTIPLE == 0
    for item in prange(tile_bounds.shape[0] * n_kv):
        t0, t1 = tile_bounds[item // n_kv, 0], tile_bounds[item // n_kv, 1]
        g = item % n_kv
        n_q = (t1 - t0) * group                      # query m: token t0 + m // group, head g·group + m % group
        qs = np.empty((n_q, dk), np.float32)
        top = np.empty(n_q, np.float32)              # the largest score so far
        total = np.empty(n_q, np.float32)            # Σ exp(score - top)
        acc = np.zeros((n_q, dv), np.float32)        # Σ exp(score - top) · value
        firsts = np.empty(t1 - t0, np.int64)
        for m in range(n_q):
            t, h = t0 + m // group, g * group + m % group
            for i in range(dk):
                qs[m, i] = q[t, h, i] * np.float32(scale)
            # A sink is one more logit whose value is nothing: it starts the sums.
            top[m] = sinks[h] if sinks.size else _LOWEST
            total[m] = np.float32(1) if sinks.size else np.float32(0)
        for t in range(t0, t1):
            firsts[t - t0] = max(np.int64(0), np.int64(last[t]) + 1 - window) if window > 0 else np.int64(0)
        scores = np.empty(CHUNK, np.float32)
        j0 = firsts.min()
        end = np.int64(last[t0:t1].max()) + 1
        while j0 < end:
            block = j0 // B
            j1 = min(j0 + CHUNK, (block + 1) * B, end)   # a chunk lies in one block of the cache
            row0 = (np.int64(blocks[t0, block]) * n_kv + g) * B - block * B   # flat row of position 0
            for m in range(n_q):
                t = t0 + m // group
                a, b = max(j0, firsts[t - t0]), min(j1, np.int64(last[t]) + 1)
                if a >= b:
                    continue
                j = a
                while wide and j + KEYS <= b:
                    cached_key_scores(k, (row0 + j) * dk, qs[m], scores, j - a)
                    j += KEYS
                for j in range(j, b):
                    key = k[blocks[t0, block], g, j - block * B]
                    s = np.float32(0)
                    for i in range(dk):
                        s += qs[m, i] * key[i]
                    scores[j - a] = s
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
                j = a
                while wide and j + KEYS <= b:
                    cached_value_sums(v, (row0 + j) * dv, scores, j - a, acc[m])
                    j += KEYS
                for j in range(j, b):
                    p, value = scores[j - a], v[blocks[t0, block], g, j - block * B]
                    for i in range(dv):
                        acc[m, i] += p * value[i]
            j0 = j1
        for m in range(n_q):
            t, h = t0 + m // group, g * group + m % group
            for i in range(dv):
                out[t, h, i] = acc[m, i] / total[m]
