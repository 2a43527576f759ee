"""The KV cache and attention on the NumPy backend, for a batch of runs from several cache slots.

A layer's cache holds (n_slots, n_kv, n_ctx, head_dim) keys and values. A batch is a list of runs
(see backends/__init__.py): decode rows (runs of one token) are attended all at once, each query
against its own slot's first pos + 1 keys, the rest masked (softmax with per-row lengths); longer
runs (prompt chunks) attend causally within their slot, a run at a time.
"""

import mmap
from dataclasses import dataclass

import numpy as np

from llogos_cli.backends import Q8_0_BLOCK, check_cache_type
from llogos_cli.errors import LlogosError

# Attention scores are computed for this many query rows at a time, bounding their memory.
_QUERY_CHUNK = 256


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the tokens of a batch go, worked out once per forward pass."""
    slots: np.ndarray   # (T,) int32
    pos: np.ndarray     # (T,) int32
    rows: np.ndarray    # indices of the tokens that are runs of their own (decode rows)
    runs: tuple         # (slot, t0, t1) of the longer runs (prompt chunks)


def batch_layout(slots: np.ndarray, pos: np.ndarray) -> Layout:
    slots, pos = np.asarray(slots, np.int32), np.asarray(pos, np.int32)
    starts = np.flatnonzero(np.diff(slots)) + 1
    t0s, t1s = np.concatenate([[0], starts]), np.concatenate([starts, [len(slots)]])
    if len(np.unique(slots[t0s])) != len(t0s) or np.any(np.diff(pos)[np.diff(slots) == 0] != 1):
        raise LlogosError("a batch must hold each slot's tokens as one run of consecutive positions")
    single = t1s - t0s == 1
    runs = tuple((int(slots[a]), int(a), int(b)) for a, b in zip(t0s[~single], t1s[~single]))
    return Layout(slots, pos, t0s[single], runs)


@dataclass(slots=True)
class KVCache:
    k: np.ndarray  # (n_slots, n_kv_heads, n_ctx, head_dim_k)
    v: np.ndarray  # (n_slots, n_kv_heads, n_ctx, head_dim_v)
    type_k: str
    type_v: str


# q8_0 entries are held as float32 after a quantize/dequantize round trip: the same values a
# q8_0 cache on the GPU yields, without a packed layout that NumPy could not use directly.
_CACHE_DTYPE = {"f32": np.float32, "f16": np.float16, "q8_0": np.float32}


def _lazy_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Zeros in anonymous memory of ordinary pages, which the kernel provides as they are first
    written: slots and long contexts cost memory only as they fill. (np.zeros would ask for huge
    pages, and the first write to each slot's and head's region would then take 2 MiB.)"""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(mmap.mmap(-1, max(size, 1)), dtype, int(np.prod(shape))).reshape(shape)


def _cache_round(x: np.ndarray, cache_type: str) -> np.ndarray:
    if cache_type != "q8_0":
        return x
    blocks = x.reshape(*x.shape[:-1], -1, Q8_0_BLOCK)
    d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    scaled = blocks * np.where(d == 0, np.float32(0), np.float32(1) / np.where(d == 0, 1, d))
    q = np.sign(scaled) * np.floor(np.abs(scaled) + np.float32(0.5))  # round half away from zero
    return (q * d.astype(np.float16).astype(np.float32)).reshape(x.shape)


class AttentionOps:
    """Mixed into NumpyBackend."""

    def batch_layout(self, slots: np.ndarray, pos: np.ndarray) -> Layout:
        return batch_layout(slots, pos)

    def kv_cache(self, n_slots: int, n_ctx: int, n_kv: int, dk: int, dv: int, type_k: str, type_v: str) -> KVCache:
        check_cache_type(type_k, dk)
        check_cache_type(type_v, dv)
        return KVCache(_lazy_zeros((n_slots, n_kv, n_ctx, dk), _CACHE_DTYPE[type_k]),
                       _lazy_zeros((n_slots, n_kv, n_ctx, dv), _CACHE_DTYPE[type_v]), type_k, type_v)

    def kv_store(self, cache: KVCache, k: np.ndarray, v: np.ndarray, layout: Layout) -> None:
        cache.k[layout.slots, :, layout.pos] = _cache_round(k, cache.type_k)   # (T, n_kv, dk)
        cache.v[layout.slots, :, layout.pos] = _cache_round(v, cache.type_v)   # (T, n_kv, dv)

    def attention(self, q: np.ndarray, cache: KVCache, layout: Layout, scale: float, window: int,
                  softcap: float = 0.0) -> np.ndarray:
        """Each query of q (T, H, dk) over its own slot's keys up to its position; -> (T, H, dv).
        With softcap, scores s (scaled) become softcap * tanh(s / softcap) before the softmax."""
        out = np.empty((q.shape[0], q.shape[1], cache.v.shape[3]), np.float32)
        if len(layout.rows):
            out[layout.rows] = _rows(q[layout.rows], cache, layout.slots[layout.rows], layout.pos[layout.rows],
                                     scale, window, softcap)
        for slot, t0, t1 in layout.runs:
            out[t0:t1] = _run(q[t0:t1], cache.k[slot], cache.v[slot], int(layout.pos[t0]), scale, window, softcap)
        return out


def _softcap(scores: np.ndarray, softcap: float) -> None:
    """In place: scores s -> softcap * tanh(s / softcap) (Gemma 2's bound on attention logits)."""
    if softcap:
        scores *= np.float32(1 / softcap)
        np.tanh(scores, out=scores)
        scores *= np.float32(softcap)


def _rows(q: np.ndarray, cache: KVCache, slots: np.ndarray, pos: np.ndarray, scale: float, window: int,
          softcap: float):
    """R decode rows: q (R, H, dk), row r at position pos[r] of slot slots[r]; -> (R, H, dv)."""
    R, H, dk = q.shape
    n_kv = cache.k.shape[1]
    n = int(pos.max()) + 1
    lo, hi = int(slots.min()), int(slots.max()) + 1
    if hi - lo == R and np.array_equal(slots, np.arange(lo, hi)):   # slots in order: views, no gather
        keys, values = cache.k[lo:hi, :, :n], cache.v[lo:hi, :, :n]
    else:
        keys, values = cache.k[slots, :, :n], cache.v[slots, :, :n]
    keys = keys.astype(np.float32, copy=False)                                   # (R, kv, n, dk)
    values = values.astype(np.float32, copy=False)                               # (R, kv, n, dv)
    qg = (q * np.float32(scale)).reshape(R, n_kv, H // n_kv, dk)                 # (R, kv, g, dk)
    scores = qg @ keys.transpose(0, 1, 3, 2)                                     # (R, kv, g, n)
    _softcap(scores, softcap)
    kpos = np.arange(n)[None, :]
    masked = kpos > pos[:, None]                                                 # (R, n) past each row's length
    if window:
        masked |= pos[:, None] - kpos >= window
    if masked.any():   # softmax in place: the scores array is the step's largest temporary
        scores += np.where(masked, np.float32(-np.inf), np.float32(0))[:, None, None, :]
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return (scores @ values).reshape(R, H, -1)                                   # (R, H, dv)


def _run(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos0: int, scale: float, window: int,
         softcap: float):
    """Causal attention of q (T, H, dk) at positions pos0.. over one slot's cache; -> (T, H, dv)."""
    T, H, dk = q.shape
    n_kv = k_cache.shape[0]
    group = H // n_kv
    n = pos0 + T
    keys = k_cache[:, :n].astype(np.float32, copy=False)
    values = v_cache[:, :n].astype(np.float32, copy=False)
    out = np.empty((T, H, v_cache.shape[2]), np.float32)
    for t0 in range(0, T, _QUERY_CHUNK):
        t1 = min(T, t0 + _QUERY_CHUNK)
        qc = q[t0:t1].reshape(t1 - t0, n_kv, group, dk).transpose(1, 2, 0, 3)   # (kv, g, t, dk)
        scores = (qc.reshape(n_kv, group * (t1 - t0), dk) @ keys.transpose(0, 2, 1)) * np.float32(scale)
        _softcap(scores, softcap)
        qpos = np.arange(pos0 + t0, pos0 + t1)[:, None]
        kpos = np.arange(n)[None, :]
        masked = kpos > qpos
        if window:
            masked |= qpos - kpos >= window
        scores = scores.reshape(n_kv, group, t1 - t0, n)
        scores[:, :, masked] = -np.inf
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        o = scores.reshape(n_kv, group * (t1 - t0), n) @ values                   # (kv, g*t, dv)
        out[t0:t1] = o.reshape(n_kv, group, t1 - t0, -1).transpose(2, 0, 1, 3).reshape(t1 - t0, H, -1)
    return out
