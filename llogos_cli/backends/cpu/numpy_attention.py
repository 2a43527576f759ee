"""The KV cache and attention on the NumPy backend, for a batch of runs from several cache slots.

A layer's cache holds (n_slots, n_kv, n_ctx, head_dim) keys and values, or, paged, a pool of
(n_blocks, n_kv, block_size, head_dim) that slots reach through block tables (position p of a slot
is offset p % block_size of block tables[slot, p // block_size]). A batch is a list of runs (see
backends/__init__.py). Where numba is loaded, cpu_attention's loop attends every token, prompt runs
of a tile or more a tile of positions at a time, reading any cache type where it lies. Otherwise, in NumPy:
decode rows (runs of one token) are attended all at once, each query against its own slot's first
pos + 1 keys, the rest masked (softmax with per-row lengths); longer runs (prompt chunks) attend
causally within their slot, a run at a time. A paged cache's keys are gathered block by block into the same (rows, n_kv,
positions, head_dim) shape first.
"""

import mmap
from dataclasses import dataclass, field

import numpy as np

from llogos_cli.backends import CACHE_BLOCKS, QUERY_CHUNK, check_cache_type
from llogos_cli.backends.cpu import kv_quant
from llogos_cli.errors import LlogosError

_NO_SINKS = np.empty(0, np.float32)
_NO_LEVELS = np.empty(0, np.float32)   # of a float cache
_ONE_ROW = np.zeros(1, np.intp)
_ONE_ROW.flags.writeable = False


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the tokens of a batch go, worked out once per forward pass."""
    slots: np.ndarray   # (T,) int32
    pos: np.ndarray     # (T,) int32
    rows: np.ndarray    # indices of the tokens that are runs of their own (decode rows)
    runs: tuple         # (slot, t0, t1) of the longer runs (prompt chunks)
    # What every layer would look up alike, kept at the first: where the tokens' keys go and their
    # block tables (one table array serves every layer).
    memo: dict = field(default_factory=dict, compare=False)

    def located(self, cache: "KVCache") -> tuple[np.ndarray, np.ndarray]:
        """cache.where() of every token of the batch."""
        key = ("where", id(cache.tables))
        if key not in self.memo:
            self.memo[key] = cache.where(self.slots, self.pos)
        return self.memo[key]

    def ends(self) -> np.ndarray:
        """The position of the last token of each token's run: how far it sees without a causal mask."""
        if "ends" not in self.memo:
            ends = self.pos.copy()
            for _, t0, t1 in self.runs:
                ends[t0:t1] = self.pos[t1 - 1]
            self.memo["ends"] = ends
        return self.memo["ends"]

    def items(self, tile: int, n_head: int, n_kv: int, grouped: bool = False) -> np.ndarray:
        """The compiled attention's work items, (first token, end token, first head, end head):
        each `tile` consecutive tokens of a run at least that long with one KV group's heads (the
        last of a run's tiles may be shorter), and each other token with one head, which gives the
        threads H items a decode row; grouped, with its KV group's heads, so that a packed cache's
        rows are decoded once for all of them. (n_items, 4) int64."""
        key = ("items", tile, n_head, n_kv, grouped)
        if key not in self.memo:
            group = n_head // n_kv
            tiles = [(a, min(a + tile, t1), g * group, (g + 1) * group)
                     for _, t0, t1 in self.runs if t1 - t0 >= tile for a in range(t0, t1, tile) for g in range(n_kv)]
            alone = np.ones(len(self.slots), bool)
            for _, t0, t1 in self.runs:
                alone[t0:t1] = t1 - t0 < tile
            heads = group if grouped else 1
            t = np.repeat(np.flatnonzero(alone), n_head // heads)
            h = np.tile(np.arange(0, n_head, heads), int(alone.sum()))
            self.memo[key] = np.concatenate([np.array(tiles, np.int64).reshape(-1, 4),
                                             np.stack([t, t + 1, h, h + heads], axis=1).astype(np.int64)])
        return self.memo[key]

    def blocks(self, cache: "KVCache") -> np.ndarray:
        """Every token's row of block tables (an unpaged slot is one block): (T, blocks)."""
        key = ("blocks", id(cache.tables))
        if key not in self.memo:
            self.memo[key] = self.slots.reshape(-1, 1) if cache.tables is None else cache.tables[self.slots]
        return self.memo[key]


def batch_layout(slots: np.ndarray, pos: np.ndarray) -> Layout:
    slots, pos = np.asarray(slots, np.int32), np.asarray(pos, np.int32)
    if len(slots) == 1:   # one sequence's decode step
        return Layout(slots, pos, _ONE_ROW, ())
    starts = np.flatnonzero(np.diff(slots)) + 1
    t0s, t1s = np.concatenate([[0], starts]), np.concatenate([starts, [len(slots)]])
    if len(np.unique(slots[t0s])) != len(t0s) or np.any(np.diff(pos)[np.diff(slots) == 0] != 1):
        raise LlogosError("a batch must hold each slot's tokens as one run of consecutive positions")
    single = t1s - t0s == 1
    runs = tuple((int(slots[a]), int(a), int(b)) for a, b in zip(t0s[~single], t1s[~single]))
    return Layout(slots, pos, t0s[single], runs)


@dataclass(slots=True)
class KVCache:
    k: np.ndarray  # (n_slots, n_kv_heads, n_ctx, head_dim_k), paged: (n_blocks, n_kv_heads, block_size, head_dim_k)
    v: np.ndarray  # (n_slots, n_kv_heads, n_ctx, head_dim_v), paged: (n_blocks, n_kv_heads, block_size, head_dim_v)
    type_k: str
    type_v: str
    tables: np.ndarray | None = None   # paged: (n_slots, max blocks per slot) int32, shared by every layer

    @property
    def dv(self) -> int:
        """Elements of a value row (a packed row holds fewer bytes than that)."""
        size = self.v.shape[3]
        return size // kv_quant.BLOCK_BYTES * kv_quant.BLOCK if self.type_v in kv_quant.PACKED_TYPES else size

    def where(self, slots: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The (first index, position index) at which each (slot, position) is held."""
        if self.tables is None:
            return slots, pos
        block_size = self.k.shape[2]
        return self.tables[slots, pos // block_size], pos % block_size

    def gather(self, slots: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of at least the first n positions of each slot, as float32
        (R, n_kv, >= n, head_dim); views where the slots are consecutive in an unpaged cache."""
        if self.tables is None:
            lo, hi = int(slots.min()), int(slots.max()) + 1
            if hi - lo == len(slots) and np.array_equal(slots, np.arange(lo, hi)):   # in order: views
                keys, values = self.k[lo:hi, :, :n], self.v[lo:hi, :, :n]
            else:
                keys, values = self.k[slots, :, :n], self.v[slots, :, :n]
        else:
            R, n_kv, block_size = len(slots), self.k.shape[1], self.k.shape[2]
            blocks = self.tables[slots, :-(-n // block_size)]                              # (R, nb)
            # One head's rows of one block at a time, in (row, head, block) order: one take each.
            ids = (blocks[:, None, :] * n_kv + np.arange(n_kv)[None, :, None]).ravel()     # (R * n_kv * nb,)
            keys = np.take(self.k.reshape(-1, block_size, self.k.shape[3]), ids, axis=0)
            values = np.take(self.v.reshape(-1, block_size, self.v.shape[3]), ids, axis=0)
            keys = keys.reshape(R, n_kv, -1, self.k.shape[3])                              # (R, n_kv, nb*B, dk)
            values = values.reshape(R, n_kv, -1, self.v.shape[3])                          # (R, n_kv, nb*B, dv)
        return _floats(keys, self.type_k), _floats(values, self.type_v)


# q8_0 entries are held as float32 after a quantize/dequantize round trip: the same values a
# q8_0 cache on the GPU yields, without a packed layout that NumPy could not use directly. The
# 4-bit types are held packed (kv_quant), an eighth of float32's memory being their point, and
# decoded as they are read.
_CACHE_DTYPE = {"f32": np.float32, "f16": np.float16, "q8_0": np.float32, "q4_0": np.uint8, "iq4_nl": np.uint8}


def _row_size(cache_type: str, d: int) -> int:
    return kv_quant.row_bytes(d) if cache_type in kv_quant.PACKED_TYPES else d


def _floats(x: np.ndarray, cache_type: str) -> np.ndarray:
    if cache_type in kv_quant.PACKED_TYPES:
        return kv_quant.dequantize(x, cache_type)
    return x.astype(np.float32, copy=False)


# The cache types the compiled kernels store rows into as they are (float16 as its bits), not in blocks.
STORED_TYPES = frozenset({"f32", "f16"})


def compiled_view(x: np.ndarray) -> np.ndarray:
    """A cache array as cpu_attention takes it: float16 as its bit patterns (numba has no float16)."""
    return x.view(np.uint16) if x.dtype == np.float16 else x


def _levels(cache_type: str) -> np.ndarray:
    return kv_quant.LEVELS.get(cache_type, _NO_LEVELS)


def _lazy_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Zeros in anonymous memory of ordinary pages, which the kernel provides as they are first
    written: slots and long contexts cost memory only as they fill. (np.zeros would ask for huge
    pages, and the first write to each slot's and head's region would then take 2 MiB.)"""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(mmap.mmap(-1, max(size, 1)), dtype, int(np.prod(shape))).reshape(shape)


def _cache_round(x: np.ndarray, cache_type: str) -> np.ndarray:
    if cache_type in kv_quant.PACKED_TYPES:
        return kv_quant.quantize(x, cache_type)
    if cache_type != "q8_0":
        return x
    blocks = x.reshape(*x.shape[:-1], -1, CACHE_BLOCKS["q8_0"])
    d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    scaled = blocks * np.where(d == 0, np.float32(0), np.float32(1) / np.where(d == 0, 1, d))
    q = np.sign(scaled) * np.floor(np.abs(scaled) + np.float32(0.5))  # round half away from zero
    return (q * d.astype(np.float16).astype(np.float32)).reshape(x.shape)


class AttentionOps:
    """Mixed into NumpyBackend."""
    compiled_attention = None   # cpu_attention's attend, store_rows and TILE where the backend has numba loaded
    compiled_store = None
    compiled_tile = 0

    def batch_layout(self, slots: np.ndarray, pos: np.ndarray) -> Layout:
        return batch_layout(slots, pos)

    def kv_cache(self, n_slots: int, n_ctx: int, n_kv: int, dk: int, dv: int, type_k: str, type_v: str) -> KVCache:
        check_cache_type(type_k, dk)
        check_cache_type(type_v, dv)
        return KVCache(_lazy_zeros((n_slots, n_kv, n_ctx, _row_size(type_k, dk)), _CACHE_DTYPE[type_k]),
                       _lazy_zeros((n_slots, n_kv, n_ctx, _row_size(type_v, dv)), _CACHE_DTYPE[type_v]), type_k, type_v)

    def paged_kv_cache(self, tables: np.ndarray, n_blocks: int, block_size: int, n_kv: int, dk: int, dv: int,
                       type_k: str, type_v: str) -> KVCache:
        cache = self.kv_cache(n_blocks, block_size, n_kv, dk, dv, type_k, type_v)
        cache.tables = tables
        return cache

    def block_tables(self, n_rows: int, max_blocks: int) -> np.ndarray:
        return np.zeros((n_rows, max_blocks), np.int32)

    def write_block_table(self, tables: np.ndarray, row: int, blocks: list[int]) -> None:
        tables[row, :len(blocks)] = blocks

    def kv_store(self, cache: KVCache, k: np.ndarray, v: np.ndarray, layout: Layout) -> None:
        first, at = layout.located(cache)
        if self.compiled_attention is not None and {cache.type_k, cache.type_v} <= STORED_TYPES:
            self.compiled_store(np.ascontiguousarray(k, np.float32), np.ascontiguousarray(v, np.float32),
                                first, at, compiled_view(cache.k), compiled_view(cache.v))
            return
        cache.k[first, :, at] = _cache_round(k, cache.type_k)   # (T, n_kv, dk)
        cache.v[first, :, at] = _cache_round(v, cache.type_v)   # (T, n_kv, dv)

    def attention(self, q: np.ndarray, cache: KVCache, layout: Layout, scale: float, window: int,
                  softcap: float = 0.0, sinks: np.ndarray | None = None, causal: bool = True) -> np.ndarray:
        """Each query of q (T, H, dk) over its own slot's keys up to its position (not causal: up to
        its run's last one); -> (T, H, dv). With softcap, scores s (scaled) become
        softcap * tanh(s / softcap) before the softmax; sinks (H,) are a logit per head that joins
        each softmax's denominator (gpt-oss)."""
        out = np.empty((q.shape[0], q.shape[1], cache.dv), np.float32)
        if self.compiled_attention is not None:
            # A prompt's keys are stored before it attends them, so each of its tokens attends its
            # slot's keys up to its own position as a decode row does.
            self.compiled_attention(np.ascontiguousarray(q, np.float32), compiled_view(cache.k),
                                    compiled_view(cache.v), _levels(cache.type_k), _levels(cache.type_v),
                                    layout.blocks(cache),
                                    layout.pos if causal else layout.ends(),
                                    layout.items(self.compiled_tile, q.shape[1], cache.k.shape[1],
                                                 bool({cache.type_k, cache.type_v} & set(kv_quant.PACKED_TYPES))),
                                    scale, window,
                                    softcap, _NO_SINKS if sinks is None else sinks, out)
            return out
        if len(layout.rows):
            out[layout.rows] = _rows(q[layout.rows], cache, layout.slots[layout.rows], layout.pos[layout.rows],
                                     scale, window, softcap, sinks)
        for slot, t0, t1 in layout.runs:
            keys, values = cache.gather(np.array([slot]), int(layout.pos[t1 - 1]) + 1)
            out[t0:t1] = _run(q[t0:t1], keys[0], values[0], int(layout.pos[t0]), scale, window, softcap, sinks,
                              causal)
        return out


def _softcap(scores: np.ndarray, softcap: float) -> None:
    """In place: scores s -> softcap * tanh(s / softcap) (Gemma 2's bound on attention logits)."""
    if softcap:
        scores *= np.float32(1 / softcap)
        np.tanh(scores, out=scores)
        scores *= np.float32(softcap)


def _softmax(scores: np.ndarray, sinks: np.ndarray | None) -> None:
    """In place over the last axis; sinks (scores' shape but the last axis, broadcast) join each
    denominator as one more logit whose probability is dropped."""
    top = scores.max(axis=-1, keepdims=True)
    if sinks is not None:
        top = np.maximum(top, sinks)
    scores -= top
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total += np.exp(sinks - top)
    scores /= total


def _rows(q: np.ndarray, cache: KVCache, slots: np.ndarray, pos: np.ndarray, scale: float, window: int,
          softcap: float, sinks: np.ndarray | None = None):
    """R decode rows: q (R, H, dk), row r at position pos[r] of slot slots[r]; -> (R, H, dv)."""
    R, H, dk = q.shape
    n_kv = cache.k.shape[1]
    keys, values = cache.gather(slots, int(pos.max()) + 1)                       # (R, kv, n, dk), (R, kv, n, dv)
    n = keys.shape[2]
    qg = (q * np.float32(scale)).reshape(R, n_kv, H // n_kv, dk)                 # (R, kv, g, dk)
    scores = qg @ keys.transpose(0, 1, 3, 2)                                     # (R, kv, g, n)
    _softcap(scores, softcap)
    kpos = np.arange(n)[None, :]
    masked = kpos > pos[:, None]                                                 # (R, n) past each row's length
    if window:
        masked |= pos[:, None] - kpos >= window
    if masked.any():   # softmax in place: the scores array is the step's largest temporary
        scores += np.where(masked, np.float32(-np.inf), np.float32(0))[:, None, None, :]
    _softmax(scores, None if sinks is None else sinks.reshape(n_kv, H // n_kv, 1))
    return (scores @ values).reshape(R, H, -1)                                   # (R, H, dv)


def _run(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos0: int, scale: float, window: int,
         softcap: float, sinks: np.ndarray | None = None, causal: bool = True):
    """Attention of q (T, H, dk) at positions pos0.. over one slot's float32 keys and values
    (n_kv, >= pos0 + T, d), each query up to its own position, or (not causal) up to the run's
    last; -> (T, H, dv)."""
    T, H, dk = q.shape
    n_kv = k_cache.shape[0]
    group = H // n_kv
    n = pos0 + T
    keys, values = k_cache[:, :n], v_cache[:, :n]
    out = np.empty((T, H, v_cache.shape[2]), np.float32)
    for t0 in range(0, T, QUERY_CHUNK):
        t1 = min(T, t0 + QUERY_CHUNK)
        qc = q[t0:t1].reshape(t1 - t0, n_kv, group, dk).transpose(1, 2, 0, 3)   # (kv, g, t, dk)
        scores = (qc.reshape(n_kv, group * (t1 - t0), dk) @ keys.transpose(0, 2, 1)) * np.float32(scale)
        _softcap(scores, softcap)
        qpos = np.arange(pos0 + t0, pos0 + t1)[:, None]
        kpos = np.arange(n)[None, :]
        masked = kpos > (qpos if causal else np.full_like(qpos, n - 1))   # (t, n) either way
        if window:
            masked |= qpos - kpos >= window
        scores = scores.reshape(n_kv, group, t1 - t0, n)
        scores[:, :, masked] = -np.inf
        _softmax(scores, None if sinks is None else sinks.reshape(n_kv, group, 1, 1))
        o = scores.reshape(n_kv, group * (t1 - t0), n) @ values                   # (kv, g*t, dv)
        out[t0:t1] = o.reshape(n_kv, group, t1 - t0, -1).transpose(2, 0, 1, 3).reshape(t1 - t0, H, -1)
    return out
