"""Launchers for the recurrent ops of Gated DeltaNet layers (qwen35): the causal convolution and the
gated delta rule, each run of a batch advancing its own slot's state in place (see numpy_recurrent.py).

A launch takes consecutive runs of equal length (the layout's groups), reading each run's slot on
the device: the decode rows of a step are one launch, a prompt chunk another.
"""

import numpy as np

from llogos_cli.backends.cuda.cuda_batch import Layout
from llogos_cli.backends.cuda.cuda_kernels import cdiv, check

DELTA_MAX_DK = 256  # DELTA_MAX_DK in delta_net.cu
MAX_RUNS = 65535    # runs per launch: the grid's y dimension
_WARPS = 4
_CONV_THREADS = 128


def ssm_conv(k, x, conv_state, w, layout: Layout):
    """x (T, C), each run continuing its slot's conv_state (n_slots, K-1, C), with kernel w (C, K)
    float32; -> (T, C)."""
    for name, a in (("x", x), ("conv_state", conv_state), ("w", w)):
        check(a, np.float32, name)
    check(layout.slots, np.int32, "slots")
    channels, kernel = w.shape
    assert x.shape[1] == channels and conv_state.shape[1:] == (kernel - 1, channels)
    assert layout.max_slot < conv_state.shape[0]
    out = k.xp.empty_like(x)
    for t0, t1, n in layout.groups:
        runs = (t1 - t0) // n
        assert runs <= MAX_RUNS
        k.function("ssm_conv", "ssm_conv_f32")(
            (cdiv(channels, _CONV_THREADS), runs), (_CONV_THREADS,),
            (x[t0:t1], conv_state, w, out[t0:t1], layout.slots[t0:t1], np.int32(n), np.int32(channels),
             np.int32(kernel)))
    return out


def delta_net(k, q, key, v, g, beta, state, layout: Layout):
    """q, key (T, Hk, dk); v (T, Hv, dv); g, beta (T, Hv); state (n_slots, Hv, dv, dk), each run
    advancing its slot's; -> (T, Hv, dv)."""
    for name, a in (("q", q), ("k", key), ("v", v), ("g", g), ("beta", beta), ("state", state)):
        check(a, np.float32, name)
    check(layout.slots, np.int32, "slots")
    n_tok, n_k, dk = q.shape
    _, n_v, dv = v.shape
    assert key.shape == q.shape and g.shape == beta.shape == (n_tok, n_v) and state.shape[1:] == (n_v, dv, dk)
    assert n_v % n_k == 0 and dk <= DELTA_MAX_DK and layout.max_slot < state.shape[0]
    out = k.xp.empty_like(v)
    for t0, t1, n in layout.groups:
        runs = (t1 - t0) // n
        assert runs <= MAX_RUNS
        s = slice(t0, t1)
        k.function("delta_net", "delta_net_f32")(
            (cdiv(n_v * dv, _WARPS), runs), (_WARPS * 32,),
            (q[s], key[s], v[s], g[s], beta[s], state, out[s], layout.slots[s], np.int32(n), np.int32(n_k),
             np.int32(n_v), np.int32(dk), np.int32(dv)))
    return out
