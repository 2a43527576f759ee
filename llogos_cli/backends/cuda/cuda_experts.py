"""Launchers for the mixture-of-experts ops: the router's choice, the expert product and the
weighted sum of the experts' outputs (see numpy_experts.py for the same ops on the CPU).

The routing stays on the device: the product reads each (token, choice) pair's expert from device
memory, so a captured decode step replays for any routing. A pair's expert matrix is streamed for
that pair; grouping the pairs by expert (as the CPU does) would need the routing on the host.
"""

import numpy as np

from llogos_cli.backends.cuda.cuda_kernels import TYPE_SUFFIX, cdiv, check
from llogos_cli.backends.cuda.cuda_matmul import MATVEC_WARPS, QuantMatrix

MAX_PAIRS = 65535   # (token, choice) pairs per launch: the grid's y dimension
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


def matmul_experts(k, x, w: QuantMatrix, experts, n_expert: int, weights=None, bias=None):
    """x (T, in) or (T, k, in) through each token's experts (T, k) of the stacked w, plus each
    expert's row of bias (n_expert * out,) if given -> (T, k, out); with weights (T, k), the k
    outputs weighted and summed -> (T, out)."""
    check(x, np.float32, "x")
    check(experts, np.int32, "experts")
    check(w.raw, np.uint8, "w")
    n_tok, n_used = experts.shape
    out_rows = w.rows // n_expert
    assert w.rows % n_expert == 0 and x.shape[-1] == w.cols and x.shape[:-1] in ((n_tok,), (n_tok, n_used))
    y = k.xp.empty((n_tok, n_used, out_rows), np.float32)
    x_per_pair = np.int32(x.ndim == 3)
    fn = k.function("matvec_experts", f"matvec_experts_{TYPE_SUFFIX[w.qtype]}")
    per_launch = MAX_PAIRS // n_used   # whole tokens per launch
    for t0 in range(0, n_tok, per_launch):
        t1 = min(n_tok, t0 + per_launch)
        fn((cdiv(out_rows, MATVEC_WARPS), (t1 - t0) * n_used), (MATVEC_WARPS * 32,),
           (w.raw, x[t0:t1], y[t0:t1], experts[t0:t1], np.int32(w.cols), np.int32(out_rows), np.int32(n_used),
            x_per_pair))
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
