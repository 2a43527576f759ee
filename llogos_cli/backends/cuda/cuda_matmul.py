"""Products with quantized weights, and row lookups in them.

Weights stay on the GPU as the GGUF bytes. A product x (T, in) · W (out, in)ᵀ takes one of two
paths: for few tokens, matrix-vector kernels that decode each weight once per 8 tokens
(memory-bound, like decode itself); for many, W is dequantized to float16 in row chunks and
multiplied on tensor cores, which costs ~4.5 bytes of traffic per weight instead of ~0.6 but
serves every token at once. Below that, products with the common types can instead take the
activations quantized to 8 bits (quantize_q8) and multiply in integer dot products
(matvec_q8.cu, as llama.cpp's mmvq): a quarter of the activation traffic, at the cost of the
activations' rounding (half a step of max |x| / 127 per run of 32). Many tokens' products with
those types can likewise take 8-bit activations, on int8 tensor cores where the GPU has them
(matmul_q8_mma.cu, as llama.cpp's MMQ): W read once as stored, never dequantized to float16.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType

from llogos_cli.backends.cuda import cuda_ops
from llogos_cli.backends.cuda.cuda_kernels import TYPE_SUFFIX, cdiv, check
from llogos_cli.errors import LlogosError
from llogos_cli.gguf import quants

MATVEC_MAX_TOKENS = 8    # activation rows one matvec launch takes (MATVEC_MAX_TOKENS in matvec.cu)
MATVEC_WARPS = 4         # warps per matvec thread block
MATVEC_NORM_COLS = 4096  # the longest row the products that normalize their input take (matvec_rows.cuh)
# One-token products of these types give each warp two rows on matrices of this many rows or more,
# per activations: float32 (matvec.cu), whose activation loads bound Q4_K and Q8_0, and 8-bit
# (matvec_q8.cu), where two rows gain only for Q4_0 and Q6_K (PERF.md, CUDA on an H100, an H200).
MATVEC_ROWS2_TYPES = {"float": frozenset({QType.Q4_K, QType.Q8_0}), "int8": frozenset({QType.Q4_0, QType.Q6_K})}
MATVEC_ROWS2_MIN = 4096
# Few-token products of these types can multiply 8-bit activations (matvec_q8.cu, dot_q8.cuh).
INT8_TYPES = frozenset({QType.Q8_0, QType.Q4_0, QType.Q4_1, QType.Q4_K, QType.Q6_K})
# Types matmul_q8_mma multiplies on int8 tensor cores (mma_runs.cuh): a prompt's products, and
# mixture-of-experts prompts' expert products (cuda_experts).
MMA_TYPES = INT8_TYPES | {QType.Q5_0, QType.Q5_1, QType.Q5_K, QType.Q3_K, QType.MXFP4}
Q8_RUN = 32              # activations quantized per run of this many, each with its step and sum
# One token's 8-bit products with two matrices of these types (first, second) sharing an input run
# in one launch (matvec_q8_pair): q and k beside a v of more bits, as in llama.cpp's Q4_K_M.
INT8_PAIR_TYPES = frozenset({(QType.Q4_K, QType.Q6_K)})
# Products that share an input take 8-bit activations only when one of their matrices is this
# big: below, launch latency bounds them and quantizing costs a launch for nothing (PERF.md, CUDA).
INT8_MIN_BYTES = 1 << 20
# From this many tokens on, one f16 GEMM beats re-reading the quantized weights every 8 tokens.
GEMM_MIN_TOKENS = 32
# Tiles of the tensor-core products (matmul_q8_mma.cu): weight rows (or half as many, mma_rows)
# and tokens a thread block.
MMQ_ROWS, MMQ_TOKENS, MMQ_THREADS = 128, 64, 256
SCRATCH_ELEMENTS = 1 << 25  # f16 dequantization buffer (64 MiB): bigger matrices go in row chunks
_THREADS = 256

# Plain types are read 4 elements at a time (quant_blocks.cuh), and every type decodes this many
# elements per thread: the launchers size their grids by it.
_PLAIN_BLOCK = 4
_PART_ELEMENTS = {QType.F32: 4, QType.F16: 4, QType.BF16: 4, QType.Q8_0: 8, QType.Q4_0: 8, QType.Q4_1: 8, QType.Q5_0: 8, QType.Q5_1: 8,
                  QType.Q2_K: 16, QType.Q3_K: 16, QType.Q4_K: 32, QType.Q5_K: 32, QType.Q6_K: 16, QType.IQ4_NL: 8, QType.IQ4_XS: 16, QType.MXFP4: 8}


@dataclass(slots=True)
class QuantMatrix:
    raw: Any                 # device uint8 (rows, bytes per row): the GGUF bytes as stored
    qtype: QType
    rows: int
    cols: int
    in_products: bool        # False for a lookup-only table (an untied token_embd)

    @property
    def nbytes(self) -> int:
        """Bytes a product with this matrix reads (a lookup-only table reads a row per token)."""
        return self.raw.nbytes if self.in_products else 0


class Scratch:
    """A reusable float16 buffer for one dequantized matrix (or a row chunk of it)."""

    def __init__(self, xp, limit: int = SCRATCH_ELEMENTS):
        self.xp, self.limit, self.buf = xp, limit, None

    def rows(self, w: QuantMatrix) -> tuple[Any, int]:
        """The buffer, and how many rows of w fit in it at once."""
        n = max(w.cols, min(w.rows * w.cols, self.limit))
        if self.buf is None or self.buf.size < n:
            self.buf = self.xp.empty(n, np.float16)
        return self.buf, self.buf.size // w.cols


def _block_elements(qtype: QType) -> int:
    return GGML_QUANT_SIZES[qtype][0] if GGML_QUANT_SIZES[qtype][0] > 1 else _PLAIN_BLOCK


def upload(xp, raw: np.ndarray, qtype: QType, in_products: bool) -> QuantMatrix:
    quants.check_supported(qtype, "matrix")
    cols = quants.row_elements(raw, qtype)
    if cols % _block_elements(qtype):
        raise LlogosError(f"{qtype.name} matrices need rows of a multiple of {_PLAIN_BLOCK} elements, not {cols}")
    return QuantMatrix(xp.asarray(raw), qtype, raw.shape[0], cols, in_products)


def matmul(k, x, w: QuantMatrix, scratch: Scratch, x8=None, add=None):
    """x (T, in) float32 · W (out, in)ᵀ -> (T, out) float32, plus add (T, out) where given (in the
    matrix-vector kernels' epilogue); products multiply x8 (quantize_q8(k, x)) instead where given:
    below GEMM_MIN_TOKENS with a matrix of INT8_TYPES in matvec_q8, from there on with one of
    MMA_TYPES in matmul_q8_mma."""
    check(x, np.float32, "x")
    n_tok = x.shape[0]
    assert x.shape[1] == w.cols, f"x has {x.shape[1]} features, the matrix {w.cols}"
    y = k.xp.empty((n_tok, w.rows), np.float32)
    if n_tok < GEMM_MIN_TOKENS:
        int8 = x8 is not None and w.qtype in INT8_TYPES
        for t0 in range(0, n_tok, MATVEC_MAX_TOKENS):
            t1 = t0 + MATVEC_MAX_TOKENS
            rows = None if add is None else add[t0:t1]
            if int8:
                matvec_q8(k, (x8[0][t0:t1], x8[1][t0:t1]), w, y[t0:t1], add=rows)
            else:
                matvec(k, x[t0:t1], w, y[t0:t1], add=rows)
        return y
    if x8 is not None and w.qtype in MMA_TYPES:
        matmul_q8_mma(k, x8, w, y, mma_rows(k, w, n_tok))
        return y if add is None else cuda_ops.add(k, add, y)
    x16 = k.xp.empty(x.shape, np.float16)
    dequantize(k, x.view(np.uint8), QType.F32, x16)  # as astype(float16), in a kernel the emulator's graphs replay too
    buf, chunk = scratch.rows(w)
    for r0 in range(0, w.rows, chunk):
        r1 = min(w.rows, r0 + chunk)
        w16 = buf[:(r1 - r0) * w.cols].reshape(r1 - r0, w.cols)
        dequantize(k, w.raw[r0:r1], w.qtype, w16)
        k.gemm_f16(x16, w16, y[:, r0:r1])
    return y if add is None else cuda_ops.add(k, add, y)


def rows_per_warp(w: QuantMatrix, activations: str = "float") -> int:
    """Output rows each warp of a one-token product with w takes (see MATVEC_ROWS2_TYPES)."""
    return 2 if w.qtype in MATVEC_ROWS2_TYPES[activations] and w.rows >= MATVEC_ROWS2_MIN else 1


def rows_per_warp_q8(w: QuantMatrix) -> int:
    return rows_per_warp(w, "int8")


def matvec(k, x, w: QuantMatrix, y, rows_per_warp=rows_per_warp, add=None) -> None:
    """y (T, out) = x (T, in) · Wᵀ (+ add (T, out) where given) for T <= MATVEC_MAX_TOKENS."""
    check(x, np.float32, "x")
    check(w.raw, np.uint8, "w")
    _launch_matvec(k, "matvec", w, (w.raw, x), y, add, x.shape[0], rows_per_warp)


def matvec_norm(k, x, norm, eps: float, w: QuantMatrix, y) -> None:
    """y (1, out) = rmsnorm(x (1, in), norm) · Wᵀ in one launch (matvec.cu's matvec_norm_*), bit
    for bit cuda_ops.rmsnorm's then matvec's; rows of up to MATVEC_NORM_COLS."""
    check(x, np.float32, "x")
    check(norm, np.float32, "norm")
    check(w.raw, np.uint8, "w")
    assert x.shape == (1, w.cols) and norm.shape == (w.cols,) and w.cols <= MATVEC_NORM_COLS
    _launch_matvec(k, "matvec", w, (w.raw, x, norm), y, None, 1, rows_per_warp,
                   (np.float32(eps), np.int32(cuda_ops.row_threads(w.cols))))


def matvec_glu(k, x, w: QuantMatrix, gelu: bool, y, norm=None, eps: float = 0.0) -> None:
    """y (T, n) = glu(x · Gᵀ, x · Uᵀ) for w the gate and up matrices joined (2n rows, gate's first),
    x (T, in), T <= MATVEC_MAX_TOKENS, normed by norm first where given (one token), in one launch
    (matvec_glu.cu): bit for bit matvec's (matvec_norm's) products, then cuda_ops.glu."""
    check(x, np.float32, "x")
    check(w.raw, np.uint8, "w")
    check(y, np.float32, "y")
    n_tok, n = x.shape[0], w.rows // 2
    assert 0 < n_tok <= MATVEC_MAX_TOKENS and x.shape[1] == w.cols and y.shape == (n_tok, n) and w.rows == 2 * n
    grid, block, suffix = (cdiv(n, MATVEC_WARPS),), (MATVEC_WARPS * 32,), TYPE_SUFFIX[w.qtype]
    args = (w.raw, x, y, np.int32(w.cols), np.int32(n), np.int32(gelu))
    if n_tok > 1:
        assert norm is None
        k.function("matvec_glu", f"matvec_glu_batch_{suffix}")(grid, block, (*args, np.int32(n_tok)))
        return
    if norm is None:
        k.function("matvec_glu", f"matvec_glu_{suffix}")(grid, block, args)
        return
    check(norm, np.float32, "norm")
    assert norm.shape == (w.cols,) and w.cols <= MATVEC_NORM_COLS
    k.function("matvec_glu", f"matvec_norm_glu_{suffix}")(
        grid, block, (w.raw, x, norm, y, np.int32(w.cols), np.int32(n), np.float32(eps),
                      np.int32(cuda_ops.row_threads(w.cols)), np.int32(gelu)))


def launch_bound(ws: list[QuantMatrix]) -> bool:
    """Whether one token's products with ws are bound by their launch, not their bytes (INT8_MIN_BYTES)."""
    return max(w.raw.nbytes for w in ws) < INT8_MIN_BYTES


def _launch_matvec(k, module: str, w: QuantMatrix, inputs: tuple, y, add, n_tok: int, rows_per_warp,
                   norm: tuple = ()) -> None:
    """A launch of module's kernels for w (module matvec or matvec_q8, its kernels named after it):
    <module>_<type> or <module>_rows<R>_<type> for one token, <module>_batch_<type> for several;
    <module>_add_... with the residual add, which they take after the inputs; <module>_norm_...
    with the RMSNorm's (eps, threads) given as norm, which they take last."""
    check(y, np.float32, "y")
    assert 0 < n_tok <= MATVEC_MAX_TOKENS and y.shape == (n_tok, w.rows)
    if add is not None:
        check(add, np.float32, "add")
        assert add.shape == y.shape, f"the residual is {add.shape}, the product {y.shape}"
        module_name, inputs = f"{module}_add", (*inputs, add)
    else:
        module_name = f"{module}_norm" if norm else module
    args = (*inputs, y, np.int32(w.cols), np.int32(w.rows), *norm)
    block, suffix = (MATVEC_WARPS * 32,), TYPE_SUFFIX[w.qtype]
    if n_tok == 1:
        rows = rows_per_warp(w)
        name = f"{module_name}_{suffix}" if rows == 1 else f"{module_name}_rows{rows}_{suffix}"
        k.function(module, name)((cdiv(w.rows, MATVEC_WARPS * rows),), block, args)
    else:
        k.function(module, f"{module_name}_batch_{suffix}")((cdiv(w.rows, MATVEC_WARPS),), block, (*args, np.int32(n_tok)))


def int8_pays(ws: list[QuantMatrix]) -> bool:
    """Whether products sharing an input are worth quantizing it for (INT8_MIN_BYTES)."""
    return any(w.qtype in INT8_TYPES for w in ws) and not launch_bound(ws)


def mma_pays(k, ws: list[QuantMatrix]) -> bool:
    """Whether many tokens' products sharing an input are worth quantizing it for: where the GPU
    has int8 tensor cores and one of the matrices has a type matmul_q8_mma takes."""
    return k.int8_mma and any(w.qtype in MMA_TYPES for w in ws)


def q8_buffers(xp, shape: tuple[int, int]) -> tuple:
    """Empty (int8 (T, in), float32 (T, in // Q8_RUN, 2)) for activations of shape (T, in), in a
    multiple of Q8_RUN: each run of Q8_RUN as values and (step, step * sum of the values)."""
    assert shape[1] % Q8_RUN == 0, f"rows of {shape[1]} features do not split into runs of {Q8_RUN}"
    return xp.empty(shape, np.int8), xp.empty((shape[0], shape[1] // Q8_RUN, 2), np.float32)


def quantize_q8(k, x) -> tuple:
    """x (T, in) float32 -> its q8_buffers filled, for matvec_q8."""
    check(x, np.float32, "x")
    xq, xs = q8_buffers(k.xp, x.shape)
    k.function("quantize_q8", "quantize_q8")((cdiv(x.size, _THREADS),), (_THREADS,), (x, xq, xs, np.int32(x.size)))
    return xq, xs


def matvec_q8(k, x8: tuple, w: QuantMatrix, y, rows_per_warp=rows_per_warp_q8, add=None) -> None:
    """y (T, out) = x · Wᵀ (+ add where given) for T <= MATVEC_MAX_TOKENS and W of INT8_TYPES, x as
    quantize_q8 made it."""
    xq, xs = x8
    check(xq, np.int8, "xq")
    check(xs, np.float32, "xs")
    assert w.qtype in INT8_TYPES and xq.shape[1] == w.cols
    _launch_matvec(k, "matvec_q8", w, (w.raw, xq, xs), y, add, xq.shape[0], rows_per_warp)


def pair_q8(a: QuantMatrix, b: QuantMatrix) -> bool:
    """Whether one token's 8-bit products with a and b can be one matvec_q8_pair launch: types of
    INT8_PAIR_TYPES, each taking one row a warp alone (rows_per_warp_q8), b's first output 16-byte
    aligned (a's rows a multiple of 4, as joined matrices' are)."""
    return ((a.qtype, b.qtype) in INT8_PAIR_TYPES and a.cols == b.cols and a.rows % 4 == 0
            and rows_per_warp_q8(a) == rows_per_warp_q8(b) == 1)


def matvec_q8_pair(k, x8: tuple, a: QuantMatrix, b: QuantMatrix, y) -> None:
    """y (1, a.rows + b.rows) = x · [A; B]ᵀ for a and b as pair_q8 takes them, x as quantize_q8 made
    it, in one launch: bit for bit matvec_q8's two products side by side."""
    xq, xs = x8
    check(xq, np.int8, "xq")
    check(xs, np.float32, "xs")
    check(a.raw, np.uint8, "a")
    check(b.raw, np.uint8, "b")
    check(y, np.float32, "y")
    assert pair_q8(a, b) and xq.shape == (1, a.cols) and y.shape == (1, a.rows + b.rows)
    k.function("matvec_q8", f"matvec_q8_pair_{TYPE_SUFFIX[a.qtype]}_{TYPE_SUFFIX[b.qtype]}")(
        (cdiv(a.rows, MATVEC_WARPS) + cdiv(b.rows, MATVEC_WARPS),), (MATVEC_WARPS * 32,),
        (a.raw, b.raw, xq, xs, y, np.int32(a.cols), np.int32(a.rows), np.int32(b.rows)))


def matvec_q8_glu(k, x8: tuple, w: QuantMatrix, gelu: bool, y, y8: tuple) -> None:
    """y (1, n) = glu(x · Gᵀ, x · Uᵀ) for w the gate and up matrices of INT8_TYPES joined (2n rows,
    gate's first), x as quantize_q8 made it, and y8 (q8_buffers of y's shape) = quantize_q8(y), in
    one launch (matvec_q8_glu.cu): bit for bit matvec_q8's products, then cuda_ops.glu's with x8."""
    (xq, xs), (yq, ys) = x8, y8
    check(xq, np.int8, "xq")
    check(xs, np.float32, "xs")
    check(w.raw, np.uint8, "w")
    check(y, np.float32, "y")
    check(yq, np.int8, "yq")
    check(ys, np.float32, "ys")
    n = w.rows // 2
    assert w.qtype in INT8_TYPES and w.rows == 2 * n and n % Q8_RUN == 0 and xq.shape == (1, w.cols)
    assert y.shape == yq.shape == (1, n) and ys.shape == (1, n // Q8_RUN, 2)
    k.function("matvec_q8_glu", f"matvec_q8_glu_{TYPE_SUFFIX[w.qtype]}")(
        (n // Q8_RUN,), (Q8_RUN * 32,), (w.raw, xq, xs, y, yq, ys, np.int32(w.cols), np.int32(n), np.int32(gelu)))


def mma_rows(k, w: QuantMatrix, n_tok: int) -> int:
    """Rows a thread block of matmul_q8_mma takes: MMQ_ROWS, or half that where tiles of MMQ_ROWS
    would give the GPU fewer blocks than it has multiprocessors (small matrices, few tokens)."""
    return MMQ_ROWS if cdiv(w.rows, MMQ_ROWS) * cdiv(n_tok, MMQ_TOKENS) >= k.multiprocessors else MMQ_ROWS // 2


def matmul_q8_mma(k, x8: tuple, w: QuantMatrix, y, rows: int = MMQ_ROWS) -> None:
    """y (T, out) = x · Wᵀ for W of MMA_TYPES, x as quantize_q8 made it, on int8 tensor cores:
    tiles of `rows` (MMQ_ROWS or half that) rows by MMQ_TOKENS tokens, any T."""
    xq, xs = x8
    check(xq, np.int8, "xq")
    check(xs, np.float32, "xs")
    check(w.raw, np.uint8, "w")
    check(y, np.float32, "y")
    assert w.qtype in MMA_TYPES and xq.shape[1] == w.cols and y.shape == (xq.shape[0], w.rows)
    assert rows in (MMQ_ROWS, MMQ_ROWS // 2)
    form = "" if rows == MMQ_ROWS else f"_rows{rows}"
    k.function("matmul_q8_mma", f"matmul_q8_mma{form}_{TYPE_SUFFIX[w.qtype]}")(
        (cdiv(xq.shape[0], MMQ_TOKENS), cdiv(w.rows, rows)), (MMQ_THREADS,),
        (w.raw, xq, xs, y, np.int32(w.cols), np.int32(w.rows), np.int32(xq.shape[0])))


def dequantize(k, raw, qtype: QType, out) -> None:
    """Rows of raw GGUF bytes (rows, bytes per row) -> out (rows, cols) float16."""
    check(raw, np.uint8, "raw")
    check(out, np.float16, "out")
    rows, cols = out.shape
    assert raw.shape[0] == rows and quants.row_elements(raw, qtype) == cols and cols % _block_elements(qtype) == 0
    k.function("dequantize", f"dequantize_{TYPE_SUFFIX[qtype]}")(
        (cdiv(rows * cols // _PART_ELEMENTS[qtype], _THREADS),), (_THREADS,),
        (raw, out, np.int32(rows), np.int32(cols)))


def get_rows(k, raw, qtype: QType, ids):
    """Rows ids (device int32) of raw GGUF bytes (rows, bytes per row) -> (len(ids), cols) float32."""
    check(raw, np.uint8, "raw")
    check(ids, np.int32, "ids")
    cols = quants.row_elements(raw, qtype)
    assert cols % _block_elements(qtype) == 0
    y = k.xp.empty((ids.size, cols), np.float32)
    if ids.size:
        k.function("get_rows", f"get_rows_{TYPE_SUFFIX[qtype]}")(
            (cdiv(ids.size * cols // _PART_ELEMENTS[qtype], _THREADS),), (_THREADS,),
            (raw, ids, y, np.int32(cols), np.int32(ids.size)))
    return y
