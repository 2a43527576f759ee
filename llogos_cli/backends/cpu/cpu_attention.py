"""Attention as one compiled loop (the CPU paths that have numba loaded), every token a row: a
decode row, or a prompt token whose chunk's keys are stored before it attends them. A row's query
heads read their keys and values where the cache holds them, unpaged or through a block table, with
no gathered copy; the few hundred thousand multiply-adds of a decode step cost less than NumPy's
dozen calls around them did, and a prompt's causal half of the scores less than NumPy's whole
square of them (docs/PERF.md)."""

import numpy as np

from llogos_cli.backends.cpu.cpu_jit import exp32, kernel, parallel_kernel, prange, share_out
from llogos_cli.backends.cpu.cpu_simd_attention import HEAD_MULTIPLE, KEYS, key_scores, value_sums


def attend_rows(q, k, v, blocks, pos, scale, window, softcap, sinks, out):
    """_attend_rows, its (row, head) pairs handed out one at a time as threads come free."""
    share_out(q.shape[0] * q.shape[1])
    _attend_rows(q, k, v, blocks, pos, scale, window, softcap, sinks, out)


@parallel_kernel
def _attend_rows(q, k, v, blocks, pos, scale, window, softcap, sinks, out):
    """q (R, H, dk): row r attends its keys at positions [max(0, pos[r] + 1 - window), pos[r] + 1)
    (window 0: from 0). Position p of row r lies at offset p % B of first index blocks[r, p // B]
    of k (N, n_kv, B, dk) and v (N, n_kv, B, dv), float32. Scores s = scale q·k become
    softcap * tanh(s / softcap) unless softcap is 0; sinks (H,), or none, join each softmax's
    denominator as one more logit. -> out (R, H, dv). One (row, head) a thread at a time; KEYS
    positions of a block at a time in vector registers (cpu_simd_attention), the rest one by one."""
    R, H, dk = q.shape
    n_kv, B, dv = k.shape[1], k.shape[2], v.shape[3]
    group = H // n_kv
    wide = dk % HEAD_MULTIPLE == 0 and dv % HEAD_MULTIPLE == 0
    for item in prange(R * H):
        r, h = item // H, item % H
        g = h // group
        last = np.int64(pos[r])
        first = max(np.int64(0), last + 1 - window) if window > 0 else np.int64(0)
        n = last + 1 - first
        qs = q[r, h] * np.float32(scale)
        scores = np.empty(n, np.float32)
        for j0 in range(first - first % B, last + 1, B):   # a block (unpaged: the slot) at a time
            row0 = (np.int64(blocks[r, j0 // B]) * n_kv + g) * B - j0   # the flat row index of position 0
            j, end = max(j0, first), min(j0 + B, last + 1)
            while wide and j + KEYS <= end:
                key_scores(k, (row0 + j) * dk, qs, scores, j - first)
                j += KEYS
            for j in range(j, end):
                key = k[blocks[r, j0 // B], g, j - j0]
                s = np.float32(0)
                for i in range(dk):
                    s += qs[i] * key[i]
                scores[j - first] = s
        if softcap != 0:
            for j in range(n):
                scores[j] = np.float32(softcap) * np.tanh(scores[j] / np.float32(softcap))
        top = np.float32(-np.inf)
        for j in range(n):
            top = max(top, scores[j])
        if sinks.size:
            top = max(top, sinks[h])
        total = np.float32(0)
        for j in range(n):
            scores[j] = exp32(scores[j] - top)
            total += scores[j]
        if sinks.size:
            total += exp32(sinks[h] - top)
        acc = np.zeros(dv, np.float32)
        for j0 in range(first - first % B, last + 1, B):
            row0 = (np.int64(blocks[r, j0 // B]) * n_kv + g) * B - j0
            j, end = max(j0, first), min(j0 + B, last + 1)
            while wide and j + KEYS <= end:
                value_sums(v, (row0 + j) * dv, scores, j - first, acc)
                j += KEYS
            for j in range(j, end):
                p, value = scores[j - first], v[blocks[r, j0 // B], g, j - j0]
                for i in range(dv):
                    acc[i] += p * value[i]
        for i in range(dv):
            out[r, h, i] = acc[i] / total


@kernel
def store_rows(k, v, firsts, ats, k_cache, v_cache):
    """k (T, n_kv, dk) and v (T, n_kv, dv) float32 into the float32 caches at (firsts[t], head, ats[t])."""
    for t in range(k.shape[0]):
        for g in range(k.shape[1]):
            k_cache[firsts[t], g, ats[t], :] = k[t, g]
            v_cache[firsts[t], g, ats[t], :] = v[t, g]
