"""Launchers for the elementwise, normalization, rotary, softmax and argmax kernels.

Each takes the kernel provider `k` (see cuda_kernels), checks its arrays, allocates the output
and launches; outputs are new arrays, as the NumPy backend returns.
"""

import numpy as np

from llogos_cli.backends.cuda.cuda_kernels import cdiv, check

_THREADS = 256


def row_threads(ncols: int) -> int:
    """Threads for the one-block-per-row kernels: a warp for short rows (heads), 256 for long ones."""
    return 256 if ncols >= 1024 else 32


def _pointwise(k, module: str, name: str, inputs: tuple, *after):
    """A kernel of one thread an element: (inputs..., y, n, after...) -> y, shaped as inputs[0]."""
    for i, a in enumerate(inputs):
        check(a, np.float32, f"{name} input {i}")
    y = k.xp.empty_like(inputs[0])
    k.function(module, name)((cdiv(y.size, _THREADS),), (_THREADS,), (*inputs, y, np.int32(y.size), *after))
    return y


def _broadcast(k, module: str, a, b):
    """a op b with b repeated along a: b's shape must be a trailing part of a's."""
    assert a.shape[a.ndim - b.ndim:] == b.shape, f"{module}: cannot repeat {b.shape} along {a.shape}"
    return _pointwise(k, module, f"{module}_f32", (a, b), np.int32(b.size))


def add(k, a, b):
    return _broadcast(k, "add", a, b)


def mul(k, a, b):
    return _broadcast(k, "mul", a, b)


def scale(k, x, s: float):
    return _pointwise(k, "scale", "scale_f32", (x,), np.float32(s))


def sigmoid(k, x):
    return _pointwise(k, "sigmoid", "sigmoid_f32", (x,))


def silu(k, x):
    return _pointwise(k, "silu", "silu_f32", (x,))


def softplus(k, x):
    return _pointwise(k, "softplus", "softplus_f32", (x,))


def gelu(k, x):
    return _pointwise(k, "gelu", "gelu_f32", (x,))


def glu(k, gate, up, gelu: bool, x8=None):
    """act(gate) * up; with x8 (cuda_matmul.q8_buffers of its shape), also quantized into x8."""
    assert gate.shape == up.shape
    act = "geglu" if gelu else "swiglu"
    return _pointwise(k, "glu", f"{act}_f32", (gate, up)) if x8 is None else _pointwise(k, "glu", f"{act}_q8", (gate, up), *x8)


def rmsnorm(k, x, w, eps: float, x8=None):
    """Over the last dimension of x, weighted by w; with x8 (cuda_matmul.q8_buffers of x's
    shape), also quantized into x8."""
    check(x, np.float32, "x")
    check(w, np.float32, "w")
    ncols = x.shape[-1]
    assert w.shape == (ncols,)
    y = k.xp.empty_like(x)
    grid, block = (x.size // ncols,), (row_threads(ncols),)
    if x8 is None:
        k.function("rmsnorm", "rmsnorm_f32")(grid, block, (x, w, y, np.int32(ncols), np.float32(eps)))
    else:
        k.function("rmsnorm", "rmsnorm_q8")(grid, block, (x, w, y, *x8, np.int32(ncols), np.float32(eps)))
    return y


def layernorm(k, x, w, b, eps: float):
    """Over the last dimension of x: centred, scaled to unit variance, weighted by w, plus b."""
    check(x, np.float32, "x")
    check(w, np.float32, "w")
    check(b, np.float32, "b")
    ncols = x.shape[-1]
    assert w.shape == b.shape == (ncols,)
    y = k.xp.empty_like(x)
    k.function("layernorm", "layernorm_f32")((x.size // ncols,), (row_threads(ncols),),
                                             (x, w, b, y, np.int32(ncols), np.float32(eps)))
    return y


def l2norm(k, x, eps: float):
    check(x, np.float32, "x")
    ncols = x.shape[-1]
    y = k.xp.empty_like(x)
    k.function("l2norm", "l2norm_f32")((x.size // ncols,), (row_threads(ncols),),
                                       (x, y, np.int32(ncols), np.float32(eps)))
    return y


def rope(k, x, pos, factors, dims: int, base: float, freq_scale: float, neox: bool, attn_factor: float = 1.0):
    """Rotate the first `dims` features of each head of x (T, H, D) by the positions pos (device, T)
    and scale them by attn_factor; pair i's frequency is divided by factors[i] (device, dims/2)."""
    check(x, np.float32, "x")
    check(pos, np.int32, "pos")
    check(factors, np.float32, "factors")
    n_tok, n_head, head_dim = x.shape
    assert pos.shape == (n_tok,) and dims % 2 == 0 and dims <= head_dim and head_dim % 2 == 0
    assert factors.shape == (dims // 2,)
    y = k.xp.empty_like(x)
    k.function("rope", "rope_neox_f32" if neox else "rope_norm_f32")(
        (cdiv(x.size // 2, _THREADS),), (_THREADS,),
        (x, y, pos, factors, np.int32(n_tok), np.int32(n_head), np.int32(head_dim), np.int32(dims),
         np.float32(base), np.float32(freq_scale), np.float32(attn_factor)))
    return y


def softmax_lengths(k, x, lengths, window: int, scale: float, softcap: float = 0.0, sinks=None):
    """Softmax of each row of x (rows, n) * scale, soft-capped by softcap unless 0, over its last
    `window` columns before lengths[row] (all of them before it when window is 0); the other columns
    become 0. sinks (S,): the rows in S equal groups, group i's denominator joined by sinks[i]."""
    check(x, np.float32, "x")
    check(lengths, np.int32, "lengths")
    ncols = x.shape[-1]
    assert lengths.size == x.size // ncols
    if sinks is not None:
        check(sinks, np.float32, "sinks")
        assert lengths.size % sinks.size == 0
    y = k.xp.empty_like(x)
    if x.size:
        k.function("softmax", "softmax_lengths_f32")((lengths.size,), (row_threads(ncols),),
                                                     (x, y, lengths, np.int32(ncols), np.int32(window),
                                                      np.float32(scale), np.float32(softcap),
                                                      x if sinks is None else sinks,   # x: never read then
                                                      np.int32(0 if sinks is None else lengths.size // sinks.size)))
    return y


def softcap(k, x, cap: float):
    return _pointwise(k, "softcap", "softcap_f32", (x,), np.float32(cap))


def mask_logits(k, x, bits):
    """x (R, n) with each row's tokens its bitmask row (bits (R, words) uint32) leaves out at -inf."""
    check(x, np.float32, "x")
    check(bits, np.uint32, "bits")
    n_rows, n = x.shape
    assert bits.shape[0] == n_rows, f"{bits.shape[0]} mask rows for {n_rows} rows of logits"
    y = k.xp.empty_like(x)
    if n_rows and n:
        k.function("mask_logits", "mask_logits_f32")((cdiv(n, _THREADS), n_rows), (_THREADS,),
                                                       (x, bits, y, np.int32(n), np.int32(bits.shape[1])))
    return y


def argmax_rows(k, x):
    """The index of the largest element of each row of x (R, n), as a device int32 array (R,)."""
    check(x, np.float32, "x")
    n_rows, n = x.shape
    out = k.xp.empty(n_rows, np.int32)
    if n_rows:
        k.function("argmax", "argmax_rows_f32")((n_rows,), (1024,), (x, np.int32(n), out))
    return out
