"""Rotary position embedding as one compiled loop (the CPU paths that have numba loaded), and a
decode step's whole RoPE-and-store of a layer in one call (float32 or float16 caches): rotating q and k apart and storing k and
v after them took three calls and their arrays' checks, each costing more than the arithmetic, on
the one thread that runs between the step's parallel products (docs/PERF.md)."""

import numpy as np

from llogos_cli.backends.cpu.cpu_attention import put_row
from llogos_cli.backends.cpu.cpu_jit import helper, kernel


@helper
def _turn(x, cos, sin, t, neox, out):
    """One head x (D,) of token t -> out (D,): its first 2 · half features turned pairwise by the
    token's angles cos[t], sin[t] (already scaled by the attention factor); pairs (i, i + half)
    with neox, else (2i, 2i + 1). Features past them are copied."""
    half = cos.shape[1]
    for i in range(half):
        a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
        xa, xb = x[a], x[b]
        out[a] = xa * cos[t, i] - xb * sin[t, i]
        out[b] = xa * sin[t, i] + xb * cos[t, i]
    for i in range(2 * half, x.shape[0]):
        out[i] = x[i]


@kernel
def rope_rows(x, cos, sin, neox, out):
    """x (T, H, D) float32 -> out: every head turned (_turn) by its token's angles, cos and sin (T, half)."""
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            _turn(x[t, h], cos, sin, t, neox, out[t, h])


@kernel
def rope_store_rows(q, k, v, cos, sin, neox, firsts, ats, k_cache, v_cache, q_out):
    """q (T, H, dk) turned into q_out; k (T, n_kv, dk) turned and v (T, n_kv, dv) stored into the
    float32 or float16 (uint16 bits) caches at (firsts[t], head, ats[t]), as rope_rows and
    cpu_attention.store_rows would one after the other."""
    turned = np.empty(k.shape[2], np.float32)
    for t in range(q.shape[0]):
        for h in range(q.shape[1]):
            _turn(q[t, h], cos, sin, t, neox, q_out[t, h])
        for g in range(k.shape[1]):
            _turn(k[t, g], cos, sin, t, neox, turned)
            put_row(turned, k_cache[firsts[t], g, ats[t]])
            put_row(v[t, g], v_cache[firsts[t], g, ats[t]])
