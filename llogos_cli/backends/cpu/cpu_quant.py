"""The CPU's second `matmul`: products with GGUF matrices read in their blocks, never expanded.

Two shapes of product:
- where the CPU has integer dot products, every block type with 8-bit activations
  (cpu_quant_int8; `isa`: LLOGOS_CPU_ISA=vnni|avxvnni|avx2|float chooses, default the best there is), for
  any number of tokens: the rows, repacked at load (`pack`), are unpacked in registers once for
  every 4 tokens and dotted with their activations while in cache, rows shared out over every core;
- otherwise, or with `float`: up to DOT_MAX_TOKENS tokens with float32 activations
  (cpu_quant_dot), and for more tokens (batched decode, prefill) tiles of rows expanded to float32
  (cpu_quant_dequant) into one reused buffer and multiplied there, by cpu_rows for 2-64 rows, else
  by BLAS, so expanding a weight is paid once per tile, not once per token.
F16 and BF16 matrices always take the tile path.
"""

import os
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType

from llogos_cli.backends import CPU_DOT_TYPES, ROUTES_KEPT
from llogos_cli.backends.cpu import cpu_quant_dequant, cpu_quant_dot, cpu_quant_int8, cpu_rows
from llogos_cli.backends.cpu.cpu_jit import parts, share_out
from llogos_cli.backends.cpu.cpu_simd_int8 import ISA_ARG, host_isa, host_isas
from llogos_cli.backends.cpu.cpu_threads import available_cores
from llogos_cli.errors import LlogosError
from llogos_cli.gguf import quants
from llogos_cli.gguf.file import drop_pages

DOT_MAX_TOKENS = 4       # products of up to this many tokens in float32 activations take cpu_quant_dot
PACK_BYTES = 4 << 20    # a matrix is repacked this much at a time, so that its two copies are never both whole in memory
TILE_ELEMENTS = 1 << 20        # 4 MiB of float32 per tile
INT16_BLOCK = 256              # activations share one scale per this many elements (a K-quant block)
_NO_ROWS = np.empty((0, 0), np.uint8)   # a matrix of no rows and its product, padding the integer products' tuples
_NO_ROWS.flags.writeable = False
_NO_OUT = np.empty((0, 0), np.float32)
_PADDING = [(_NO_OUT,) * (cpu_quant_int8.MATRICES - n) for n in range(cpu_quant_int8.MATRICES + 1)]   # by real products
# Stand-ins for the per-token inputs a type's kernel does not read.
_NO_SUMS = np.empty((DOT_MAX_TOKENS, 0), np.float32)
_NO_INT16 = (np.empty((DOT_MAX_TOKENS, 2, 0), np.int16), np.empty((DOT_MAX_TOKENS, 2, 0), np.float32))


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (T, cols) as two int16 parts per 256 elements: q (T, 2, cols) and scales (T, 2, cols / 256)
    with x ≈ q[:, 0] · scale[:, 0] + q[:, 1] · scale[:, 1]. The first part is x rounded to 16 bits of
    its block's largest magnitude; the second, the remainder (at most half a step) rounded to 16
    bits of that step, which leaves each element within 2^-32 of its block's largest magnitude."""
    blocks = x.reshape(x.shape[0], -1, INT16_BLOCK)
    scale = np.empty((x.shape[0], 2, blocks.shape[1]), np.float32)
    scale[:, 0] = np.abs(blocks).max(axis=2) / np.float32(32767)
    scale[:, 1] = scale[:, 0] / np.float32(65534)
    step = np.where(scale == 0, np.float32(1), scale)[:, :, :, None].astype(np.float64)
    blocks = blocks.astype(np.float64)      # so that the remainder is exact and at most half a step
    first = np.rint(blocks / step[:, 0])
    second = np.clip(np.rint((blocks - first * scale[:, 0, :, None]) / step[:, 1]), -32767, 32767)
    q = np.stack([first, second], axis=1).astype(np.int16)
    return q.reshape(x.shape[0], 2, -1), scale


def _read_only(raw: np.ndarray) -> np.ndarray:
    """raw as a read-only C-order array (as memory-mapped weights are), without copying it if it is one."""
    if raw.flags.c_contiguous and not raw.flags.writeable:
        return raw
    view = np.ascontiguousarray(raw).view()
    view.flags.writeable = False
    return view


def _quantize8(x: np.ndarray, k_type: bool) -> tuple:
    """x's activations as the integer products of a K type or of a plain type take them."""
    arrays = _quantize8_arrays(x.shape[0], x.shape[1], k_type)
    (cpu_quant_int8.quantize_k_blocks if k_type else cpu_quant_int8.quantize_blocks)(x, *arrays)
    return arrays


def _quantize8_arrays(n_tok: int, cols: int, k_type: bool) -> tuple:
    """Arrays for the activations of n_tok tokens of cols features in either form (cpu_quant_int8's
    quantize_k_blocks, quantize_blocks)."""
    if k_type:
        return (np.empty((n_tok, cols), np.int8), np.empty((n_tok, cols // cpu_quant_int8.K_BLOCK), np.float32),
                np.empty((n_tok, cols // cpu_quant_int8.K_SUM), np.int32))
    blocks = cols // cpu_quant_int8.BLOCK
    return (np.empty((n_tok, cols), np.int8), np.empty((n_tok, blocks), np.float32), np.empty((n_tok, blocks), np.int32))


ISA_NAMES = {"vnni": "AVX-512 VNNI integer", "avxvnni": "AVX-VNNI integer", "avx2": "AVX2 integer", "float": "float32"}


def choose_isa(asked: str | None) -> str:
    """The instruction set of the integer products: `asked` (LLOGOS_CPU_ISA) if the CPU has it,
    else the best it has; "float" keeps every product in float32. A set the CPU lacks is refused
    here, so that its kernels are never compiled or run on it."""
    best = host_isa() or "float"
    if asked in (None, ""):
        return best
    if asked not in (*ISA_ARG, "float"):
        raise LlogosError(f"LLOGOS_CPU_ISA={asked} is not one of {', '.join(ISA_ARG)}, float")
    if asked != "float" and asked not in host_isas():
        raise LlogosError(f"LLOGOS_CPU_ISA={asked}: this CPU does not have it (best: {best})")
    return asked


def block_types(isa: str | None = None) -> frozenset:
    """The weight types whose products run in their blocks, never expanded: every type of the
    integer products where the CPU has them (isa as choose_isa takes it, default LLOGOS_CPU_ISA),
    else cpu_quant_dot's."""
    isa = choose_isa(isa if isa is not None else os.environ.get("LLOGOS_CPU_ISA"))
    return CPU_DOT_TYPES | cpu_quant_int8.TYPES if isa in ISA_ARG else CPU_DOT_TYPES


class QuantMatmul:
    """x (T, in) float32 · W (out, in)ᵀ for W given as raw GGUF rows; holds the reused tile buffer,
    the arrays the integer kernels quantize each product's activations into (by form and row
    length), and each list of matrices' route (q, k and v, gate and up share their input)."""

    def __init__(self, isa: str | None = None):
        self._tile = np.empty(0, np.float32)
        self.isa = choose_isa(isa if isa is not None else os.environ.get("LLOGOS_CPU_ISA"))
        self._routes: dict[tuple, _Route] = {}   # by the identities of their matrices
        self._buffers: dict[tuple, tuple] = {}   # the quantized activations' arrays, by form and row length
        self._isa_arg = ISA_ARG.get(self.isa)
        self.threads = available_cores()   # the threads products run on: the backend sets it each step

    def warm_up_parts(self, qtypes: set, experts: bool = False) -> tuple:
        """Two calls that, between them, call each kernel that products of matrices of these types
        take once, as products call them (weights read-only, as memory-mapped from the file), so
        that compiling or loading them from numba's cache is done there, and only theirs; with
        experts, a decode step's experts' too: the integer products' (cpu_quant_int8) and the other
        block products' (cpu_quant_dot, cpu_quant_dequant, cpu_rows), None where there is nothing
        to do. They share no kernel, so that separate processes may compile them at once (cpu_compile)."""
        integer = self.isa in ISA_ARG and bool(qtypes & cpu_quant_int8.TYPES)
        others = self.isa not in ISA_ARG or bool(qtypes - cpu_quant_int8.TYPES)
        return ((lambda: self._warm_up_integer(qtypes, experts)) if integer else None,
                (lambda: self._warm_up_blocks(qtypes)) if others else None)

    def _warm_up_integer(self, qtypes: set, experts: bool) -> None:
        # one matrix and several, each kernel of its own; each family's, plain and K
        for family, qtype, row_bytes in ((cpu_quant_int8.PLAIN_TYPES, QType.Q8_0, 34), (cpu_quant_int8.K_TYPES, QType.Q4_K, 144)):
            if not qtypes & family:
                continue
            cols = row_bytes // GGML_QUANT_SIZES[qtype][1] * GGML_QUANT_SIZES[qtype][0]
            rows = self.pack(_read_only(np.zeros((1, row_bytes), np.uint8)), qtype)
            self.many(np.zeros((1, cols), np.float32), [(rows, qtype)])
            self.many(np.zeros((1, cols), np.float32), [(rows, qtype), (rows, qtype)])
            if experts:   # one expert of a tile's rows
                stacked = self.pack(_read_only(np.zeros((cpu_quant_int8.TILE, row_bytes), np.uint8)), qtype)
                self.experts(np.zeros((1, cols), np.float32), stacked, qtype, np.zeros(1, np.int64), cpu_quant_int8.TILE)

    def _warm_up_blocks(self, qtypes: set) -> None:
        plain = _read_only(np.zeros((1, 34), np.uint8))
        if self.isa not in ISA_ARG and qtypes & CPU_DOT_TYPES:
            self._matvec(np.zeros((1, 32), np.float32), plain, QType.Q8_0)
        self._tiled(np.zeros((DOT_MAX_TOKENS + 1, 32), np.float32), plain, QType.Q8_0, 1, 32)
        cpu_rows.warm_up()
        if qtypes - block_types(self.isa):
            # no dot kernel (nor integer one): decode steps' products decode rows
            self._matvec_rows(np.zeros((1, 32), np.float32), plain, QType.Q8_0)

    def pack(self, raw: np.ndarray, qtype: QType) -> np.ndarray:
        """A matrix's rows as this object's products take them: repacked for the integer products
        (cpu_quant_int8.packed_rows), or as they are. Every matrix given to a product must come
        from here or from pack_joined."""
        return self.pack_joined([raw], qtype) if self._packs(qtype) else raw

    def joins(self, raws: list[np.ndarray], qtype: QType) -> bool:
        """Whether pack_joined takes these matrices: packed, of one row length, each but the last
        whole tiles."""
        return (self._packs(qtype) and len({raw.shape[1] for raw in raws}) == 1
                and all(raw.shape[0] % cpu_quant_int8.TILE == 0 for raw in raws[:-1]))

    def pack_joined(self, raws: list[np.ndarray], qtype: QType) -> np.ndarray:
        """Matrices that `joins` takes packed as one, rows after rows (read-only): one product for
        them all, each matrix's a view of its rows."""
        out = cpu_quant_int8.new_packed_rows(sum(raw.shape[0] for raw in raws), raws[0].shape[1], qtype)
        step = max(1, PACK_BYTES // raws[0].shape[1] // cpu_quant_int8.TILE) * cpu_quant_int8.TILE   # whole tiles
        first = 0
        for raw in raws:
            for r0 in range(0, raw.shape[0], step):   # a part at a time, each part's pages given back once read
                cpu_quant_int8.pack_rows(_read_only(raw[r0:r0 + step]), qtype, out[first + r0:first + r0 + step])
                drop_pages(raw[r0:r0 + step])
            first += raw.shape[0]
        out.flags.writeable = False
        return out

    def _packs(self, qtype: QType) -> bool:
        return self.isa in ISA_ARG and qtype in cpu_quant_int8.TYPES

    def _features(self, rows: np.ndarray, qtype: QType) -> tuple[int, ...]:
        """The feature count of the x a matrix from `pack` multiplies."""
        if self._packs(qtype) and qtype in cpu_quant_int8.K_TYPES:   # Q4_K's, Q5_K's scales a byte each
            per_row = cpu_quant_int8.K_TILED[qtype.name.lower()][0] // cpu_quant_int8.TILE
            return (rows.shape[1] // per_row * cpu_quant_int8.K_BLOCK,)
        return (quants.row_elements(rows, qtype),)

    def row_range(self, rows: np.ndarray, qtype: QType, first: int, n: int) -> np.ndarray | None:
        """Rows first..first+n-1 of a matrix from `pack` (an expert's part of a stacked matrix), as a
        matrix products take; None where the packing cannot be cut there (tiled rows, cut off a tile)."""
        if self._packs(qtype) and first % cpu_quant_int8.TILE:
            return None
        return rows[first:first + n]

    def experts(self, x: np.ndarray, rows: np.ndarray, qtype: QType, experts: np.ndarray, n: int) -> np.ndarray | None:
        """Row j of x (P, cols) times the n rows of expert experts[j] of a stacked matrix from `pack`
        -> (P, n), all pairs in one call (cpu_quant_int8.matvec8_experts); None where the matrix is
        not tiled for the integer products or an expert's rows are not whole tiles."""
        if not self._packs(qtype) or n % cpu_quant_int8.TILE:
            return None
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, np.float32)
        k_type = qtype in cpu_quant_int8.K_TYPES
        arrays = self._activation_arrays(x, k_type)
        out = np.empty((x.shape[0], n), np.float32)
        shares = parts(experts.size * (n // cpu_quant_int8.CHUNK), self.threads)
        cpu_quant_int8.matvec8_experts(rows, int(qtype), np.ascontiguousarray(experts, np.int64), x, *arrays, out,
                                       self._isa_arg, shares, cpu_quant_int8.FAMILY_ARG[k_type])
        return out

    def __call__(self, x: np.ndarray, raw: np.ndarray, qtype: QType) -> np.ndarray:
        return self.many(x, [(raw, qtype)])[0]

    def many(self, x: np.ndarray, matrices: list[tuple[np.ndarray, QType]]) -> list[np.ndarray]:
        """x times each (raw, qtype) matrix of the list, which share it as their input (q, k and v;
        gate and up): those of the integer products in one call for each form of activations."""
        return self.run(x, self.route(matrices))

    def route(self, matrices: list[tuple[np.ndarray, QType]]) -> "_Route":
        """How the list's products run (found once per list, and kept): a caller that keeps it can
        `run` them without looking it up again."""
        return self._routes.get(tuple([id(m[0]) for m in matrices])) or self._route(matrices)

    def run(self, x: np.ndarray, route: "_Route") -> list[np.ndarray]:
        """The products of a route's matrices with x."""
        one = route.one
        if one is not None and x.shape == one[0] and x.dtype == np.float32 and x.flags.c_contiguous:
            # one token through one integer call: the call's arguments were laid out with the route
            # (each product's Python ran about as long as the kernel of a small model's matrix)
            _, raw, code, arrays, chunks, family = one
            out = np.empty((1, raw.shape[0]), np.float32)
            cpu_quant_int8.matvec8_one(raw, code, x, *arrays, out, self._isa_arg, parts(chunks, self.threads), family)
            return [out]
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, np.float32)
        assert x.shape[1] in route.features, f"x has {x.shape[1]} features, not a row's of every matrix"
        if route.alone is not None:   # a decode step's usual case, in as little Python as it takes
            return self._matvec8(x, *route.alone)
        outs: list = [None] * len(route.matrices)
        for i in route.others:
            raw, qtype = route.matrices[i]
            if x.shape[0] <= DOT_MAX_TOKENS and qtype in CPU_DOT_TYPES:
                outs[i] = self._matvec(x, raw, qtype)
            elif x.shape[0] <= DOT_MAX_TOKENS and qtype in cpu_quant_dequant.TYPES:
                outs[i] = self._matvec_rows(x, raw, qtype)
            else:
                outs[i] = self._tiled(x, raw, qtype, raw.shape[0], x.shape[1])
        for k_type, chosen, plan in route.int8:
            for i, out in zip(chosen, self._matvec8(x, plan, k_type)):
                outs[i] = out
        return outs

    def _route(self, matrices: list[tuple[np.ndarray, QType]]) -> "_Route":
        """Which products of the list run in integers, in one call per form of activations, with
        their kernels' arguments: found once per list (held, so that no other array can take the
        identity of one of its matrices)."""
        chosen: dict[bool, list[int]] = {}   # K type or not -> the matrices
        others = []
        for i, (_, qtype) in enumerate(matrices):
            if self._packs(qtype):
                chosen.setdefault(qtype in cpu_quant_int8.K_TYPES, []).append(i)
            else:
                others.append(i)
        features = set.intersection(*(set(self._features(raw, qtype)) for raw, qtype in matrices))
        int8 = [(k_type, idx, self._plan([matrices[i] for i in idx])) for k_type, idx in chosen.items()]
        alone = (int8[0][2], int8[0][0]) if not others and len(int8) == 1 else None
        one = None
        if alone is not None and alone[0][3] == 1 and len(features) == 1:   # a single matrix's call for one token
            (plan, k_type), (cols,) = alone, features
            arrays = self._activation_arrays(np.empty((1, cols), np.float32), k_type)   # rows for DOT_MAX_TOKENS
            one = ((1, cols), plan[0][0], plan[1], arrays, plan[4], cpu_quant_int8.FAMILY_ARG[k_type])
        route = _Route(list(matrices), frozenset(features), others, int8, alone, one)
        if len(self._routes) >= ROUTES_KEPT:
            self._routes.clear()
        self._routes[tuple(id(raw) for raw, _ in matrices)] = route
        return route

    @staticmethod
    def _matvec(x: np.ndarray, raw: np.ndarray, qtype: QType) -> np.ndarray:
        out = np.empty((x.shape[0], raw.shape[0]), np.float32)
        xs = x.reshape(x.shape[0], -1, 32).sum(axis=2) if qtype in cpu_quant_dot.SUMS_TYPES else _NO_SUMS
        xq, dx = quantize_rows(x) if qtype in cpu_quant_dot.INT16_TYPES else _NO_INT16
        share_out(-(-raw.shape[0] // cpu_quant_dot.CHUNK))
        cpu_quant_dot.matvec(raw, int(qtype), x, xs, xq, dx, out)
        return out

    def _matvec8(self, x: np.ndarray, plan: tuple, k_type: bool) -> list[np.ndarray]:
        """The products of plan's matrices, x quantized in the kernel (_activation_arrays)."""
        raws, codes, firsts, n, chunks = plan
        arrays = self._activation_arrays(x, k_type)
        shares = parts(chunks, self.threads)
        if n == 1:
            out = np.empty((x.shape[0], raws[0].shape[0]), np.float32)
            cpu_quant_int8.matvec8_one(raws[0], codes, x, *arrays, out, self._isa_arg, shares, cpu_quant_int8.FAMILY_ARG[k_type])
            return [out]
        outs = tuple([np.empty((x.shape[0], raw.shape[0]), np.float32) for raw in raws[:n]]) + _PADDING[n]
        cpu_quant_int8.matvec8(raws, codes, firsts, x, *arrays, outs, self._isa_arg, shares, cpu_quant_int8.FAMILY_ARG[k_type])
        return list(outs[:n])

    def _activation_arrays(self, x: np.ndarray, k_type: bool) -> tuple:
        """Arrays for x's quantized activations in either form, kept by form and row length (as
        many rows as the most tokens yet; each product overwrites them)."""
        arrays = self._buffers.get((k_type, x.shape[1]))
        if arrays is None or arrays[0].shape[0] < x.shape[0]:
            arrays = self._buffers[(k_type, x.shape[1])] = _quantize8_arrays(max(x.shape[0], DOT_MAX_TOKENS),
                                                                             x.shape[1], k_type)
        return arrays

    @staticmethod
    def _plan(matrices: list[tuple[np.ndarray, QType]]) -> tuple:
        """The integer kernels' arguments for these matrices: the rows as MATRICES arrays of one
        numba type (as a tuple indexed at run time needs; padded with matrices of no rows), their
        type codes, where each one's chunks of rows start, how many are real, and the chunks."""
        pad = cpu_quant_int8.MATRICES - len(matrices)
        assert pad >= 0, f"at most {cpu_quant_int8.MATRICES} products in one call"
        raws = tuple(_read_only(raw) for raw, _ in matrices) + (_NO_ROWS,) * pad
        codes = np.array([int(qtype) for _, qtype in matrices] + [0] * pad, np.int64)
        firsts = np.zeros(len(raws) + 1, np.int64)
        firsts[1:] = np.cumsum([-(-raw.shape[0] // cpu_quant_int8.CHUNK) for raw in raws])
        if len(matrices) == 1:   # matvec8_one's arguments: the rows and a Python int
            return raws, int(codes[0]), firsts, 1, int(firsts[-1])
        return raws, codes, firsts, len(matrices), int(firsts[-1])

    @staticmethod
    def _matvec_rows(x: np.ndarray, raw: np.ndarray, qtype: QType) -> np.ndarray:
        out = np.empty((x.shape[0], raw.shape[0]), np.float32)
        share_out(-(-raw.shape[0] // cpu_quant_dequant.ROWS_A_SHARE))
        cpu_quant_dequant.matvec_rows(raw, int(qtype), x, out)
        return out

    def _tiled(self, x: np.ndarray, raw: np.ndarray, qtype: QType, rows: int, cols: int) -> np.ndarray:
        step = max(1, TILE_ELEMENTS // cols)
        if self._tile.size < min(step, rows) * cols:
            self._tile = np.empty(min(step, rows) * cols, np.float32)
        out = np.empty((x.shape[0], rows), np.float32)
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            tile = self._tile[:(r1 - r0) * cols].reshape(r1 - r0, cols)
            cpu_quant_dequant.dequantize_rows(raw[r0:r1], int(qtype), tile)
            if cpu_rows.takes(x.shape[0], tile):
                cpu_rows.matmul_rows(x, tile, out[:, r0:r1])
            else:
                out[:, r0:r1] = x @ tile.T
        return out


@dataclass(frozen=True, slots=True)
class _Route:
    matrices: list        # held: their identities are the key
    features: frozenset   # the feature counts of an x that every matrix multiplies
    others: list          # the matrices not multiplied in integers
    int8: list            # (K types or not, their indices, their kernels' arguments)
    alone: tuple | None   # (arguments, K types or not) where one integer call makes every product
    one: tuple | None     # (x's shape, rows, type code, activation arrays, chunks, family): where alone's is
                          # one matrix, the call for a single token (a decode step's) without looking any of it up
