"""The reference backend: float32 NumPy on the CPU.

Two ways to hold the matrices used in products (`weights`, chosen by the loader):
- "f32": expanded once to float32; a product is one BLAS call, or, when several sequences decode
  together (`batched`), for 2-64 rows of a matrix of 64 K weights or more the compiled kernel of
  cpu_rows, which streams the weights once as a GEMV does. Decode is then bounded by streaming 4 bytes a weight from memory (see
  docs/PERF.md). The reference.
- "quantized": left in their GGUF blocks in the memory map and multiplied by the compiled kernels
  of cpu_quant; memory is the file's size.
Embedding tables stay quantized in the memory map and are dequantized a row at a time.
"""

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from llogos_cli.backends import MIN_PRODUCT_ROW, ROUTES_KEPT
from llogos_cli.backends.backend import glu_of_products
from llogos_cli.backends.cpu.cpu_threads import CpuThreads
from llogos_cli.backends.cpu.numpy_attention import STORED_TYPES, AttentionOps, Layout, compiled_view
from llogos_cli.backends.cpu.numpy_experts import ExpertOps
from llogos_cli.backends.cpu.numpy_kv_shift import KVShiftOps
from llogos_cli.backends.cpu.numpy_recurrent import RecurrentOps
from llogos_cli.errors import LlogosError
from llogos_cli.gguf import quants
from llogos_cli.gguf.file import drop_pages, drop_rows

WEIGHTS = ("f32", "quantized")
# Products of 2 to this many rows (prompt chunks; with batched, decode steps of several rows):
# OpenBLAS takes the row-major weights as the left operand, W·xᵀ, 10-30% faster than x·Wᵀ, but
# repacks them on every call (about 2.6 GEMVs at 16 rows), which cpu_rows' kernel does not
# (docs/PERF.md). One row is a GEMV; from here on x·Wᵀ is as fast and keeps the result C-ordered.
_FEW_ROWS = 64
# Embedding tables past this size give back the file pages a lookup mapped (drop_rows): smaller
# ones stay mapped, which costs less than the drops would (docs/PERF.md).
DROP_ROWS_BYTES = 64 << 20
DROP_ROWS_EVERY = 8


@dataclass(slots=True)
class Matrix:
    raw: np.ndarray                 # stored bytes (rows, bytes per row), memory-mapped
    qtype: GGMLQuantizationType
    dense: np.ndarray | None        # float32 (rows, cols) that products use; None: products read blocks
    in_products: bool
    blocks: np.ndarray | None = None   # the blocks products read: raw, or raw repacked (QuantMatmul.pack)

    @property
    def nbytes(self) -> int:
        """Bytes a product with this matrix reads (a lookup-only table reads a row per token)."""
        if not self.in_products:
            return 0
        return self.dense.nbytes if self.dense is not None else self.blocks.nbytes


@dataclass(frozen=True, slots=True)
class _Products:
    """How matmuls multiplies a list of matrices."""
    ws: list                    # held, so that no other matrix takes the identity of one
    route: object               # QuantMatmul's route of their products in blocks; None where one is float32
    columns: list | None        # where they were joined into one matrix: each one's columns of its product (slices)


def _warm_up_pairs(cache_types: tuple) -> list[tuple[str, str]]:
    """The (type_k, type_v) pairs a warm-up compiles for: float32's, and the run's own where given."""
    return list(dict.fromkeys([("f32", "f32"), *([tuple(cache_types)] if cache_types else [])]))


class NumpyBackend(AttentionOps, RecurrentOps, ExpertOps, KVShiftOps):
    name = "cpu"
    graphs = False               # no capture: the runner runs each decode step eagerly
    encoders = True              # layernorm, gelu and attention that is not causal

    def __init__(self, weights: str = "f32", batched: bool = False, threads: CpuThreads | None = None):
        """batched: several sequences will decode together, so float32 products of a few rows take
        cpu_rows' kernel, which is worth numba's import (time and memory at start-up) only then.
        threads: how many threads steps of one and of several tokens use (default: auto)."""
        if weights not in WEIGHTS:
            raise LlogosError(f"unknown CPU weights mode '{weights}' (choose from {', '.join(WEIGHTS)})")
        self.weights = weights
        self.threads = threads or CpuThreads()
        self._rope_key = None
        self._rope_turn = None
        self._rope_cos_sin = None
        self._rows = None
        self._routes: dict[tuple, _Products] = {}   # by the identities of a list's matrices
        self._joined: dict[tuple, _Products] = {}   # the products of matrices loaded as one, kept past _routes' clearing
        if batched:
            from llogos_cli.backends.cpu import cpu_rows
            self._rows = cpu_rows
        if weights == "quantized":   # imported here: numba's import and kernels cost the f32 path nothing
            from llogos_cli.backends.cpu.cpu_quant import QuantMatmul
            self.quant_matmul = QuantMatmul()
        # With numba loaded anyway, the small steps around the products are compiled loops too:
        # a decode step makes hundreds of them, where NumPy's calls cost more than their arithmetic.
        self._jit = batched or weights == "quantized"
        if self._jit:
            from llogos_cli.backends.cpu import cpu_glu, cpu_norm, cpu_quant_dequant, cpu_rope
            from llogos_cli.backends.cpu.cpu_attention import TILE, attend, store_rows
            self._norm, self._rope, self._glu, self._dequant = cpu_norm, cpu_rope, cpu_glu, cpu_quant_dequant
            self.compiled_attention, self.compiled_store, self.compiled_tile = attend, store_rows, TILE

    # ---------------------------------------------------------------- loading
    def vector(self, raw: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
        return quants.dequantize(raw.reshape(1, -1), qtype).reshape(-1)

    def matrix(self, raw: np.ndarray, qtype: GGMLQuantizationType, matmul: bool) -> Matrix:
        if not matmul:
            return Matrix(raw, qtype, None, False)
        if self.weights == "f32":
            return Matrix(raw, qtype, quants.dequantize(raw, qtype), True)
        if qtype == GGMLQuantizationType.F32:   # its bytes are the float32 matrix: use them in place
            return Matrix(raw, qtype, raw.view(np.float32), True)
        if quants.row_elements(raw, qtype) < MIN_PRODUCT_ROW:
            return Matrix(raw, qtype, quants.dequantize(raw, qtype), True)   # e.g. a conv kernel (C, 4)
        blocks = self.quant_matmul.pack(raw, qtype)
        if blocks is not raw:   # read from here on in the copy only (a tied table's rows come back on use)
            drop_pages(raw)
        return Matrix(raw, qtype, None, True, blocks)

    def matrices(self, raws: list[np.ndarray], qtype: GGMLQuantizationType) -> list[Matrix]:
        """Matrices whose products share an input (q, k and v; gate and up), held as one in blocks
        where QuantMatmul joins them, each matrix's blocks a view of its rows: one integer product
        for them all, with a single matrix's arguments (several matrices' cost a call more to pass;
        docs/PERF.md)."""
        if self.weights != "quantized" or not self.quant_matmul.joins(raws, qtype):
            return [self.matrix(raw, qtype, matmul=True) for raw in raws]
        joined = self.quant_matmul.pack_joined(raws, qtype)
        firsts = np.cumsum([0] + [raw.shape[0] for raw in raws]).tolist()
        columns = [slice(firsts[i], firsts[i + 1]) for i in range(len(raws))]
        ms = [Matrix(raw, qtype, None, True, joined[rows]) for raw, rows in zip(raws, columns)]
        self._joined[tuple(map(id, ms))] = _Products(ms, self.quant_matmul.route([(joined, qtype)]), columns)
        return ms

    @property
    def load_threads(self) -> int:
        """Threads that prepare weights at load time (NumPy releases the GIL while it dequantizes)."""
        return self.threads.load_threads

    @property
    def products(self) -> str | None:
        """What decode's products in the blocks multiply in (for --stats); None for float32 rows."""
        if self.weights != "quantized":
            return None
        from llogos_cli.backends.cpu.cpu_quant import ISA_NAMES
        return ISA_NAMES[self.quant_matmul.isa]

    def warm_up(self, product_types: set, experts: bool = False, progress=None, cache_types: tuple = ()) -> float:
        """Compile the kernels this backend will call on matrices of these block types (and, with
        experts, a mixture of experts' decode steps on them; with cache_types (type_k, type_v), the
        attention over such a KV cache besides float32's; numba caches them: on a machine's
        first run this takes seconds, later runs only load them), so no prompt's time includes it.
        Called before the weights are loaded, so that LLVM's pages are handed back before the
        weights take memory. Child processes compile them first (cpu_compile), and this one loads
        them; progress(CompileProgress) hears of each step that compiles. Returns the seconds
        spent compiling."""
        steps = self.warm_up_steps(product_types, experts, cache_types)
        if not steps:
            return 0.0
        from llogos_cli.backends.cpu import cpu_compile
        spent = cpu_compile.compile_in_children(
            {"weights": self.weights, "batched": self._rows is not None, "experts": experts,
             "types": sorted(int(t) for t in product_types), "cache_types": list(cache_types)},
            [name for name, _ in steps], progress)
        spent += cpu_compile.run_steps(steps, progress)
        from llogos_cli.backends.cpu.cpu_jit import release_compiler_pages
        release_compiler_pages()
        return spent

    def warm_up_steps(self, product_types: set, experts: bool = False, cache_types: tuple = ()) -> list:
        """(name, call) for each part of warm_up, the heaviest first. No two parts call one kernel
        (each its own modules'), so that processes may compile them at once: numba's cache index
        of a kernel is not safe to write from two."""
        # float32 matrices are BLAS's, as is every product in f32 mode
        types = product_types - {GGMLQuantizationType.F32} if self.weights == "quantized" else set()
        steps, blocks = [], []
        if self.weights == "quantized":
            integer, others = self.quant_matmul.warm_up_parts(types, experts)
            steps += [("integer products", integer)] if integer else []
            blocks += [others] if others else []
        if self._rows is not None:
            blocks.append(self._rows.warm_up)
        if self._jit:   # embed's rows come from cpu_quant_dequant, a block products' module
            blocks.append(lambda: self.embed(Matrix(np.zeros((1, 34), np.uint8), GGMLQuantizationType.Q8_0, None, False),
                                             np.zeros(1, np.int32)))
        if blocks:
            steps.append(("block products", lambda: [call() for call in blocks]))
        if self._jit:
            steps += [("attention", lambda: self._warm_up_attention(cache_types)),
                      ("norm, GLU and RoPE", lambda: self._warm_up_small_steps(cache_types))]
        return steps

    def _warm_up_attention(self, cache_types: tuple = ()) -> None:
        """float32 caches' attention, and that of the run's own types: the loop compiles once for
        each pair of the caches' element types (float32, float16's bits, packed bytes)."""
        x, one = np.ones((1, 1, 32), np.float32), np.zeros(1, np.int32)   # heads of 32: the 4-bit types' block
        layout = self.batch_layout(one, one)
        for type_k, type_v in _warm_up_pairs(cache_types):
            cache = self.kv_cache(1, 1, 1, 32, 32, type_k, type_v)
            self.kv_store(cache, x, x, layout)
            self.attention(x, cache, layout, 1.0, 0)

    def _warm_up_small_steps(self, cache_types: tuple = ()) -> None:
        """The small ops', and RoPE-and-store's into float32 caches and the run's own (where stored
        as rows: one compile for each pair of element types)."""
        x, one = np.ones((1, 1, 4), np.float32), np.zeros(1, np.int32)
        self.rmsnorm(x[0], x[0, 0], 1e-6)
        self.glu(x[0], x[0], False)
        self.rope(x, one, 4, 10000.0, 1.0, False)
        for types in (pair for pair in _warm_up_pairs(cache_types) if set(pair) <= STORED_TYPES):
            self.rope_kv_store(self.kv_cache(1, 1, 1, 4, 4, *types), x, x, x, self.batch_layout(one, one),
                               4, 10000.0, 1.0, False)

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return x

    def batch_layout(self, slots: np.ndarray, pos: np.ndarray) -> Layout:
        # Once per forward pass: the step's thread count follows from how many tokens it runs.
        threads = self.threads.for_step(len(slots))
        if self.weights == "quantized":
            self.quant_matmul.threads = threads
        return super().batch_layout(slots, pos)

    def synchronize(self) -> None:
        pass

    # ---------------------------------------------------------------- ops
    def embed(self, table: Matrix, ids: np.ndarray) -> np.ndarray:
        if table.dense is not None:
            return table.dense[ids]
        if table.raw.nbytes > DROP_ROWS_BYTES:   # what reading a row maps of the file runs to ~1 MB: a few at a time
            rows = np.empty((len(ids), table.raw.shape[1]), np.uint8)
            for i in range(0, len(ids), DROP_ROWS_EVERY):
                part = ids[i:i + DROP_ROWS_EVERY]
                rows[i:i + len(part)] = table.raw[part]
                drop_rows(table.raw, part)
        else:
            rows = table.raw[ids]
        if self._jit and table.qtype in self._dequant.TYPES:
            out = np.empty((len(ids), quants.row_elements(table.raw, table.qtype)), np.float32)
            self._dequant.dequantize_rows(rows, int(table.qtype), out)
            return out
        return quants.dequantize(rows, table.qtype)

    def matmul(self, x: np.ndarray, w: Matrix) -> np.ndarray:
        if w.dense is not None:
            if self._rows is not None and self._rows.takes(x.shape[0], w.dense):
                return self._rows.matmul_rows(x, w.dense)
            if not 1 < x.shape[0] <= _FEW_ROWS:
                return x @ w.dense.T
            return (w.dense @ x.T).T
        products = self._routes.get((id(w),)) or self._products([w])
        return self.quant_matmul.run(x, products.route)[0]

    def matmuls(self, x: np.ndarray, ws: list[Matrix]) -> list[np.ndarray]:
        """x times each of ws, which share it as their input: the quantized ones in one call."""
        products = self._routes.get(tuple(map(id, ws))) or self._products(ws)
        if products.route is None:
            return [self.matmul(x, w) for w in ws]
        if products.columns is None:
            return self.quant_matmul.run(x, products.route)
        out = self.quant_matmul.run(x, products.route)[0]   # the joined matrix's product: each w's columns
        if x.shape[0] == 1:
            return [out[:, columns] for columns in products.columns]
        return [np.ascontiguousarray(out[:, columns]) for columns in products.columns]

    def _products(self, ws: list[Matrix]) -> "_Products":
        """How matmuls multiplies ws, found once per list and kept."""
        if len(self._routes) >= ROUTES_KEPT:
            self._routes.clear()
        key = tuple(map(id, ws))
        products = self._joined.get(key)
        if products is None:
            route = None if any(w.dense is not None for w in ws) else self.quant_matmul.route([(w.blocks, w.qtype) for w in ws])
            products = _Products(list(ws), route, None)
        self._routes[key] = products
        return products

    def matmul_add(self, x: np.ndarray, w: Matrix, residual: np.ndarray) -> np.ndarray:
        out = self.matmul(x, w)
        if out.shape != residual.shape or out.dtype != residual.dtype:   # NumPy's broadcast and promotion
            return residual + out
        return np.add(residual, out, out=out)   # the product's own new array takes the sum

    def rmsnorm_matmuls(self, x: np.ndarray, norm: np.ndarray, eps: float, ws: list[Matrix]) -> list[np.ndarray]:
        return self.matmuls(self.rmsnorm(x, norm, eps), ws)

    def glu_matmuls(self, x: np.ndarray, gate: Matrix, up: Matrix, gelu: bool, norm: np.ndarray | None = None,
                    eps: float = 0.0) -> np.ndarray:
        return glu_of_products(self, x, gate, up, gelu, norm, eps)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a * b

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        return x * np.float32(s)

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        """cap * tanh(x / cap): x bounded to (-cap, cap) smoothly (Gemma 2's final logits)."""
        return np.tanh(x * np.float32(1 / cap)) * np.float32(cap)

    def sigmoid(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):   # exp(-x) = inf for x < -88 gives the right limit, 0
            return np.float32(1) / (np.float32(1) + np.exp(-x))

    def silu(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):   # as in sigmoid: the limit, -0
            return x / (np.float32(1) + np.exp(-x))

    def rmsnorm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        if self._jit and x.ndim == 2 and x.dtype == np.float32 and x.flags.c_contiguous and w.shape == x.shape[1:]:
            out = np.empty_like(x)   # the forward pass's usual rows, without reshaping them there and back
            self._norm.rmsnorm_rows(x, w, eps, out)
            return out
        if self._jit and w.shape == x.shape[-1:]:
            rows = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1])
            out = np.empty_like(rows)
            self._norm.rmsnorm_rows(rows, w, eps, out)
            return out.reshape(x.shape)
        ms = np.einsum("...i,...i->...", x, x)[..., None] / np.float32(x.shape[-1])
        return x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps))) * w

    def layernorm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
        centred = x - x.mean(axis=-1, keepdims=True)
        var = np.einsum("...i,...i->...", centred, centred)[..., None] / np.float32(x.shape[-1])
        return centred * (np.float32(1.0) / np.sqrt(var + np.float32(eps))) * w + b

    def l2norm(self, x: np.ndarray, eps: float) -> np.ndarray:
        ss = np.einsum("...i,...i->...", x, x)[..., None]
        return x * (np.float32(1.0) / np.sqrt(np.maximum(ss, np.float32(eps * eps))))

    def rope(self, x: np.ndarray, pos: np.ndarray, dims: int, base: float, freq_scale: float,
             neox: bool, factors: np.ndarray | None = None, attn_factor: float = 1.0) -> np.ndarray:
        """Rotate the first `dims` features of each head of x (T, H, D) by position. Pair i turns
        by pos * freq_scale * base^(-2i/dims) / factors[i] (factors: Llama 3's rope_freqs, Phi-3's
        long-context factors) and is scaled by attn_factor."""
        turn = self._rope_table(pos, dims, base, freq_scale, factors, attn_factor)   # (T, 1, dims/2) complex64
        if self._jit:
            out = np.empty(x.shape, np.float32)
            self._rope.rope_rows(np.ascontiguousarray(x, np.float32), *self._rope_cos_sin, neox, out)
            return out
        out = x.copy()
        if neox:   # pairs (i, i + dims/2), gathered into complex numbers and turned
            half = dims // 2
            z = np.empty(x.shape[:-1] + (half,), np.complex64)
            z.real, z.imag = x[..., :half], x[..., half:dims]
            z *= turn
            out[..., :half], out[..., half:dims] = z.real, z.imag
        else:      # pairs (2i, 2i + 1) are complex numbers in memory already
            out[..., :dims].view(np.complex64)[...] *= turn
        return out

    def rope_kv_store(self, cache, q: np.ndarray, k: np.ndarray, v: np.ndarray, layout, dims: int, base: float,
                      freq_scale: float, neox: bool, factors: np.ndarray | None = None,
                      attn_factor: float = 1.0) -> np.ndarray:
        """rope of q and k at the layout's positions, then kv_store of k and v; -> the turned q."""
        if self._jit and {cache.type_k, cache.type_v} <= STORED_TYPES:   # one compiled call for all four
            # every layer of the step alike: the table found once, kept with the step's layout (its
            # factors held there, so that no other array takes their identity while it is kept)
            key = ("rope", dims, base, freq_scale, id(factors), attn_factor)
            kept = layout.memo.get(key)
            if kept is None:
                self._rope_table(layout.pos, dims, base, freq_scale, factors, attn_factor)
                kept = layout.memo[key] = (factors, self._rope_cos_sin)
            first, at = layout.located(cache)
            out = np.empty(q.shape, np.float32)
            self._rope.rope_store_rows(np.ascontiguousarray(q, np.float32), np.ascontiguousarray(k, np.float32),
                                       np.ascontiguousarray(v, np.float32), *kept[1], neox, first, at,
                                       compiled_view(cache.k), compiled_view(cache.v), out)
            return out
        turn = (layout.pos, dims, base, freq_scale, neox, factors, attn_factor)
        q, k = self.rope(q, *turn), self.rope(k, *turn)
        self.kv_store(cache, k, v, layout)
        return q

    def _rope_table(self, pos: np.ndarray, dims: int, base: float, freq_scale: float, factors, attn_factor: float):
        # Every layer of a forward pass rotates at the same positions: compute the table once.
        key = (pos.tobytes(), dims, base, freq_scale, None if factors is None else factors.tobytes(), attn_factor)
        if self._rope_key != key:
            inv_freq = freq_scale * base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
            if factors is not None:
                inv_freq = inv_freq / factors.astype(np.float64)
            angle = pos.astype(np.float64)[:, None] * inv_freq[None, :]
            self._rope_key = key
            self._rope_turn = (attn_factor * np.exp(1j * angle)).astype(np.complex64)[:, None, :]
            self._rope_cos_sin = (np.ascontiguousarray(self._rope_turn.real[:, 0]),
                                  np.ascontiguousarray(self._rope_turn.imag[:, 0]))
        return self._rope_turn

    def gelu(self, x: np.ndarray) -> np.ndarray:
        """GELU in llama.cpp's tanh approximation (BERT's feed-forward), the GeGLU's without the up."""
        return self.glu(x, np.ones_like(x), True)

    def glu(self, gate: np.ndarray, up: np.ndarray, gelu: bool) -> np.ndarray:
        if self._jit and gate.ndim == 2:
            out = np.empty(gate.shape, np.float32)
            if gate.dtype == up.dtype == np.float32 and gate.flags.c_contiguous and up.flags.c_contiguous:
                self._glu.glu_rows(gate, up, gelu, out)
                return out
            self._glu.glu_rows(np.ascontiguousarray(gate, np.float32), np.ascontiguousarray(up, np.float32), gelu, out)
            return out
        if gelu:  # tanh approximation, as Gemma and llama.cpp use: ½ g (1 + tanh(√(2/π) g (1 + 0.044715 g²)))
            g = gate * gate   # in place from here: NumPy's gate ** 3 is a slow general power
            g *= np.float32(0.044715)
            g += np.float32(1)
            g *= gate
            g *= np.float32(0.7978845608028654)
            np.tanh(g, out=g)
            g += np.float32(1)
            g *= gate
            g *= np.float32(0.5)
        else:
            g = self.silu(gate)
        return g * up

    # ---------------------------------------------------------------- sampling
    def mask_logits(self, logits: np.ndarray, bits: np.ndarray) -> np.ndarray:
        n = logits.shape[1]
        allowed = np.unpackbits(np.ascontiguousarray(bits, np.uint32).view(np.uint8), axis=1, bitorder="little")[:, :n]
        out = np.full(logits.shape, -np.inf, np.float32)
        np.copyto(out[:, :allowed.shape[1]], logits[:, :allowed.shape[1]], where=allowed.astype(bool))
        return out

    def argmax_rows(self, logits: np.ndarray) -> np.ndarray:
        return np.argmax(logits, axis=1)
