"""The weight types of issue 28 (Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4): each backend's decoders bit for
bit against gguf.quants.dequantize, and a tiny llama whose matrices are of each type run on the
CPU's quantized path and in the CUDA backend (emulated) against a float32 model of the same weights.

The NumPy dequantizers of every type are checked in test_quants.py, the products of every type in
test_cpu_quant.py and under emulation in emu/op_suite.py; this module adds what those leave out.
"""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from bench.synthetic_gguf import random_rows
from llogos_cli.backends.cpu import cpu_quant_dequant, cpu_quant_int8
from llogos_cli.backends.cpu.cpu_simd_int8 import host_isa
from llogos_cli.backends.cuda import cuda_matmul
from llogos_cli.backends.cuda.cuda_backend import CudaBackend
from llogos_cli.backends.cuda.cuda_kernels import TYPE_SUFFIX
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.gguf import quants
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.config import ModelConfig
from llogos_cli.model.forward import Model
from llogos_cli.model.loader import load
from tests.conftest import EXACT_KV, FIXTURES, assert_decisive_choices_kept, copy_gguf, need, relative_error
from tests.emu.emulator import EmuKernels

NEW_TYPES = [QType.Q3_K, QType.Q2_K, QType.IQ4_NL, QType.IQ4_XS, QType.MXFP4]
_ids = {"ids": lambda t: t.name}


def _reference(raw: np.ndarray, qtype: QType) -> np.ndarray:
    return gguf_dequantize(raw, qtype).reshape(raw.shape[0], -1)


def _rows(qtype: QType, rows: int, blocks: int, seed: int) -> np.ndarray:
    """Random rows of `blocks` blocks: every quant bit pattern, the scales spread over 2^20."""
    rng = np.random.default_rng(seed)
    raw = random_rows(qtype, rows, blocks * GGML_QUANT_SIZES[qtype][0], rng, scale=2.0 ** rng.integers(-10, 10))
    raw.flags.writeable = False   # as memory-mapped from a file
    return raw


def test_every_supported_type_has_a_decoder_in_each_backend():
    """A type the loader accepts but a backend cannot decode would run as another type's bytes."""
    assert cpu_quant_dequant.TYPES == quants.SUPPORTED - {QType.F32}   # F32 matrices are used in place
    assert set(TYPE_SUFFIX) == quants.SUPPORTED
    assert set(cuda_matmul._PART_ELEMENTS) == quants.SUPPORTED


@pytest.mark.parametrize("qtype", NEW_TYPES, **_ids)
def test_cpu_tiles_decode_bit_for_bit(qtype):
    for seed, (rows, blocks) in enumerate([(1, 1), (7, 3), (33, 8)]):
        raw = _rows(qtype, rows, blocks, seed)
        out = np.full((rows, blocks * GGML_QUANT_SIZES[qtype][0]), np.nan, np.float32)
        cpu_quant_dequant.dequantize_rows(raw, int(qtype), out)
        np.testing.assert_array_equal(out.view(np.uint32), _reference(raw, qtype).view(np.uint32))


@pytest.mark.parametrize("qtype", NEW_TYPES, **_ids)
def test_random_rows_are_weights_of_the_scale_asked(qtype):
    """bench's random blocks (the synthetic models' and these tests'): finite, of magnitude ~scale."""
    for scale in (0.02, 1.0):
        w = _reference(random_rows(qtype, 16, 512, np.random.default_rng(3), scale), qtype)
        assert np.isfinite(w).all() and scale / 4 < np.abs(w).max() <= 2 * scale


@pytest.fixture(scope="module")
def emulated():
    return CudaBackend(EmuKernels())


@pytest.mark.parametrize("qtype", NEW_TYPES, **_ids)
def test_cuda_rows_decode_bit_for_bit(emulated, qtype):
    """get_rows decodes to float32, so its rows are the blocks' exact values (dequantize rounds
    them to float16 and the products sum them: op_suite checks those)."""
    raw = _rows(qtype, 9, 3, 5)
    ids = np.array([8, 0, 3, 3, 5], np.int32)
    got = emulated.to_host(cuda_matmul.get_rows(emulated.kernels, emulated.xp.asarray(raw), qtype, ids))
    np.testing.assert_array_equal(got.view(np.uint32), _reference(raw, qtype)[ids].view(np.uint32))


def test_mxfp4_scales_cover_every_e8m0_byte():
    """Each E8M0 byte 0-255, subnormal multipliers (0, 1) and the largest (255, values overflowing
    to infinity) included, decodes as gguf's; MXFP4's value 8 is the negative zero's slot."""
    raw = np.zeros((256, 17), np.uint8)
    raw[:, 0] = np.arange(256)
    raw[:, 1:] = np.arange(16, dtype=np.uint8) * 0x11   # every value in both nibbles
    with np.errstate(over="ignore"):
        want = _reference(raw, QType.MXFP4)
        np.testing.assert_array_equal(quants.dequantize(raw, QType.MXFP4).view(np.uint32), want.view(np.uint32))
    out = np.empty((256, 32), np.float32)
    cpu_quant_dequant.dequantize_rows(raw, int(QType.MXFP4), out)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
    assert np.isinf(want[255]).any() and (want[0][want[0] != 0] < 1e-37).all()


# ------------------------------------------------------------------ whole models
# tiny-llama's rows (64 and 160 elements) are too short for the 256-element blocks: the same model
# widened, with random weights.
N_EMBD, N_FF, HEAD_DIM = 256, 512, 64


def _widened_weights(src: GGUFFile, rng) -> dict[str, np.ndarray]:
    """float32 weights of tiny-llama's tensors at the widened shape: matrices (rows, cols)."""
    cfg = ModelConfig.from_gguf(src)
    n_head, n_kv = cfg.n_head, cfg.n_head_kv
    shapes = {"token_embd": (None, N_EMBD), "output": (None, N_EMBD), "attn_q": (n_head * HEAD_DIM, N_EMBD),
              "attn_k": (n_kv * HEAD_DIM, N_EMBD), "attn_v": (n_kv * HEAD_DIM, N_EMBD),
              "attn_output": (N_EMBD, n_head * HEAD_DIM), "ffn_gate": (N_FF, N_EMBD), "ffn_up": (N_FF, N_EMBD),
              "ffn_down": (N_EMBD, N_FF)}
    weights = {}
    for name, info in src.tensors.items():
        kind = name.split(".")[-2]
        if len(info.shape) == 1:
            weights[name] = (1 + 0.1 * rng.standard_normal(N_EMBD)).astype(np.float32)
        else:
            rows, cols = shapes[kind]
            rows = rows or src.raw(name).shape[0]
            weights[name] = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
    return weights


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[QType, tuple]:
    """For each new type: (the GGUF with every matrix of that type, the GGUF of gguf's float32 decoding
    of those very blocks). gguf quantizes MXFP4 itself; of the others, it only decodes: their blocks
    are random (random_rows), valid by construction."""
    src_path = need(FIXTURES / "tiny-llama-f32.gguf")
    src = GGUFFile(src_path)
    rng = np.random.default_rng(28)
    weights = _widened_weights(src, rng)
    meta = {"llama.embedding_length": N_EMBD, "llama.feed_forward_length": N_FF,
            "llama.attention.key_length": HEAD_DIM, "llama.attention.value_length": HEAD_DIM,
            "llama.rope.dimension_count": HEAD_DIM}
    out, folder = {}, tmp_path_factory.mktemp("weight_types")
    for qtype in NEW_TYPES:
        quantized, dense = {}, {}
        for name, w in weights.items():
            if w.ndim == 1:
                quantized[name] = dense[name] = (w, None)
                continue
            if qtype == QType.MXFP4:
                raw = gguf_quantize(w, qtype)
            else:
                raw = random_rows(qtype, *w.shape, rng, scale=float(np.abs(w).max()))
            quantized[name] = (raw, qtype)
            dense[name] = (_reference(raw, qtype), None)
        out[qtype] = (copy_gguf(src_path, folder / f"{qtype.name}.gguf", meta, quantized),
                      copy_gguf(src_path, folder / f"{qtype.name}-f32.gguf", meta, dense))
    return out


def _prompt(n_vocab: int) -> np.ndarray:
    return np.random.default_rng(1).integers(0, n_vocab, 20).astype(np.int32)


@pytest.mark.parametrize("qtype", NEW_TYPES, **_ids)
def test_cpu_quantized_path_matches_float32_model(models, qtype, monkeypatch):
    """20 tokens at once and then 3 one at a time, from the blocks (loaded as a user loads a file)
    with float32 activations (LLOGOS_CPU_ISA=float) and from gguf's float32 decoding of them; the
    types with integer products (cpu_quant_int8.TYPES) also with those (8-bit activations, the
    default), where every decisive choice of the next token (a lead of 0.5 or more) stays."""
    path, dense_path = models[qtype]
    dense = Model(GGUFFile(dense_path), NumpyBackend("f32"))
    ids = _prompt(dense.cfg.n_vocab)
    want = dense.forward_seq(dense.new_context(64, *EXACT_KV), ids, all_logits=True)
    assert np.abs(want).max() > 0.1 and want.std(axis=-1).min() > 0.01   # logits that say something
    for isa in ("float", None) if qtype in cpu_quant_int8.TYPES and host_isa() else ("float",):
        if isa:
            monkeypatch.setenv("LLOGOS_CPU_ISA", isa)
        else:
            monkeypatch.delenv("LLOGOS_CPU_ISA", raising=False)
        loaded = load(str(path), backend="cpu", cpu_weights="quantized", n_ctx=64)
        assert {info.ggml_type for info in loaded.source.file.tensors.values() if len(info.shape) == 2} == {qtype}
        ctx = loaded.model.new_context(64, *EXACT_KV)   # the products alone against float32's
        got = loaded.model.forward_seq(ctx, ids[:17], all_logits=True)
        got = np.concatenate([got, *(loaded.model.forward_seq(ctx, ids[i:i + 1]) for i in range(17, 20))])
        if isa:
            assert relative_error(got, want) < 1e-4
        else:
            assert_decisive_choices_kept(got, want)
            assert "integer products" in loaded.memory


@pytest.mark.parametrize("qtype", [QType.Q2_K, QType.Q3_K], **_ids)
def test_auto_keeps_a_small_model_in_its_blocks_only_where_integer_products_take_them(models, qtype, monkeypatch):
    """No float32 dot kernel multiplies these types in their blocks, the integer products do where
    the CPU has AVX2 or VNNI: auto holds a small model in its blocks there, and as float32 under
    LLOGOS_CPU_ISA=float."""
    int8 = host_isa() is not None
    assert ("cpu weights quantized" if int8 else "cpu weights f32") in load(str(models[qtype][0]), backend="cpu", n_ctx=64).memory
    monkeypatch.setenv("LLOGOS_CPU_ISA", "float")
    assert "cpu weights f32" in load(str(models[qtype][0]), backend="cpu", n_ctx=64).memory


@pytest.mark.parametrize("qtype", NEW_TYPES, **_ids)
def test_emulated_cuda_step_matches_float32_model(models, emulated, qtype):
    """One batched step of 20 tokens (the matrix-vector kernels, 8 tokens a launch) and a decode step."""
    path, dense_path = models[qtype]
    gpu, dense = Model(GGUFFile(path), emulated), Model(GGUFFile(dense_path), NumpyBackend("f32"))
    ids = _prompt(dense.cfg.n_vocab)
    want = dense.forward_seq(dense.new_context(64, *EXACT_KV), ids, all_logits=True)
    ctx = gpu.new_context(64, "f32", "f32")
    got = emulated.to_host(gpu.forward_seq(ctx, ids[:19], all_logits=True))
    step = emulated.to_host(gpu.forward_seq(ctx, ids[19:]))
    assert relative_error(np.concatenate([got, step]), want) < 1e-4
