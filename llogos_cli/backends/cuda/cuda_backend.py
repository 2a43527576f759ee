"""The CUDA backend: the NumPy backend's operations on device arrays, in hand-written kernels.

Weights are uploaded as their GGUF bytes and decoded inside the kernels; activations are float32
(few-token products with big matrices take them in 8 bits, cuda_matmul.int8_pays: quantized by the
RMSNorm or GLU that made them, else on the way in; so do prompts' products with the int8 types on
a GPU with int8 tensor cores, cuda_matmul.mma_pays);
the KV cache defaults to f16 (f32, q8_0, q4_0 and iq4_nl on request, like llama.cpp's --cache-type-k/-v).
Kernels are reached through a provider: cuda_kernels.CudaKernels (CuPy) on a GPU, the CPU
emulator in the tests.

Host inputs (token ids, slots, positions) go into device buffers that are rewritten in place while
their shape stays the same, and the kernels read slots and positions from there: a decode step
captured in a CUDA graph (engine/decode_graph) replays for other rows at later positions once those buffers
are updated.
"""

import dataclasses
import os

import numpy as np
from gguf import GGMLQuantizationType

from llogos_cli.backends import MIN_PRODUCT_ROW
from llogos_cli.backends.backend import glu_of_products
from llogos_cli.backends.cuda import cuda_attention, cuda_batch, cuda_experts, cuda_ops, cuda_recurrent, cuda_rope_store
from llogos_cli.backends.cuda.cuda_attention import KVCache
from llogos_cli.backends.cuda.cuda_batch import Layout
from llogos_cli.backends.cuda.cuda_matmul import (
    QuantMatrix,
    GEMM_MIN_TOKENS,
    MATVEC_MAX_TOKENS,
    MATVEC_NORM_COLS,
    Q8_RUN,
    Scratch,
    get_rows,
    int8_pays,
    launch_bound,
    mma_pays,
    pair_q8,
    matmul,
    matvec_glu,
    matvec_q8_glu,
    matvec_q8_pair,
    matvec_norm,
    q8_buffers,
    quantize_q8,
    upload,
)
from llogos_cli.errors import LlogosError
from llogos_cli.gguf import quants


PRODUCTS = ("int8", "float")


def choose_products(products: str | None) -> str:
    products = products or os.environ.get("LLOGOS_CUDA_PRODUCTS") or PRODUCTS[0]
    if products not in PRODUCTS:
        raise LlogosError(f"LLOGOS_CUDA_PRODUCTS={products!r} is not one of {', '.join(PRODUCTS)}")
    return products


class CudaBackend:
    name = "cuda"
    graphs = True                # capture(fn): the runner replays decode steps from CUDA graphs
    load_threads = 1             # uploads stay on the thread that owns the CUDA context and stream
    encoders = True              # layernorm, gelu and attention that is not causal (BERT)

    def __init__(self, kernels=None, products: str | None = None):
        """products: "int8" (products with INT8_TYPES multiply 8-bit activations: a few tokens' with
        big matrices, and many tokens' where the GPU has int8 tensor cores) or
        "float" (float32 activations throughout); default LLOGOS_CUDA_PRODUCTS, else int8."""
        self.products = choose_products(products)
        if kernels is None:
            from llogos_cli.backends.cuda.cuda_kernels import CudaKernels
            kernels = CudaKernels()
        self.kernels, self.xp = kernels, kernels.xp
        self._scratch = Scratch(self.xp)
        self._inputs: dict[str, tuple[np.ndarray, object]] = {}  # name -> (host copy, device buffer)
        self._ones: dict[int, object] = {}                       # rope factors of models without any
        # matrices() by their ids: (joined, first rows, the parts, held so that no other matrix takes their ids)
        self._joined: dict[tuple, tuple[QuantMatrix, list[int], list[QuantMatrix]]] = {}
        self._x8 = None   # (activations, their 8-bit form) from the last RMSNorm, GLU or attention that made both
        self._grouped = None   # (experts, their cuda_experts.Grouping): a layer's products share its routing
        self._capturing = False

    # ---------------------------------------------------------------- loading
    def vector(self, raw: np.ndarray, qtype: GGMLQuantizationType):
        return self.xp.asarray(quants.dequantize(raw.reshape(1, -1), qtype).reshape(-1))

    def matrix(self, raw: np.ndarray, qtype: GGMLQuantizationType, matmul: bool):
        if quants.row_elements(raw, qtype) < MIN_PRODUCT_ROW:   # a convolution kernel (C, K), float32 for ssm_conv
            return self.xp.asarray(quants.dequantize(raw, qtype))
        return upload(self.xp, raw, qtype, matmul)  # products and lookups both read the quantized bytes

    def matrices(self, raws: list[np.ndarray], qtype: GGMLQuantizationType) -> list:
        """Matrices whose products share an input (q, k and v; gate and up), uploaded as one whose
        rows each returned matrix views: one launch for them all in a one-token step (matmuls).
        Joined where each matrix's first row is 16-byte aligned in the output (rows a multiple of 4)."""
        firsts = np.cumsum([0] + [raw.shape[0] for raw in raws]).tolist()
        if (quants.row_elements(raws[0], qtype) < MIN_PRODUCT_ROW or len({raw.shape[1] for raw in raws}) > 1
                or any(first % 4 for first in firsts)):
            return [self.matrix(raw, qtype, matmul=True) for raw in raws]
        joined = upload(self.xp, np.concatenate(raws), qtype, True)
        ms = [dataclasses.replace(joined, raw=joined.raw[a:b], rows=b - a) for a, b in zip(firsts, firsts[1:])]
        self._joined[tuple(map(id, ms))] = (joined, firsts, ms)
        return ms

    def warm_up(self, product_types: set, experts: bool = False, progress=None, cache_types: tuple = ()) -> float:
        """Kernels compile (NVRTC, cached) as each op is first launched: nothing to do ahead."""
        return 0.0

    def to_host(self, x) -> np.ndarray:
        return self.kernels.to_host(x)

    def synchronize(self) -> None:
        self.kernels.synchronize()

    def capture(self, fn):
        """Record the GPU work of fn() into a CUDA graph without running it: -> (graph, fn's result);
        graph.launch() replays it (the runner's decode steps, engine/decode_graph.py)."""
        self._capturing = True   # no waits for the GPU in a graph: prompts' expert grouping stays out
        try:
            return self.kernels.capture(fn)
        finally:
            self._capturing = False

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

    def _c(self, x):
        return self.xp.ascontiguousarray(x)

    # ---------------------------------------------------------------- batch
    def batch_layout(self, slots: np.ndarray, pos: np.ndarray) -> Layout:
        """The runs of a forward pass's batch, with its slots and positions in device buffers."""
        slots, pos = np.asarray(slots, np.int32), np.asarray(pos, np.int32)
        return cuda_batch.batch_layout(slots, pos, self.device_input("slots", slots), self.device_input("pos", pos))

    # ---------------------------------------------------------------- ops
    def embed(self, table: QuantMatrix, ids: np.ndarray):
        ids = np.asarray(ids, np.int32).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= table.rows):
            raise LlogosError(f"token id outside the vocabulary [0, {table.rows})")
        return get_rows(self.kernels, table.raw, table.qtype, self.device_input("ids", ids))

    def matmul(self, x, w: QuantMatrix):
        return self.matmuls(x, [w])[0]

    def matmul_add(self, x, w: QuantMatrix, residual):
        """residual + x · wᵀ: a few tokens' residual is added in the products' epilogue."""
        return self.matmuls(x, [w], self._c(residual))[0]

    def matmuls(self, x, ws: list[QuantMatrix], add=None) -> list:
        """Products sharing x: a few tokens' activations are quantized once for all of them (by
        the RMSNorm or GLU that made x, where it did). add: one product's residual (matmul_add)."""
        made = self._made_for(x)
        x, x8 = self._c(x), None
        if self._takes_int8(x.shape[0], ws):
            x8 = made if made is not None else quantize_q8(self.kernels, x)
        assert add is None or len(ws) == 1
        products, ys = self._products(ws, x.shape[0] == 1), []
        if x8 is not None and x.shape[0] == 1 and len(products) == 2 and pair_q8(products[0][0], products[1][0]):
            return self._pair_q8(x8, products)
        for w, firsts in products:
            y = matmul(self.kernels, x, w, self._scratch, x8, add)
            ys += [y] if firsts is None else [y[:, a:b] for a, b in zip(firsts, firsts[1:])]
        return ys

    def _pair_q8(self, x8, products: list) -> list:
        """One token's 8-bit products with two matrices of different types (q and k joined, v; each
        with its first rows as _products gives them) in one launch (cuda_matmul.matvec_q8_pair)."""
        (a, firsts_a), (b, firsts_b) = products
        y = self.xp.empty((1, a.rows + b.rows), np.float32)
        matvec_q8_pair(self.kernels, x8, a, b, y)
        bounds = (firsts_a or [0, a.rows]) + [a.rows + first for first in (firsts_b or [0, b.rows])[1:]]
        return [y[:, lo:hi] for lo, hi in zip(bounds, bounds[1:])]

    def rmsnorm_matmuls(self, x, norm, eps: float, ws: list[QuantMatrix]) -> list:
        """matmuls(rmsnorm(x, norm, eps), ws): one token's launch-bound float products normalize x
        themselves (cuda_matmul.matvec_norm, the same bits), which saves the norm's launch; bigger
        products would read the row again in each thread block, and take rmsnorm's instead."""
        if not self._norm_fuses(x, ws):
            return self.matmuls(self.rmsnorm(x, norm, eps), ws)
        x, ys = self._c(x), []
        for w, firsts in self._products(ws, True):
            y = self.xp.empty((1, w.rows), np.float32)
            matvec_norm(self.kernels, x, norm, eps, w, y)
            ys += [y] if firsts is None else [y[:, a:b] for a, b in zip(firsts, firsts[1:])]
        return ys

    def glu_matmuls(self, x, gate: QuantMatrix, up: QuantMatrix, gelu: bool, norm=None, eps: float = 0.0):
        """glu of x's products with gate and up, x normed by norm first where given: a few tokens'
        float products with gate and up joined (matrices()) in one launch with the GLU and, for one
        token where rmsnorm_matmuls would, the norm (cuda_matmul.matvec_glu, the same bits). One
        token's 8-bit products with them joined apply the GLU and quantize its output for the down
        product in the same launch (cuda_matmul.matvec_q8_glu, the same bits)."""
        joined, n_tok = self._joined.get((id(gate), id(up))), x.shape[0]
        if joined is not None and n_tok == 1 and gate.rows == up.rows and self._takes_int8(1, [gate, up]):
            y8 = self._q8_for((1, gate.rows))
            if y8 is not None:
                x = x if norm is None else self.rmsnorm(x, norm, eps)
                x8 = self._made_for(x) or quantize_q8(self.kernels, self._c(x))
                y = self.xp.empty((1, gate.rows), np.float32)
                matvec_q8_glu(self.kernels, x8, joined[0], gelu, y, y8)
                return self._made(y, y8)
        if (joined is None or gate.rows != up.rows or not 0 < n_tok <= MATVEC_MAX_TOKENS
                or self._takes_int8(n_tok, [gate, up])):
            return glu_of_products(self, x, gate, up, gelu, norm, eps)
        if norm is not None and not self._norm_fuses(x, [gate, up]):
            x, norm = self.rmsnorm(x, norm, eps), None
        y = self.xp.empty((n_tok, gate.rows), np.float32)
        matvec_glu(self.kernels, self._c(x), joined[0], gelu, y, norm, eps)
        return y

    def _norm_fuses(self, x, ws: list[QuantMatrix]) -> bool:
        """Whether products of x with ws normalize x themselves (rmsnorm_matmuls)."""
        return (x.shape == (1, ws[0].cols) and ws[0].cols <= MATVEC_NORM_COLS and launch_bound(ws)
                and not self._takes_int8(1, ws))

    def _takes_int8(self, n_tok: int, ws: list[QuantMatrix]) -> bool:
        """Whether products of n_tok tokens' activations with ws multiply them in 8 bits: few tokens
        in integer dot products, many on int8 tensor cores."""
        if self.products != "int8":
            return False
        return int8_pays(ws) if n_tok < GEMM_MIN_TOKENS else mma_pays(self.kernels, ws)

    def _products(self, ws: list[QuantMatrix], one_row: bool) -> list[tuple[QuantMatrix, list[int] | None]]:
        """ws as the products that multiply them: for one row, each run that matrices() joined as
        the joined matrix and its parts' first rows (each part's columns of the joined product are
        contiguous), every other matrix alone (None)."""
        products, i = [], 0
        while i < len(ws):
            n = next((n for n in range(len(ws) - i, 1, -1) if one_row and tuple(map(id, ws[i:i + n])) in self._joined), 1)
            products.append(self._joined[tuple(map(id, ws[i:i + n]))][:2] if n > 1 else (ws[i], None))
            i += n
        return products

    def add(self, a, b):
        return cuda_ops.add(self.kernels, self._c(a), self._c(b))

    def mul(self, a, b):
        return cuda_ops.mul(self.kernels, self._c(a), self._c(b))

    def scale(self, x, s: float):
        return cuda_ops.scale(self.kernels, self._c(x), s)

    def softcap(self, x, cap: float):
        return cuda_ops.softcap(self.kernels, self._c(x), cap)

    def sigmoid(self, x):
        return cuda_ops.sigmoid(self.kernels, self._c(x))

    def silu(self, x):
        return cuda_ops.silu(self.kernels, self._c(x))

    def softplus(self, x):
        return cuda_ops.softplus(self.kernels, self._c(x))

    def rmsnorm(self, x, w, eps: float):
        x8 = self._q8_for(x.shape)
        return self._made(cuda_ops.rmsnorm(self.kernels, self._c(x), w, eps, x8), x8)

    def _q8_for(self, shape: tuple):
        """Buffers for the 8-bit form of activations of this shape, where the op making them can
        fill them on the way (rows of whole runs, for the products that may take them next: a few
        tokens', and many tokens' where the GPU has int8 tensor cores), else None."""
        takes = shape[0] < GEMM_MIN_TOKENS or self.kernels.int8_mma   # many tokens: matmul_q8_mma's
        if self.products == "int8" and len(shape) == 2 and takes and shape[1] % Q8_RUN == 0:
            return q8_buffers(self.xp, shape)
        return None

    def _made(self, y, x8):
        if x8 is not None:
            self._x8 = (y, x8)
        return y

    def _made_for(self, x):
        """The 8-bit form _made kept for x: made with x, or with the array x views whole (the
        attention's (T, H, dv) output seen as (T, H * dv))."""
        if self._x8 is None:
            return None
        y, x8 = self._x8
        whole_view = x.base is y and x.size == y.size and x.flags.c_contiguous and x.shape == x8[0].shape
        return x8 if x is y or whole_view else None

    def layernorm(self, x, w, b, eps: float):
        return cuda_ops.layernorm(self.kernels, self._c(x), w, b, eps)

    def gelu(self, x):
        return cuda_ops.gelu(self.kernels, self._c(x))

    def l2norm(self, x, eps: float):
        return cuda_ops.l2norm(self.kernels, self._c(x), eps)

    def rope(self, x, pos: np.ndarray, dims: int, base: float, freq_scale: float, neox: bool, factors=None,
             attn_factor: float = 1.0):
        """Rotate the first `dims` features of each head of x (T, H, D) by position, each pair's
        frequency divided by its factor (Llama 3's rope_freqs, Phi-3's long-context factors; ones
        when the model has none), and scale them by attn_factor."""
        pos = self.device_input("pos", np.asarray(pos, np.int32))
        return cuda_ops.rope(self.kernels, self._c(x), pos, self._factors(dims, factors), dims, base, freq_scale, neox,
                             attn_factor)

    def _factors(self, dims: int, factors):
        if factors is None:
            factors = self._ones_of(dims // 2)
        return factors

    def _ones_of(self, n: int):
        """n factors of 1, kept: the frequency divisors of a rotation that has none."""
        if n not in self._ones:
            self._ones[n] = self.xp.ones(n, np.float32)
        return self._ones[n]

    def glu(self, gate, up, gelu: bool):
        x8 = self._q8_for(gate.shape)
        return self._made(cuda_ops.glu(self.kernels, self._c(gate), self._c(up), gelu, x8), x8)

    # ---------------------------------------------------------------- mixture of experts
    def route(self, logits, k: int, normalize: bool = True):
        """Each token's k most probable experts (T, k) and their probabilities (T, k), renormalised if normalize."""
        return cuda_experts.route(self.kernels, self._c(logits), k, normalize)

    def scale_rows(self, x, s):
        return cuda_experts.scale_rows(self.kernels, self._c(x), self._c(s))

    def matmul_experts(self, x, w: QuantMatrix, experts, n_expert: int, weights=None, bias=None):
        """x through each token's experts of the stacked w (plus their bias) -> (T, k, out); with
        weights, summed -> (T, out)."""
        grouping = None
        if experts.shape[0] >= cuda_experts.GROUP_MIN_TOKENS and not self._capturing:
            if self._grouped is None or self._grouped[0] is not experts:
                self._grouped = (experts, cuda_experts.group(self.kernels, experts, n_expert))
            grouping = self._grouped[1]
        return cuda_experts.matmul_experts(self.kernels, self._c(x), w, experts, n_expert, weights, bias,
                                           grouping, self._scratch, self.products == "int8" and self.kernels.int8_mma)

    def swiglu_oai(self, gate, up, alpha: float, limit: float):
        return cuda_experts.swiglu_oai(self.kernels, self._c(gate), self._c(up), alpha, limit)

    # ---------------------------------------------------------------- attention
    def kv_cache(self, n_slots: int, n_ctx: int, n_kv: int, dk: int, dv: int, type_k: str, type_v: str) -> KVCache:
        return cuda_attention.kv_cache(self.xp, n_slots, n_ctx, n_kv, dk, dv, type_k, type_v)

    def paged_kv_cache(self, tables, n_blocks: int, block_size: int, n_kv: int, dk: int, dv: int, type_k: str,
                       type_v: str) -> KVCache:
        return cuda_attention.paged_kv_cache(self.xp, tables, n_blocks, block_size, n_kv, dk, dv, type_k, type_v)

    def block_tables(self, n_rows: int, max_blocks: int):
        return self.xp.zeros((n_rows, max_blocks), np.int32)

    def write_block_table(self, tables, row: int, blocks: list[int]) -> None:
        """In place: a captured decode step keeps reading this array."""
        tables[row, :len(blocks)] = self.xp.asarray(np.asarray(blocks, np.int32))

    def kv_store(self, cache: KVCache, k, v, layout: Layout) -> None:
        cuda_attention.kv_store(self.kernels, cache, self._c(k), self._c(v), layout)

    def rope_kv_store(self, cache: KVCache, q, k, v, layout: Layout, dims: int, base: float, freq_scale: float,
                      neox: bool, factors=None, attn_factor: float = 1.0):
        """rope of q and k at the layout's positions, then kv_store of k and v, in one launch
        (cuda_rope_store); -> the turned q."""
        c = self._c
        return cuda_rope_store.rope_kv_store(self.kernels, cache, c(q), c(k), c(v), layout, self._factors(dims, factors),
                                             dims, base, freq_scale, neox, attn_factor)

    def attention(self, q, cache: KVCache, layout: Layout, scale: float, window: int, softcap: float = 0.0,
                  sinks=None, causal: bool = True):
        """Each query of q (T, H, dk) over its own slot's keys up to its position (not causal: up
        to its run's last, read from a device copy of the layout's ends); -> (T, H, dv)."""
        ends = None if causal else self.device_input("ends", layout.ends())
        shape = (q.shape[0], q.shape[1] * cache.dv)   # as the output projection takes it
        x8 = self._q8_for(shape) if cuda_attention.fused_only(layout) and cache.dv % Q8_RUN == 0 else None
        out = cuda_attention.attention(self.kernels, self._c(q), cache, layout, scale, window, softcap, sinks, ends, x8)
        return self._made(out, x8)

    def kv_shift(self, cache: KVCache, slot: int, src: int, n: int, delta: int, rope: tuple | None) -> None:
        cuda_attention.kv_shift(self.kernels, cache, slot, src, n, delta, rope, self._ones_of)

    # ---------------------------------------------------------------- recurrence (Gated DeltaNet, LFM2)
    def zeros(self, shape: tuple[int, ...]):
        return self.xp.zeros(shape, np.float32)

    def ssm_conv(self, x, conv_state, w, layout: Layout):
        """Causal depthwise convolution of x (T, C), each run after its slot's conv_state (n_slots,
        K-1, C), advanced in place, with the kernel w (C, K) that matrix() holds as float32; -> (T, C)."""
        return cuda_recurrent.ssm_conv(self.kernels, self._c(x), conv_state, w, layout)

    def delta_net(self, q, k, v, g, beta, state, layout: Layout):
        """Gated delta rule, each run advancing its slot's state (n_slots, Hv, dv, dk) in place;
        -> (T, Hv, dv)."""
        c = self._c
        return cuda_recurrent.delta_net(self.kernels, c(q), c(k), c(v), c(g), c(beta), state, layout)

    # ---------------------------------------------------------------- sampling
    def mask_logits(self, logits, bits: np.ndarray):
        return cuda_ops.mask_logits(self.kernels, self._c(logits), self.xp.asarray(bits, np.uint32))

    def argmax_rows(self, logits) -> np.ndarray:
        """Each row's argmax, taken on the device: only R ints cross to the host."""
        return self.to_host(cuda_ops.argmax_rows(self.kernels, self._c(logits)))
