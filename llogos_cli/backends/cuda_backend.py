"""The CUDA backend: the NumPy backend's operations on device arrays, in hand-written kernels.

Weights are uploaded as their GGUF bytes and decoded inside the kernels; activations are float32;
the KV cache defaults to f16 (f32 and q8_0 on request, like llama.cpp's --cache-type-k/-v).
Kernels are reached through a provider: cuda_kernels.CudaKernels (CuPy) on a GPU, the CPU
emulator in the tests.

Host inputs (token ids, positions) go into device buffers that are rewritten in place while their
shape stays the same, and the kernels read positions from there: a decode step captured in a
CUDA graph (cuda_graph) replays at the next position once those buffers are updated.
"""

import numpy as np
from gguf import GGMLQuantizationType

from llogos_cli import quants
from llogos_cli.backends import cuda_attention, cuda_ops, cuda_recurrent
from llogos_cli.backends.cuda_attention import KVCache
from llogos_cli.backends.cuda_matmul import QuantMatrix, Scratch, get_rows, matmul, upload
from llogos_cli.errors import LlogosError


class CudaBackend:
    name = "cuda"
    parallel_load = False        # uploads stay on the thread that owns the CUDA context and stream
    default_cache_type = "f16"   # half the memory traffic of f32, as llama.cpp's default

    def __init__(self, kernels=None):
        if kernels is None:
            from llogos_cli.backends.cuda_kernels import CudaKernels
            kernels = CudaKernels()
        self.k, self.xp = kernels, kernels.xp
        self._scratch = Scratch(self.xp)
        self._inputs: dict[str, tuple[np.ndarray, object]] = {}  # name -> (host copy, device buffer)
        self._ones: dict[int, object] = {}                       # rope factors of models without any
        self._conv_kernels: dict[int, object] = {}               # ssm_conv weights decoded to float32

    # ---------------------------------------------------------------- loading
    def vector(self, raw: np.ndarray, qtype: GGMLQuantizationType):
        return self.xp.asarray(quants.dequantize(raw.reshape(1, -1), qtype).reshape(-1))

    def matrix(self, raw: np.ndarray, qtype: GGMLQuantizationType, matmul: bool) -> QuantMatrix:
        return upload(self.xp, raw, qtype, matmul)  # products and lookups both read the quantized bytes

    def to_host(self, x) -> np.ndarray:
        return self.k.to_host(x)

    def synchronize(self) -> None:
        self.k.synchronize()

    def decoder(self, model, ctx):
        """The one-token decode step for ctx, captured once in a CUDA graph and replayed after."""
        from llogos_cli.backends.cuda_graph import DecodeGraph
        return DecodeGraph(model, ctx).step

    def device_input(self, name: str, values: np.ndarray):
        """Host values in the device buffer kept under `name` (a new buffer only if the shape changed)."""
        held = self._inputs.get(name)
        if held is not None and held[0].shape == values.shape:
            if not np.array_equal(held[0], values):
                held[1][...] = self.xp.asarray(values)
                held[0][...] = values
            return held[1]
        device = self.xp.array(values)
        self._inputs[name] = (values.copy(), device)
        return device

    def release_inputs(self) -> None:
        """Hand the input buffers over (to a captured graph, which rewrites them); use new ones."""
        self._inputs.clear()

    def _positions(self, pos0: int, n: int):
        return self.device_input("pos", np.arange(pos0, pos0 + n, dtype=np.int32))

    def _c(self, x):
        return self.xp.ascontiguousarray(x)

    # ---------------------------------------------------------------- ops
    def embed(self, table: QuantMatrix, ids: np.ndarray):
        ids = np.asarray(ids, np.int32).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= table.rows):
            raise LlogosError(f"token id outside the vocabulary [0, {table.rows})")
        return get_rows(self.k, table.raw, table.qtype, self.device_input("ids", ids))

    def matmul(self, x, w: QuantMatrix):
        return matmul(self.k, self._c(x), w, self._scratch)

    def add(self, a, b):
        return cuda_ops.add(self.k, self._c(a), self._c(b))

    def mul(self, a, b):
        return cuda_ops.mul(self.k, self._c(a), self._c(b))

    def scale(self, x, s: float):
        return cuda_ops.scale(self.k, self._c(x), s)

    def sigmoid(self, x):
        return cuda_ops.sigmoid(self.k, self._c(x))

    def silu(self, x):
        return cuda_ops.silu(self.k, self._c(x))

    def softplus(self, x):
        return cuda_ops.softplus(self.k, self._c(x))

    def rmsnorm(self, x, w, eps: float):
        return cuda_ops.rmsnorm(self.k, self._c(x), w, eps)

    def l2norm(self, x, eps: float):
        return cuda_ops.l2norm(self.k, self._c(x), eps)

    def rope(self, x, pos: np.ndarray, dims: int, base: float, freq_scale: float, neox: bool, factors=None):
        """Rotate the first `dims` features of each head of x (T, H, D) by position, each pair's
        frequency divided by its factor (Llama 3's rope_freqs; ones when the model has none)."""
        pos = self.device_input("pos", np.asarray(pos, np.int32))
        if factors is None:
            factors = self._ones.get(dims // 2)
            if factors is None:
                factors = self._ones[dims // 2] = self.xp.ones(dims // 2, np.float32)
        return cuda_ops.rope(self.k, self._c(x), pos, factors, dims, base, freq_scale, neox)

    def glu(self, gate, up, gelu: bool):
        return cuda_ops.glu(self.k, self._c(gate), self._c(up), gelu)

    # ---------------------------------------------------------------- attention
    def kv_cache(self, n_ctx: int, n_kv: int, dk: int, dv: int, type_k: str, type_v: str) -> KVCache:
        return cuda_attention.kv_cache(self.xp, n_ctx, n_kv, dk, dv, type_k, type_v)

    def kv_store(self, cache: KVCache, k, v, pos0: int) -> None:
        cuda_attention.kv_store(self.k, cache, self._c(k), self._c(v), self._positions(pos0, k.shape[0]))

    def attention(self, q, cache: KVCache, pos0: int, scale: float, window: int):
        """Causal attention of q (T, H, dk) at positions pos0.. over the cache; -> (T, H, dv)."""
        pos = self._positions(pos0, q.shape[0])
        return cuda_attention.attention(self.k, self._c(q), cache, pos0, pos, scale, window)

    # ---------------------------------------------------------------- recurrence (Gated DeltaNet)
    def zeros(self, shape: tuple[int, ...]):
        return self.xp.zeros(shape, np.float32)

    def ssm_conv(self, x, conv_state, w: QuantMatrix):
        """Causal depthwise convolution of x (T, C) after conv_state (K-1, C), advanced in place; -> (T, C)."""
        kernel = self._conv_kernels.get(id(w))
        if kernel is None:   # decoded once, on the first (prefill) call, never inside a captured graph
            kernel = get_rows(self.k, w.raw, w.qtype, self.xp.arange(w.rows, dtype=np.int32))  # (C, K) float32
            self._conv_kernels[id(w)] = kernel
        return cuda_recurrent.ssm_conv(self.k, self._c(x), conv_state, kernel)

    def delta_net(self, q, k, v, g, beta, state):
        """Gated delta rule over T tokens, advancing state (Hv, dv, dk) in place; -> (T, Hv, dv)."""
        c = self._c
        return cuda_recurrent.delta_net(self.k, c(q), c(k), c(v), c(g), c(beta), state)

    # ---------------------------------------------------------------- sampling
    def argmax(self, row) -> int:
        return int(self.to_host(cuda_ops.argmax(self.k, self._c(row)))[0])
