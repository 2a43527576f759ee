"""The NumPy dequantizers against gguf's reference implementation, on every supported type."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType
from gguf.quants import dequantize as reference_dequantize
from gguf.quants import quantize

from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.gguf.quants import SUPPORTED, dequantize

# Byte offsets of the float16 scale fields in each block, so random blocks get finite scales.
_F16_FIELDS = {QType.Q8_0: [0], QType.Q4_0: [0], QType.Q4_1: [0, 2], QType.Q5_0: [0], QType.Q5_1: [0, 2],
               QType.Q2_K: [80, 82], QType.Q3_K: [108], QType.Q4_K: [0, 2], QType.Q5_K: [0, 2], QType.Q6_K: [208],
               QType.IQ4_NL: [0], QType.IQ4_XS: [0], QType.MXFP4: []}   # MXFP4's E8M0 scale: every byte is one


def random_blocks(qtype: QType, rows: int, cols: int, rng) -> np.ndarray:
    """Random bytes in qtype's block layout, with every float16 field a finite random scale."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block_size, type_size), dtype=np.uint8)
    for offset in _F16_FIELDS[qtype]:
        scales = (rng.standard_normal((rows, cols // block_size)) * 0.01).astype(np.float16)
        raw[..., offset:offset + 2] = scales.view(np.uint8).reshape(rows, -1, 2)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("qtype", sorted(_F16_FIELDS, key=lambda t: t.name), ids=lambda t: t.name)
def test_random_blocks_match_gguf(qtype):
    rng = np.random.default_rng(int(qtype))
    for rows, cols in [(1, 256), (5, 512), (33, 1024)]:
        raw = random_blocks(qtype, rows, cols, rng)
        with np.errstate(over="ignore"):   # MXFP4's largest scales times 12 are infinite, in both
            ours, expected = dequantize(raw, qtype), reference_dequantize(raw, qtype).reshape(rows, cols)
        assert ours.shape == (rows, cols) and ours.dtype == np.float32
        np.testing.assert_array_equal(ours.view(np.uint32), expected.view(np.uint32))   # bit for bit


@pytest.mark.parametrize("qtype", [QType.F32, QType.F16, QType.BF16, QType.Q8_0, QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1],
                         ids=lambda t: t.name)
def test_quantized_weights_round_trip(qtype):
    """Weights quantized by gguf itself dequantize to gguf's values, and near the originals."""
    weights = np.random.default_rng(7).standard_normal((16, 256)).astype(np.float32)
    raw = quantize(weights, qtype)
    ours = dequantize(raw.view(np.uint8).reshape(16, -1), qtype)
    np.testing.assert_array_equal(ours, reference_dequantize(raw, qtype).reshape(16, 256))
    assert np.abs(ours - weights).max() < 0.1 * np.abs(weights).max()


def test_every_supported_type_is_covered():
    covered = set(_F16_FIELDS) | {QType.F32, QType.F16, QType.BF16}
    assert covered == SUPPORTED


def test_real_model_tensors_match_gguf(smollm_path, gemma_path):
    """Every tensor type in the two real models, row slices included (as embedding lookups use)."""
    seen = set()
    for path in (smollm_path, gemma_path):
        f = GGUFFile(path)
        for name, info in f.tensors.items():
            if info.ggml_type in seen or len(info.shape) < 2:
                continue
            seen.add(info.ggml_type)
            raw = f.raw(name)
            rows = np.array([0, 3, raw.shape[0] - 1])
            expected = reference_dequantize(raw[rows], info.ggml_type).reshape(len(rows), -1)
            np.testing.assert_array_equal(dequantize(raw[rows], info.ggml_type), expected)
    assert {QType.Q4_1, QType.Q8_0, QType.Q5_0, QType.Q4_K, QType.Q6_K} <= seen


def test_unsupported_type_is_named():
    with pytest.raises(LlogosError, match="unsupported tensor type IQ2_XXS"):
        dequantize(np.zeros((1, 66), np.uint8), QType.IQ2_XXS)
