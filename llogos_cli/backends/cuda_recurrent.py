"""Launchers for the recurrent ops of Gated DeltaNet layers (qwen35): the causal convolution and the
gated delta rule, both advancing their per-sequence state in place (see numpy_recurrent.py)."""

import numpy as np

from llogos_cli.backends.cuda_kernels import cdiv, check

DELTA_MAX_DK = 256  # DELTA_MAX_DK in delta_net.cu
_WARPS = 4


def ssm_conv(k, x, conv_state, w):
    """x (T, C) continuing conv_state (K-1, C) with kernel w (C, K) float32; -> (T, C)."""
    for name, a in (("x", x), ("conv_state", conv_state), ("w", w)):
        check(a, np.float32, name)
    n_tok, channels = x.shape
    kernel = w.shape[1]
    assert conv_state.shape == (kernel - 1, channels) and w.shape == (channels, kernel)
    out = k.xp.empty_like(x)
    k.function("ssm_conv", "ssm_conv_f32")((cdiv(channels, 128),), (128,),
                                           (x, conv_state, w, out, np.int32(n_tok), np.int32(channels),
                                            np.int32(kernel)))
    return out


def delta_net(k, q, key, v, g, beta, state):
    """q, key (T, Hk, dk); v (T, Hv, dv); g, beta (T, Hv); state (Hv, dv, dk); -> (T, Hv, dv)."""
    for name, a in (("q", q), ("k", key), ("v", v), ("g", g), ("beta", beta), ("state", state)):
        check(a, np.float32, name)
    n_tok, n_k, dk = q.shape
    _, n_v, dv = v.shape
    assert key.shape == q.shape and g.shape == beta.shape == (n_tok, n_v) and state.shape == (n_v, dv, dk)
    assert n_v % n_k == 0 and dk <= DELTA_MAX_DK
    out = k.xp.empty_like(v)
    k.function("delta_net", "delta_net_f32")(
        (cdiv(n_v * dv, _WARPS),), (_WARPS * 32,),
        (q, key, v, g, beta, state, out, np.int32(n_tok), np.int32(n_k), np.int32(n_v), np.int32(dk), np.int32(dv)))
    return out
