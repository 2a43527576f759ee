"""Launchers for the mixture-of-experts ops: the router's choice, the expert product and the
weighted sum of the experts' outputs (see numpy_experts.py for the same ops on the CPU).

A few tokens' product (decode) stays on the device: matvec_experts reads each (token, choice)
pair's expert from device memory, so a captured decode step replays for any routing, and streams
that pair's expert matrix for it. A prompt's product groups its pairs by expert first (group:
moe_sort.cu, a counting sort on the GPU), so that each chosen expert's matrix is read once for all
of its tokens by an f16 GEMM (as cuda_matmul's prompt products) where it has EXPERT_GEMM_MIN_TOKENS
or more, else once per 8 of them (moe_matvec.cu's tiles), not once per token. Where the product
may take 8-bit activations on int8 tensor cores (mma) and the experts' type has them (MMA_TYPES),
the experts with EXPERT_MMA_MIN_TOKENS pairs or more take tiles of up to MMQ_TOKENS of their
pairs instead, all experts' in one launch (moe_matmul_q8_mma, as llama.cpp's MMQ for experts):
each expert's matrix read in its blocks once per MMQ_TOKENS tokens, never written out as f16.
Planning those launches takes the expert counts on the host, a wait for the GPU once a layer,
which a captured step could not replay.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from llogos_cli.backends.cuda.cuda_kernels import TYPE_SUFFIX, cdiv, check
from llogos_cli.backends.cuda.cuda_matmul import (
    MATVEC_WARPS,
    MMA_TYPES,
    MMQ_ROWS,
    MMQ_THREADS,
    MMQ_TOKENS,
    QuantMatrix,
    Scratch,
    dequantize,
    quantize_q8,
)

MAX_PAIRS = 65535   # (token, choice) pairs per launch: the grid's y dimension
# Tokens from which a product groups its pairs by expert: a prompt chunk's experts are shared by
# many tokens, while a few decode rows' pairs mostly choose apart and would pay the grouping's
# wait for nothing (a choice, not yet measured on a GPU).
GROUP_MIN_TOKENS = 16
SORT_THREADS = 256          # moe_sort's one block (MOE_SORT_THREADS in moe_sort.cu)
SORT_MAX_EXPERTS = 1024     # MOE_SORT_MAX_EXPERTS
TILE_TOKENS = 8             # grouped rows a moe_matvec tile takes (MOE_MATVEC_TOKENS)
# Experts with this many pairs or more take an f16 GEMM, the others moe_matvec's tiles. A GEMM
# first writes the expert's matrix out as f16 (2 bytes a weight, read again by cuBLAS) and costs
# two launches an expert; the tiles read the quantized matrix (~0.45-0.55 bytes a weight in
# Q3_K, Q4_K, MXFP4) once per TILE_TOKENS tokens, every expert in one launch. By bytes the tiles
# read less up to ~40 (f16 reads from L2) to ~80 tokens (from memory); unmeasured on a GPU so far
# (bench-moe prints the prompt's expert kernels and GEMMs).
EXPERT_GEMM_MIN_TOKENS = 64
# On int8 tensor cores, experts with this many pairs or more take moe_matmul_q8_mma's tiles, the
# others one moe_matvec tile each: with fewer pairs than a moe_matvec tile holds both read the
# expert's matrix once, and moe_matvec multiplies the activations unrounded (a choice by bytes,
# unmeasured on a GPU so far).
EXPERT_MMA_MIN_TOKENS = TILE_TOKENS
_THREADS = 256
ROUTE_WARPS = 4     # tokens a block of moe_route, a warp each
ROUTE_MAX_EXPERTS = 32 * 32   # moe_route keeps which of its (at most 32) experts a lane has chosen in 32 bits


def route(k, logits, n_used: int, normalize: bool = True):
    """logits (T, n_expert) -> experts (T, n_used) int32 and weights (T, n_used) float32, the
    chosen experts' probabilities, scaled to sum to 1 if normalize."""
    check(logits, np.float32, "logits")
    n_tok, n_expert = logits.shape
    assert n_expert <= ROUTE_MAX_EXPERTS, f"{n_expert} experts: moe_route takes at most {ROUTE_MAX_EXPERTS}"
    experts = k.xp.empty((n_tok, n_used), np.int32)
    weights = k.xp.empty((n_tok, n_used), np.float32)
    if n_tok:
        k.function("moe_route", "moe_route_f32")((cdiv(n_tok, ROUTE_WARPS),), (ROUTE_WARPS * 32,),
                                                  (logits, experts, weights, np.int32(n_tok), np.int32(n_expert),
                                                   np.int32(n_used), np.int32(normalize)))
    return experts, weights


@dataclass(frozen=True, slots=True)
class Grouping:
    """A batch's (token, choice) pairs grouped by expert, and the products planned on them."""
    order: Any                               # device int32 (P,): the pairs p = t * k + j, expert by expert
    gemms: tuple[tuple[int, int, int], ...]  # (expert, first, end) in order of the experts with EXPERT_GEMM_MIN_TOKENS pairs or more
    tiles: Any                               # device int32 (n_tiles, 3): (expert, first, count <= TILE_TOKENS) of the others'
    mma_tiles: Any                           # device int32 (n, 3): (expert, first, count <= MMQ_TOKENS) of the experts with EXPERT_MMA_MIN_TOKENS pairs or more
    mma_rest: Any                            # device int32 (n, 3): (expert, first, count <= TILE_TOKENS) of the others'


def group(k, experts, n_expert: int) -> Grouping:
    """The pairs of experts (T, k) grouped by expert on the device; the counts come to the host to
    plan the products."""
    check(experts, np.int32, "experts")
    assert n_expert <= SORT_MAX_EXPERTS, f"{n_expert} experts: moe_sort takes at most {SORT_MAX_EXPERTS}"
    order, offsets = k.xp.empty(experts.size, np.int32), k.xp.empty(n_expert + 1, np.int32)
    k.function("moe_sort", "moe_sort_i32")((1,), (SORT_THREADS,),
                                            (experts, order, offsets, np.int32(experts.size), np.int32(n_expert)))
    starts = k.to_host(offsets).tolist()
    gemms, tiles, mma_tiles, mma_rest = [], [], [], []
    for e, (a, b) in enumerate(zip(starts, starts[1:])):
        if b - a >= EXPERT_GEMM_MIN_TOKENS:
            gemms.append((e, a, b))
        else:
            tiles += _tiles(e, a, b, TILE_TOKENS)
        if b - a >= EXPERT_MMA_MIN_TOKENS:
            mma_tiles += _tiles(e, a, b, MMQ_TOKENS)
        else:
            mma_rest += _tiles(e, a, b, TILE_TOKENS)
    ends = np.cumsum([0, len(tiles), len(mma_tiles), len(mma_rest)])
    table = k.xp.asarray(np.array(tiles + mma_tiles + mma_rest, np.int32).reshape(-1, 3))   # one upload for the three plans
    return Grouping(order, tuple(gemms), *(table[a:b] for a, b in zip(ends, ends[1:])))


def _tiles(expert: int, first: int, end: int, size: int) -> list[tuple[int, int, int]]:
    return [(expert, t, min(size, end - t)) for t in range(first, end, size)]


def matmul_experts(k, x, w: QuantMatrix, experts, n_expert: int, weights=None, bias=None,
                   grouping: Grouping | None = None, scratch: Scratch | None = None, mma: bool = False):
    """x (T, in) or (T, k, in) through each token's experts (T, k) of the stacked w, plus each
    expert's row of bias (n_expert * out,) if given -> (T, k, out); with weights (T, k), the k
    outputs weighted and summed -> (T, out). With grouping (group(k, experts, n_expert)) and a
    scratch for the dequantized experts, the pairs are taken expert by expert; with mma too (a
    GPU with int8 tensor cores, products allowed 8-bit activations), on int8 tensor cores where
    w's type has them."""
    check(x, np.float32, "x")
    check(experts, np.int32, "experts")
    check(w.raw, np.uint8, "w")
    n_tok, n_used = experts.shape
    out_rows = w.rows // n_expert
    assert w.rows % n_expert == 0 and x.shape[-1] == w.cols and x.shape[:-1] in ((n_tok,), (n_tok, n_used))
    if grouping is not None:
        assert grouping.order.size == n_tok * n_used
        if mma and w.qtype in MMA_TYPES:
            y = _grouped_product_mma(k, x, w, grouping, n_used, out_rows)
        else:
            y = _grouped_product(k, x, w, grouping, n_used, out_rows, scratch)
    else:
        y = _pair_product(k, x, w, experts, out_rows)
    if bias is not None and y.size:
        check(bias, np.float32, "bias")
        assert bias.shape == (n_expert * out_rows,)
        k.function("moe_bias", "moe_bias_f32")((cdiv(y.size, _THREADS),), (_THREADS,),
                                                (y, bias, experts, np.int32(n_tok * n_used), np.int32(out_rows)))
    if weights is None:
        return y
    check(weights, np.float32, "weights")
    out = k.xp.empty((n_tok, out_rows), np.float32)
    if out.size:
        k.function("moe_combine", "moe_combine_f32")((cdiv(out.size, _THREADS),), (_THREADS,),
                                                      (y, weights, out, np.int32(n_tok), np.int32(n_used),
                                                       np.int32(out_rows)))
    return out


def _pair_product(k, x, w: QuantMatrix, experts, out_rows: int):
    """-> y (T, k, out), each pair's expert matrix streamed for that pair (matvec_experts)."""
    n_tok, n_used = experts.shape
    y = k.xp.empty((n_tok, n_used, out_rows), np.float32)
    fn = k.function("matvec_experts", f"matvec_experts_{TYPE_SUFFIX[w.qtype]}")
    per_launch = MAX_PAIRS // n_used   # whole tokens per launch
    for t0 in range(0, n_tok, per_launch):
        t1 = min(n_tok, t0 + per_launch)
        fn((cdiv(out_rows, MATVEC_WARPS), (t1 - t0) * n_used), (MATVEC_WARPS * 32,),
           (w.raw, x[t0:t1], y[t0:t1], experts[t0:t1], np.int32(w.cols), np.int32(out_rows), np.int32(n_used),
            np.int32(x.ndim == 3)))
    return y


def _grouped_product(k, x, w: QuantMatrix, grouping: Grouping, n_used: int, out_rows: int, scratch: Scratch):
    """-> y (T, k, out): the pairs' rows gathered expert by expert, each expert's matrix multiplied
    once by its rows (an f16 GEMM, or moe_matvec's tiles), and the results put back in pair order."""
    pairs = grouping.order.size
    yg = k.xp.empty((pairs, out_rows), np.float32)
    if grouping.tiles.shape[0]:
        _tiled_product(k, gather(k, x, grouping.order, n_used, np.float32), w, grouping.tiles, yg, out_rows)
    if grouping.gemms:
        xg16 = gather(k, x, grouping.order, n_used, np.float16)
        buf, chunk = scratch.rows(dataclasses.replace(w, raw=w.raw[:out_rows], rows=out_rows))   # an expert's shape
        for e, a, b in grouping.gemms:
            for r0 in range(0, out_rows, chunk):
                r1 = min(out_rows, r0 + chunk)
                w16 = buf[:(r1 - r0) * w.cols].reshape(r1 - r0, w.cols)
                dequantize(k, w.raw[e * out_rows + r0:e * out_rows + r1], w.qtype, w16)
                k.gemm_f16(xg16[a:b], w16, yg[a:b, r0:r1])
    return _scatter(k, yg, grouping.order, n_used, out_rows)


def _grouped_product_mma(k, x, w: QuantMatrix, grouping: Grouping, n_used: int, out_rows: int):
    """-> y (T, k, out) as _grouped_product, the experts with EXPERT_MMA_MIN_TOKENS pairs or more
    multiplied on int8 tensor cores (moe_matmul_q8_mma), x quantized to 8 bits per run before
    their rows are gathered."""
    yg = k.xp.empty((grouping.order.size, out_rows), np.float32)
    n_tiles = grouping.mma_tiles.shape[0]
    if grouping.mma_rest.shape[0]:
        _tiled_product(k, gather(k, x, grouping.order, n_used, np.float32), w, grouping.mma_rest, yg, out_rows)
    if n_tiles:
        xq, xs = gather_q8(k, quantize_q8(k, x.reshape(-1, x.shape[-1])), grouping.order, n_used, x.ndim == 3)
        rows = MMQ_ROWS if cdiv(out_rows, MMQ_ROWS) * n_tiles >= k.multiprocessors else MMQ_ROWS // 2
        form = "" if rows == MMQ_ROWS else f"_rows{rows}"
        k.function("matmul_q8_mma", f"moe_matmul_q8_mma{form}_{TYPE_SUFFIX[w.qtype]}")(
            (n_tiles, cdiv(out_rows, rows)), (MMQ_THREADS,),
            (w.raw, xq, xs, yg, grouping.mma_tiles, np.int32(w.cols), np.int32(out_rows)))
    return _scatter(k, yg, grouping.order, n_used, out_rows)


def _tiled_product(k, xg, w: QuantMatrix, tiles, yg, out_rows: int) -> None:
    """yg's rows of tiles (n, 3) = xg's · their expert's matrixᵀ, moe_matvec's float32 products."""
    fn = k.function("moe_matvec", f"moe_matvec_{TYPE_SUFFIX[w.qtype]}")
    for i0 in range(0, tiles.shape[0], MAX_PAIRS):
        part = tiles[i0:i0 + MAX_PAIRS]
        fn((cdiv(out_rows, MATVEC_WARPS), part.shape[0]), (MATVEC_WARPS * 32,),
           (w.raw, xg, yg, part, np.int32(w.cols), np.int32(out_rows)))


def _scatter(k, yg, order, n_used: int, out_rows: int):
    """The grouped rows yg (P, out) back in pair order -> (T, k, out)."""
    pairs = order.size
    y = k.xp.empty((pairs // n_used, n_used, out_rows), np.float32)
    if y.size:
        k.function("moe_scatter", "moe_scatter_f32")((cdiv(y.size, _THREADS),), (_THREADS,),
                                                      (yg, order, y, np.int32(pairs), np.int32(out_rows)))
    return y


def gather(k, x, order, n_used: int, dtype):
    """The rows of x (T, in) or (P, in) for the pairs in order (P,) -> (P, in) of dtype (float32 or float16)."""
    check(x, np.float32, "x")
    check(order, np.int32, "order")
    xg = k.xp.empty((order.size, x.shape[-1]), dtype)
    if xg.size:
        suffix = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}[np.dtype(dtype)]
        k.function("moe_gather", f"moe_gather_{suffix}")(
            (cdiv(xg.size, _THREADS),), (_THREADS,),
            (x, order, xg, np.int32(order.size), np.int32(x.shape[-1]), np.int32(n_used), np.int32(x.ndim == 3)))
    return xg


def gather_q8(k, x8: tuple, order, n_used: int, per_pair: bool) -> tuple:
    """quantize_q8's form (values (R, in), scales (R, in // 32, 2)) of rows x (T, in), or of x
    (P, in) if per_pair, for the pairs in order (P,) -> the same form of (P, in)."""
    xq, xs = x8
    check(xq, np.int8, "xq")
    check(xs, np.float32, "xs")
    check(order, np.int32, "order")
    n = xq.shape[1]
    xgq, xgs = k.xp.empty((order.size, n), np.int8), k.xp.empty((order.size, *xs.shape[1:]), np.float32)
    if xgq.size:
        k.function("moe_gather", "moe_gather_q8")(
            (cdiv(xgq.size // 4, _THREADS),), (_THREADS,),
            (xq, xs, order, xgq, xgs, np.int32(order.size), np.int32(n), np.int32(n_used), np.int32(per_pair)))
    return xgq, xgs


def scale_rows(k, x, s):
    """Row t of x (T, n) times s[t] (s: T values): the gate of a shared expert's output."""
    check(x, np.float32, "x")
    check(s, np.float32, "s")
    n_tok, n = x.shape
    assert s.size == n_tok
    y = k.xp.empty_like(x)
    if y.size:
        k.function("scale_rows", "scale_rows_f32")((cdiv(y.size, _THREADS),), (_THREADS,),
                                                    (x, s, y, np.int32(n_tok), np.int32(n)))
    return y


def swiglu_oai(k, gate, up, alpha: float, limit: float):
    """gpt-oss's clamped SwiGLU of the experts' gate and up products (see swiglu_oai.cu)."""
    check(gate, np.float32, "gate")
    check(up, np.float32, "up")
    assert gate.shape == up.shape
    y = k.xp.empty_like(gate)
    if y.size:
        k.function("swiglu_oai", "swiglu_oai_f32")((cdiv(y.size, _THREADS),), (_THREADS,),
                                                    (gate, up, y, np.int32(y.size), np.float32(alpha), np.float32(limit)))
    return y
