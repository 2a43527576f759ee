"""YaRN RoPE scaling (gpt-oss; Qwen and others' long-context files), as llama.cpp's rope_yarn does it.

Each rotated pair i blends its interpolated frequency (times freq_scale) and its original one by a
ramp over the pair index: pairs below the correction range keep their frequency, pairs above it
take the interpolated one. Rotations are scaled by 1 + 0.1 ln(1 / freq_scale). Both are expressed
here as what every backend's rope already takes: per-pair divisors of the frequency and a scale.
"""

import math

import numpy as np

# llama.cpp's defaults, which it keeps for every family but a few (not gpt-oss): the number of
# rotations over the original context that bound the correction range.
BETA_FAST, BETA_SLOW = 32.0, 1.0


def _correction_dim(dims: int, n_ctx_orig: int, rotations: float, base: float) -> float:
    """The pair dimension whose wavelength turns `rotations` times over the original context."""
    return dims * math.log(n_ctx_orig / (rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_rotation(dims: int, base: float, freq_scale: float, n_ctx_orig: int) -> tuple[np.ndarray, float]:
    """(divisors (dims / 2,) float32, scale) of one layer's rotation: the frequency of pair i is
    base^(-2i/dims) / divisors[i]; the range is whole dimensions (llama.cpp floors and ceils it)."""
    low = max(0.0, math.floor(_correction_dim(dims, n_ctx_orig, BETA_FAST, base)))
    high = min(dims - 1.0, math.ceil(_correction_dim(dims, n_ctx_orig, BETA_SLOW, base)))
    pairs = np.arange(dims // 2, dtype=np.float64)
    keep = 1 - np.clip((pairs - low) / max(0.001, high - low), 0, 1)   # 1: the original frequency
    divisors = 1 / (freq_scale * (1 - keep) + keep)
    return divisors.astype(np.float32), 1 + 0.1 * math.log(1 / freq_scale)
