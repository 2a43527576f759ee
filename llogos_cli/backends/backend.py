"""The interface the forward pass (model/) and the engine (engine/) compute through: one for the
CPU (cpu/numpy_backend.NumpyBackend) and one for NVIDIA GPUs (cuda/cuda_backend.CudaBackend).

Arrays are the backend's own (NumPy arrays, CuPy arrays); shapes are written (tokens, ...),
T tokens of a batch. Weights are uploaded once, in their stored GGUF form, through vector,
matrix and matrices; the caches through kv_cache or paged_kv_cache and zeros. A backend whose
`graphs` is True also offers GraphCapture, from which the engine builds replayable decode steps.
"""

from typing import Any, Protocol

import numpy as np
from gguf import GGMLQuantizationType

Array = Any      # the backend's array type
Matrix = Any     # a weight matrix as the backend holds it
Layout = Any     # where a batch's tokens sit in the caches (batch_layout)
KVCache = Any


def glu_of_products(backend: "Backend", x: Array, gate: Matrix, up: Matrix, gelu: bool, norm: Array | None = None,
                    eps: float = 0.0) -> Array:
    """glu_matmuls out of the backend's separate ops: the products of x (normed by norm where given)
    with gate and up, then their GLU. NumPy's whole answer, and CUDA's where no fused product applies."""
    products = (backend.matmuls(x, [gate, up]) if norm is None
                else backend.rmsnorm_matmuls(x, norm, eps, [gate, up]))
    return backend.glu(*products, gelu)

class Backend(Protocol):
    name: str                    # "cpu" or "cuda"
    graphs: bool                 # decode steps can be captured (capture) and replayed
    encoders: bool               # attention that is not causal, and EncoderOps (encoder families)

    # ------------------------------------------------------------------ weights and memory
    @property
    def load_threads(self) -> int: ...
    def vector(self, raw: np.ndarray, qtype: GGMLQuantizationType) -> Array: ...
    def matrix(self, raw: np.ndarray, qtype: GGMLQuantizationType, matmul: bool) -> Matrix: ...
    def matrices(self, raws: list[np.ndarray], qtype: GGMLQuantizationType) -> list[Matrix]: ...
    def warm_up(self, product_types: set, experts: bool = False, progress=None,
                cache_types: tuple = ()) -> float: ...   # -> seconds compiling
    def zeros(self, shape: tuple[int, ...]) -> Array: ...
    def to_host(self, x: Array) -> np.ndarray: ...
    def synchronize(self) -> None: ...

    # ------------------------------------------------------------------ the layers' operations
    def embed(self, table: Matrix, ids: np.ndarray) -> Array: ...                 # (T, n_embd)
    def matmul(self, x: Array, w: Matrix) -> Array: ...                           # x (T, in) · wᵀ
    def matmuls(self, x: Array, ws: list[Matrix]) -> list[Array]: ...             # several, one x
    def matmul_add(self, x: Array, w: Matrix, residual: Array) -> Array: ...      # residual + x · wᵀ
    def rmsnorm_matmuls(self, x: Array, norm: Array, eps: float,
                        ws: list[Matrix]) -> list[Array]: ...                     # matmuls(rmsnorm(x, norm, eps), ws)
    def glu_matmuls(self, x: Array, gate: Matrix, up: Matrix, gelu: bool, norm: Array | None = None,
                    eps: float = 0.0) -> Array: ...     # glu of (rmsnorm_)matmuls(x, [gate, up])
    def add(self, a: Array, b: Array) -> Array: ...
    def mul(self, a: Array, b: Array) -> Array: ...
    def scale(self, x: Array, s: float) -> Array: ...
    def scale_rows(self, x: Array, s: Array) -> Array: ...
    def softcap(self, x: Array, cap: float) -> Array: ...
    def sigmoid(self, x: Array) -> Array: ...
    def silu(self, x: Array) -> Array: ...
    def softplus(self, x: Array) -> Array: ...
    def rmsnorm(self, x: Array, w: Array, eps: float) -> Array: ...
    def l2norm(self, x: Array, eps: float) -> Array: ...
    def rope(self, x: Array, pos: np.ndarray, dims: int, base: float, freq_scale: float, neox: bool,
             factors: Array | None = None, attn_factor: float = 1.0) -> Array: ...
    def glu(self, gate: Array, up: Array, gelu: bool) -> Array: ...
    def swiglu_oai(self, gate: Array, up: Array, alpha: float, limit: float) -> Array: ...

    # ------------------------------------------------------------------ attention and its cache
    def batch_layout(self, slots: np.ndarray, pos: np.ndarray) -> Layout: ...
    def kv_cache(self, n_slots: int, n_ctx: int, n_kv: int, dk: int, dv: int, type_k: str,
                 type_v: str) -> KVCache: ...
    def paged_kv_cache(self, tables: Array, n_blocks: int, block_size: int, n_kv: int, dk: int, dv: int,
                       type_k: str, type_v: str) -> KVCache: ...
    def block_tables(self, n_rows: int, max_blocks: int) -> Array: ...
    def write_block_table(self, tables: Array, row: int, blocks: list[int]) -> None: ...
    def kv_store(self, cache: KVCache, k: Array, v: Array, layout: Layout) -> None: ...
    def rope_kv_store(self, cache: KVCache, q: Array, k: Array, v: Array, layout: Layout, dims: int, base: float,
                      freq_scale: float, neox: bool, factors: Array | None = None,
                      attn_factor: float = 1.0) -> Array: ...   # rope of q and k, kv_store: the turned q
    def attention(self, q: Array, cache: KVCache, layout: Layout, scale: float, window: int,
                  softcap: float = 0.0, sinks: Array | None = None, causal: bool = True) -> Array: ...   # (T, H, dv)
    def kv_shift(self, cache: KVCache, slot: int, src: int, n: int, delta: int, rope: tuple | None) -> None: ...

    # ------------------------------------------------------------------ recurrent layers
    def ssm_conv(self, x: Array, conv_state: Array, w: Array, layout: Layout) -> Array: ...
    def delta_net(self, q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array,
                  layout: Layout) -> Array: ...

    # ------------------------------------------------------------------ mixture of experts
    def route(self, logits: Array, k: int, normalize: bool = True) -> tuple[Array, Array]: ...
    def matmul_experts(self, x: Array, w: Matrix, experts: Array, n_expert: int,
                       weights: Array | None = None, bias: Array | None = None) -> Array: ...

    # ------------------------------------------------------------------ choosing tokens
    def mask_logits(self, logits: Array, bits: np.ndarray) -> Array: ...
    def argmax_rows(self, logits: Array) -> np.ndarray: ...



class EncoderOps(Protocol):
    """What a backend whose `encoders` is True offers besides: the ops of encoder families (BERT)."""

    def layernorm(self, x: Array, w: Array, b: Array, eps: float) -> Array: ...   # (x - mean) / std * w + b
    def gelu(self, x: Array) -> Array: ...                                        # tanh approximation


class GraphCapture(Protocol):
    """What a backend whose `graphs` is True offers besides: the primitives the engine's decode
    graphs (engine/decode_graph.py) are built from."""

    def capture(self, fn) -> tuple[Any, Any]: ...   # (graph, fn's result): fn's work recorded, not run
    def device_input(self, name: str, values: np.ndarray) -> Array: ...   # a buffer the graph reads
    def release_inputs(self) -> None: ...
