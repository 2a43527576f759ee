"""The reference backend: float32 NumPy on the CPU.

Matrices used in products are expanded once to float32 so every product is one BLAS call;
decode is then bounded by streaming those float32 weights from memory (see docs/PERF.md).
Embedding tables stay quantized in the memory map and are dequantized a row at a time.
"""

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from llogos_cli import quants
from llogos_cli.backends import Q8_0_BLOCK, check_cache_type
from llogos_cli.backends.numpy_recurrent import RecurrentOps

# Attention scores are computed for this many query rows at a time, bounding their memory.
_QUERY_CHUNK = 256


@dataclass(slots=True)
class Matrix:
    raw: np.ndarray                 # stored bytes (rows, bytes per row), memory-mapped
    qtype: GGMLQuantizationType
    dense: np.ndarray | None        # float32 (rows, cols) when used in products

    @property
    def nbytes(self) -> int:
        """Bytes a product with this matrix reads (a lookup-only table reads a row per token)."""
        return self.dense.nbytes if self.dense is not None else 0


@dataclass(slots=True)
class KVCache:
    k: np.ndarray  # (n_kv_heads, n_ctx, head_dim_k)
    v: np.ndarray  # (n_kv_heads, n_ctx, head_dim_v)
    type_k: str
    type_v: str


# q8_0 entries are held as float32 after a quantize/dequantize round trip: the same values a
# q8_0 cache on the GPU yields, without a packed layout that NumPy could not use directly.
_CACHE_DTYPE = {"f32": np.float32, "f16": np.float16, "q8_0": np.float32}


def _cache_round(x: np.ndarray, cache_type: str) -> np.ndarray:
    if cache_type != "q8_0":
        return x
    blocks = x.reshape(*x.shape[:-1], -1, Q8_0_BLOCK)
    d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    scaled = blocks * np.where(d == 0, np.float32(0), np.float32(1) / np.where(d == 0, 1, d))
    q = np.sign(scaled) * np.floor(np.abs(scaled) + np.float32(0.5))  # round half away from zero
    return (q * d.astype(np.float16).astype(np.float32)).reshape(x.shape)


class NumpyBackend(RecurrentOps):
    name = "cpu"
    parallel_load = True         # weights may be prepared on several threads
    default_cache_type = "f32"   # exact: the reference the other backend and the oracles are held to

    def __init__(self):
        self._rope_key = None
        self._rope_cos_sin = None

    # ---------------------------------------------------------------- loading
    def vector(self, raw: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
        return quants.dequantize(raw.reshape(1, -1), qtype).reshape(-1)

    def matrix(self, raw: np.ndarray, qtype: GGMLQuantizationType, matmul: bool) -> Matrix:
        return Matrix(raw, qtype, quants.dequantize(raw, qtype) if matmul else None)

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return x

    def decoder(self, model, ctx):
        """The one-token decode step for ctx: token id -> logits (1, n_vocab)."""
        return lambda token: model.forward(ctx, np.array([token], np.int32))

    def synchronize(self) -> None:
        pass

    # ---------------------------------------------------------------- ops
    def embed(self, table: Matrix, ids: np.ndarray) -> np.ndarray:
        if table.dense is not None:
            return table.dense[ids]
        return quants.dequantize(table.raw[ids], table.qtype)

    def matmul(self, x: np.ndarray, w: Matrix) -> np.ndarray:
        return x @ w.dense.T

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a * b

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        return x * np.float32(s)

    def sigmoid(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):   # exp(-x) = inf for x < -88 gives the right limit, 0
            return np.float32(1) / (np.float32(1) + np.exp(-x))

    def silu(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):   # as in sigmoid: the limit, -0
            return x / (np.float32(1) + np.exp(-x))

    def rmsnorm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        ms = np.einsum("...i,...i->...", x, x)[..., None] / np.float32(x.shape[-1])
        return x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps))) * w

    def l2norm(self, x: np.ndarray, eps: float) -> np.ndarray:
        ss = np.einsum("...i,...i->...", x, x)[..., None]
        return x * (np.float32(1.0) / np.sqrt(np.maximum(ss, np.float32(eps * eps))))

    def rope(self, x: np.ndarray, pos: np.ndarray, dims: int, base: float, freq_scale: float,
             neox: bool, factors: np.ndarray | None = None) -> np.ndarray:
        """Rotate the first `dims` features of each head of x (T, H, D) by position. Pair i turns
        by pos * freq_scale * base^(-2i/dims) / factors[i] (factors: Llama 3's rope_freqs)."""
        cos, sin = self._rope_table(pos, dims, base, freq_scale, factors)   # (T, 1, dims/2)
        out = x.copy()
        half = dims // 2
        if neox:   # pairs (i, i + dims/2)
            a, b = x[..., :half], x[..., half:dims]
            out[..., :half] = a * cos - b * sin
            out[..., half:dims] = a * sin + b * cos
        else:      # pairs (2i, 2i + 1)
            a, b = x[..., 0:dims:2], x[..., 1:dims:2]
            out[..., 0:dims:2] = a * cos - b * sin
            out[..., 1:dims:2] = a * sin + b * cos
        return out

    def _rope_table(self, pos: np.ndarray, dims: int, base: float, freq_scale: float, factors):
        # Every layer of a forward pass rotates at the same positions: compute the table once.
        key = (pos.tobytes(), dims, base, freq_scale, None if factors is None else factors.tobytes())
        if self._rope_key != key:
            inv_freq = freq_scale * base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
            if factors is not None:
                inv_freq = inv_freq / factors.astype(np.float64)
            angle = pos.astype(np.float64)[:, None] * inv_freq[None, :]
            self._rope_key = key
            self._rope_cos_sin = (np.cos(angle).astype(np.float32)[:, None, :],
                                  np.sin(angle).astype(np.float32)[:, None, :])
        return self._rope_cos_sin

    def glu(self, gate: np.ndarray, up: np.ndarray, gelu: bool) -> np.ndarray:
        if gelu:  # tanh approximation, as Gemma and llama.cpp use
            g = 0.5 * gate * (1.0 + np.tanh(np.float32(0.7978845608028654) * (gate + np.float32(0.044715) * gate ** 3)))
        else:
            g = self.silu(gate)
        return g * up

    # ---------------------------------------------------------------- attention
    def kv_cache(self, n_ctx: int, n_kv: int, dk: int, dv: int, type_k: str, type_v: str) -> KVCache:
        check_cache_type(type_k, dk)
        check_cache_type(type_v, dv)
        # np.zeros maps pages lazily, so a long context costs memory only as it fills.
        return KVCache(np.zeros((n_kv, n_ctx, dk), _CACHE_DTYPE[type_k]), np.zeros((n_kv, n_ctx, dv), _CACHE_DTYPE[type_v]),
                       type_k, type_v)

    def kv_store(self, cache: KVCache, k: np.ndarray, v: np.ndarray, pos0: int) -> None:
        n = k.shape[0]
        cache.k[:, pos0:pos0 + n] = _cache_round(k, cache.type_k).transpose(1, 0, 2)
        cache.v[:, pos0:pos0 + n] = _cache_round(v, cache.type_v).transpose(1, 0, 2)

    def attention(self, q: np.ndarray, cache: KVCache, pos0: int, scale: float, window: int) -> np.ndarray:
        """Causal attention of q (T, H, dk) at positions pos0.. over the cache; -> (T, H, dv)."""
        T, H, dk = q.shape
        n_kv = cache.k.shape[0]
        group = H // n_kv
        n = pos0 + T
        keys, values = cache.k[:, :n].astype(np.float32, copy=False), cache.v[:, :n].astype(np.float32, copy=False)
        out = np.empty((T, H, cache.v.shape[2]), np.float32)
        for t0 in range(0, T, _QUERY_CHUNK):
            t1 = min(T, t0 + _QUERY_CHUNK)
            qc = q[t0:t1].reshape(t1 - t0, n_kv, group, dk).transpose(1, 2, 0, 3)   # (kv, g, t, dk)
            scores = (qc.reshape(n_kv, group * (t1 - t0), dk) @ keys.transpose(0, 2, 1)) * np.float32(scale)
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

    # ---------------------------------------------------------------- sampling
    def argmax(self, row: np.ndarray) -> int:
        return int(np.argmax(row))
