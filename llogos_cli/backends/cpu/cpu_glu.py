"""The gated unit of the feed-forward block as one compiled loop (the CPU paths that have numba
loaded): act(gate) · up, where NumPy took four to nine passes over the vectors for it."""

import numpy as np

from llogos_cli.backends.cpu.cpu_jit import exp32, kernel


@kernel
def glu_rows(gate, up, gelu, out):
    """gate, up, out (R, n) float32: out = act(gate) · up, act SiLU g / (1 + e^-g), or with gelu the
    tanh approximation ½ g (1 + tanh(√(2/π) g (1 + 0.044715 g²))), tanh y taken as
    1 - 2 / (e^2y + 1) (exp32's clamp gives the limits, ±1, and SiLU's, 0 and g)."""
    for r in range(gate.shape[0]):
        for i in range(gate.shape[1]):
            g = gate[r, i]
            if gelu:
                y = np.float32(0.7978845608028654) * g * (np.float32(1) + np.float32(0.044715) * g * g)
                act = np.float32(0.5) * g * (np.float32(2) - np.float32(2) / (exp32(np.float32(2) * y) + np.float32(1)))
            else:
                act = g / (np.float32(1) + exp32(-g))
            out[r, i] = act * up[r, i]
