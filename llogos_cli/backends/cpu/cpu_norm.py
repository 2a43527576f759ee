"""RMSNorm as one compiled loop over each row (the quantized CPU path, which has numba loaded): a
decode step normalises a few hundred vectors of a few hundred floats, where NumPy's five calls
each cost more than the arithmetic."""

import numpy as np

from llogos_cli.backends.cpu.cpu_jit import kernel


@kernel
def rmsnorm_rows(x, w, eps, out):
    """x (R, n) float32 -> out (R, n): each row times 1 / sqrt(mean(row²) + eps), times w (n,)."""
    n = x.shape[1]
    for r in range(x.shape[0]):
        squares = np.float32(0)
        for i in range(n):
            squares += x[r, i] * x[r, i]
        scale = np.float32(1) / np.sqrt(squares / np.float32(n) + np.float32(eps))
        for i in range(n):
            out[r, i] = x[r, i] * scale * w[i]
