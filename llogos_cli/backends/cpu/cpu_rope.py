"""Rotary position embedding as one compiled loop (the CPU paths that have numba loaded)."""

from llogos_cli.backends.cpu.cpu_jit import kernel


@kernel
def rope_rows(x, cos, sin, neox, out):
    """x (T, H, D) float32 -> out: each head's first 2 · half features turned pairwise by the
    angles of its token, cos and sin (T, half) (already scaled by the attention factor); pairs
    (i, i + half) with neox, else (2i, 2i + 1). Features past them are copied."""
    half = cos.shape[1]
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            for i in range(half):
                a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
                xa, xb = x[t, h, a], x[t, h, b]
                out[t, h, a] = xa * cos[t, i] - xb * sin[t, i]
                out[t, h, b] = xa * sin[t, i] + xb * cos[t, i]
            for i in range(2 * half, x.shape[2]):
                out[t, h, i] = x[t, h, i]
