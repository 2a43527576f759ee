"""Products with 8-bit activations (cpu_quant_int8): both quantizations of the activations (llama.cpp's
Q8_0 for the plain types, its Q8_K for the K types), and every block type's product
on each instruction set this CPU has (AVX2 forced on a VNNI machine too), against float64: equal to
the weights times the quantized activations up to float32 rounding, and within the quantization's
bound of the float64 product of the unquantized ones."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType
from gguf import quants as gguf_quants

from bench.synthetic_gguf import random_rows
from llogos_cli.backends.cpu import cpu_quant, cpu_quant_int8
from llogos_cli.backends.cpu.cpu_quant import choose_isa
from llogos_cli.backends.cpu.cpu_simd_int8 import INT16_WORDS, host_isa, host_isas
from llogos_cli.errors import LlogosError
from llogos_cli.model.loader import load
from tests.conftest import FIXTURES, need, relative_error

BLOCK = cpu_quant_int8.BLOCK
ISAS = host_isas()   # every set this CPU runs; the others' kernels are only compiled (test_cpu_isa)


K_BLOCK = cpu_quant_int8.K_BLOCK


def _dequantized(xq, dx, cols: int) -> np.ndarray:
    """What each byte of the plain types' activations stands for, in float64."""
    return xq * np.repeat(dx.astype(np.float64), BLOCK, axis=1)


def _k_dequantized(xq, dx) -> np.ndarray:
    """What each byte of the Q8_K activations stands for, in float64."""
    return xq * np.repeat(dx.astype(np.float64), K_BLOCK, axis=1)


def _product(isa: str, x, raw, qtype):
    """x times the GGUF rows raw, as the backend multiplies them (packed first where it packs)."""
    qm = cpu_quant.QuantMatmul(isa)
    return qm(x, qm.pack(raw, qtype), qtype)


def test_plain_activations_are_llama_cpp_q8_0():
    rng = np.random.default_rng(3)
    cols = 9 * BLOCK
    x = rng.standard_normal((3, cols)).astype(np.float32) * np.float32(4)
    x[1, :BLOCK] = 0                           # an all-zero block
    x[2, 5] = 3000                             # an outlier, as Gemma's activations have
    x[0, BLOCK:2 * BLOCK] = np.float32(1e-30)  # tiny values keep their scale
    xq, dx, xsum = cpu_quant._quantize8(x, k_type=False)
    assert xq.shape == (3, cols) and dx.shape == xsum.shape == (3, 9) and xsum.dtype == np.int32
    assert dx[1, 0] == 0 and (xq[1, :BLOCK] == 0).all() and xsum[1, 0] == 0
    block_dx = np.abs(x).reshape(3, -1, BLOCK).max(axis=2) / 127
    np.testing.assert_allclose(dx, block_dx, rtol=1e-6)
    step = np.repeat(block_dx.astype(np.float64), BLOCK, axis=1)
    assert (np.abs(_dequantized(xq, dx, cols) - x) <= step / 2 * 1.0001).all()
    assert np.abs(xq).max() == 127 and xq[2, 5] == 127
    assert (xsum == xq.reshape(3, 9, BLOCK).sum(axis=2)).all()


def test_k_activations_are_llama_cpp_q8_k():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 3 * K_BLOCK)).astype(np.float32)
    x[1, :K_BLOCK] = 0                          # an all-zero block
    x[2, 300] = -3000                           # an outlier
    x[0, K_BLOCK:2 * K_BLOCK] = np.float32(1e-30)
    xq, dx, xs = cpu_quant._quantize8(x, k_type=True)
    assert xq.dtype == np.int8 and xs.dtype == np.int32 and dx.shape == (3, 3)
    assert dx[1, 0] == 0 and (xq[1, :K_BLOCK] == 0).all()
    np.testing.assert_allclose(dx, np.abs(x).reshape(3, 3, K_BLOCK).max(axis=2) / 127, rtol=1e-6)
    step = np.repeat(dx.astype(np.float64), K_BLOCK, axis=1)
    assert (np.abs(_k_dequantized(xq, dx) - x) <= step / 2 * 1.0001).all()
    assert np.abs(xq).max() == 127 and xq[2, 300] == -127
    assert (xs == xq.reshape(3, -1, cpu_quant_int8.K_SUM).sum(axis=2)).all()


@pytest.mark.parametrize("isa", ISAS)
# one token; TOKENS at once and one more; WIDE, TOKENS and one more
@pytest.mark.parametrize("n_tok", [1, cpu_quant_int8.TOKENS + 1, cpu_quant_int8.WIDE + cpu_quant_int8.TOKENS + 1])
@pytest.mark.parametrize("qtype", sorted(cpu_quant_int8.TYPES, key=int), ids=lambda t: t.name)
def test_products_are_the_quantized_activations_times_the_weights(qtype, n_tok, isa):
    rng = np.random.default_rng(int(qtype) * 10 + n_tok)
    # odd block counts; rows past two whole tiles of the plain types' (cpu_simd_int8.TILE)
    rows, cols = 37, 3 * GGML_QUANT_SIZES[qtype][0] * (3 if GGML_QUANT_SIZES[qtype][0] == BLOCK else 1)
    raw = random_rows(qtype, rows, cols, rng)
    raw.flags.writeable = False                        # as memory-mapped weights are
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    x[0, :BLOCK] *= 50                                  # blocks of very different scales
    w = gguf_quants.dequantize(raw, qtype).astype(np.float64)
    ours = _product(isa, x, raw, qtype)
    assert ours.shape == (n_tok, rows) and ours.dtype == np.float32
    k_type = qtype in cpu_quant_int8.K_TYPES
    xq, dx = cpu_quant._quantize8(x, k_type)[:2]
    held = _k_dequantized(xq, dx) if k_type else _dequantized(xq, dx, cols)
    assert relative_error(ours, held @ w.T) < 1e-5          # float32 rounding only
    per = K_BLOCK if k_type else BLOCK                      # activations held within half a step of x
    block_dx = dx if k_type else np.abs(x).reshape(n_tok, -1, BLOCK).max(axis=2) / 127
    bound = np.abs(w) @ np.repeat(block_dx.astype(np.float64), per, axis=1).T / 2   # (rows, T)
    exact = x.astype(np.float64) @ w.T
    assert (np.abs(ours - exact) <= bound.T + 1e-5 * np.abs(exact).max()).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", sorted(cpu_quant_int8.K_TYPES, key=int), ids=lambda t: t.name)
def test_k_products_are_within_llama_cpp_error_bound(qtype, isa):
    """test-backend-ops' criterion for these types: normalized mean squared error against the
    float64 product below 5e-4, on its kind of input (uniform in [-1, 1])."""
    rng = np.random.default_rng(int(qtype))
    raw = random_rows(qtype, 64, 4 * K_BLOCK, rng)
    x = rng.uniform(-1, 1, (4, 4 * K_BLOCK)).astype(np.float32)
    exact = x.astype(np.float64) @ gguf_quants.dequantize(raw, qtype).astype(np.float64).T
    ours = _product(isa, x, raw, qtype)
    assert ((ours - exact) ** 2).sum() / (exact ** 2).sum() < 5e-4


@pytest.mark.skipif(len(ISAS) < 2, reason="this CPU has one instruction set for these kernels")
@pytest.mark.parametrize("qtype", sorted(cpu_quant_int8.TYPES, key=int), ids=lambda t: t.name)
def test_instruction_sets_agree_bit_for_bit(qtype):
    """Their integer sums are exact and their float steps the same: every set gives one result."""
    rng = np.random.default_rng(11)
    raw = random_rows(qtype, 20, 2 * K_BLOCK, rng)
    x = rng.standard_normal((cpu_quant_int8.WIDE + cpu_quant_int8.TOKENS + 1, 2 * K_BLOCK)).astype(np.float32)
    best, *others = (_product(isa, x, raw, qtype) for isa in ISAS)
    for other in others:
        assert np.array_equal(best, other)


# The bytes of a GGUF block that hold its quants (and their high bits), all ones where their quant is
# the type's largest (MXFP4: 0x77, its 12 twice); the scales are left as random_rows makes them.
_QUANT_BYTES = {QType.Q4_0: (2, 18), QType.Q4_1: (4, 20), QType.Q5_0: (2, 22), QType.Q5_1: (4, 24),
                QType.MXFP4: (1, 17), QType.Q2_K: (16, 80), QType.Q3_K: (0, 96), QType.Q4_K: (16, 144),
                QType.Q5_K: (16, 176), QType.Q6_K: (0, 192)}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", sorted(_QUANT_BYTES, key=int), ids=lambda t: t.name)
def test_the_largest_quants_times_the_largest_activations_do_not_overflow(qtype, isa):
    """AVX2 adds INT16_WORDS[type] words' `vpmaddubsw` pair-sums in int16 before widening them: every
    quant at its largest times every activation at ±127 (x of one value: xq = 127 throughout) is
    where they would wrap, and the products must still be the exact integers' (float32 rounding)."""
    assert qtype.name.lower() in INT16_WORDS
    rng = np.random.default_rng(int(qtype))
    block, size = GGML_QUANT_SIZES[qtype]
    cols = K_BLOCK
    raw = random_rows(qtype, 20, cols, rng).reshape(20, cols // block, size)
    start, end = _QUANT_BYTES[qtype]
    raw[..., start:end] = 0x77 if qtype == QType.MXFP4 else 0xFF
    raw = raw.reshape(20, -1)
    w = gguf_quants.dequantize(raw, qtype).astype(np.float64)
    x = np.stack([np.ones(cols), -np.ones(cols)]).astype(np.float32)
    ours = _product(isa, x, raw, qtype)
    xq, dx = cpu_quant._quantize8(x, qtype in cpu_quant_int8.K_TYPES)[:2]
    assert (np.abs(xq) == 127).all()
    held = xq * np.repeat(dx.astype(np.float64), cols // dx.shape[1], axis=1)
    assert relative_error(ours, held @ w.T) < 1e-5


def test_the_instruction_set_can_be_chosen_and_is_checked(monkeypatch):
    assert choose_isa(None) == (host_isa() or "float")
    assert choose_isa("float") == "float"
    with pytest.raises(LlogosError, match="not one of"):
        choose_isa("sse9")
    monkeypatch.setenv("LLOGOS_CPU_ISA", "float")
    assert cpu_quant.QuantMatmul().isa == "float"


def test_stats_say_which_products_decode(monkeypatch):
    tiny = str(need(FIXTURES / "tiny-llama-q8_0.gguf"))
    for isa, words in (("float", "float32 products"), *((i, "integer products") for i in ISAS)):
        monkeypatch.setenv("LLOGOS_CPU_ISA", isa)
        assert words in load(tiny, "cpu", "quantized", n_ctx=64).memory
    assert "products" not in load(tiny, "cpu", "f32", n_ctx=64).memory


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", sorted(cpu_quant_int8.TYPES, key=int), ids=lambda t: t.name)
def test_a_token_s_product_does_not_depend_on_the_tokens_beside_it(qtype, isa):
    """Bit for bit: rows are multiplied with several tokens at once (cpu_quant_int8.WIDE, TOKENS), and a
    batched row must come out as it would alone; also from the same QuantMatmul, whose arrays of
    quantized activations the batch left with more rows than a token's product fills."""
    rng = np.random.default_rng(int(qtype) + 7)
    raw = random_rows(qtype, 21, 2 * K_BLOCK, rng)
    x = rng.standard_normal((cpu_quant_int8.WIDE + cpu_quant_int8.TOKENS + 1, 2 * K_BLOCK)).astype(np.float32)
    together = _product(isa, x, raw, qtype)
    qm = cpu_quant.QuantMatmul(isa)
    rows = qm.pack(raw, qtype)
    assert np.array_equal(qm(x, rows, qtype), together)
    for t in range(x.shape[0]):
        assert np.array_equal(_product(isa, x[t:t + 1].copy(), raw, qtype)[0], together[t])
        assert np.array_equal(qm(x[t:t + 1].copy(), rows, qtype)[0], together[t])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", (QType.Q4_1, QType.Q6_K), ids=lambda t: t.name)
def test_a_decode_token_s_call_laid_out_with_its_route_gives_the_general_path_s_bits(qtype, isa):
    """One contiguous token through one matrix runs the call kept on its route (route.one); the
    same token as a strided view takes the general path: the same bits. A token of another width
    is refused, not multiplied."""
    rng = np.random.default_rng(int(qtype) + 11)
    raw = random_rows(qtype, 37, 2 * K_BLOCK, rng)
    qm = cpu_quant.QuantMatmul(isa)
    route = qm.route([(qm.pack(raw, qtype), qtype)])
    assert route.one is not None
    x = rng.standard_normal((1, 2 * K_BLOCK)).astype(np.float32)
    spread = np.zeros((1, 4 * K_BLOCK), np.float32)
    spread[:, ::2] = x
    assert not spread[:, ::2].flags.c_contiguous
    fast, general = qm.run(x, route)[0], qm.run(spread[:, ::2], route)[0]
    assert fast.shape == (1, 37) and np.array_equal(fast, general)
    assert np.array_equal(fast[0], qm.run(np.concatenate([x, x]), route)[0][1])   # and a token among others
    with pytest.raises(AssertionError):
        qm.run(x[:, :K_BLOCK].copy(), route)


@pytest.mark.parametrize("isa", [*ISAS, "float"])
def test_products_sharing_an_input_are_each_alone(isa):
    """q, k and v (gate and up) in one call: matrices of several types, plain and K, each of its
    own row count, come out bit for bit as they do one at a time."""
    rng = np.random.default_rng(5)
    matrices = [(random_rows(qtype, rows, 2 * K_BLOCK, rng), qtype)
                for qtype, rows in ((QType.Q4_0, 37), (QType.Q4_K, 20), (QType.Q8_0, 5), (QType.Q6_K, 33), (QType.F16, 3))]
    for n_tok in (1, cpu_quant_int8.TOKENS + 2):
        x = rng.standard_normal((n_tok, 2 * K_BLOCK)).astype(np.float32)
        qm = cpu_quant.QuantMatmul(isa)
        together = qm.many(x, [(qm.pack(raw, qtype), qtype) for raw, qtype in matrices])
        for (raw, qtype), out in zip(matrices, together):
            assert out.shape == (n_tok, raw.shape[0])
            assert np.array_equal(out, _product(isa, x, raw, qtype))


@pytest.mark.parametrize("out", [8, 16])
def test_expert_rows_cut_anywhere_in_the_tiles(out):
    """A stacked experts matrix whose experts begin inside a tile of the plain types' tiled rows
    (8 rows an expert: every other one does) multiplies as the float64 product of its own rows."""
    from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
    rng = np.random.default_rng(out)
    n_expert, cols = 4, 64
    raw = random_rows(QType.Q8_0, n_expert * out, cols, rng)
    raw.flags.writeable = False
    backend = NumpyBackend("quantized")
    w = backend.matrix(raw, QType.Q8_0, matmul=True)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    experts = np.array([[1, 2], [3, 0], [2, 1]])
    y = backend.matmul_experts(x, w, experts, n_expert)
    dense = gguf_quants.dequantize(raw, QType.Q8_0).astype(np.float64).reshape(n_expert, out, cols)
    for t in range(3):
        for j, e in enumerate(experts[t]):
            np.testing.assert_allclose(y[t, j], dense[e] @ x[t], rtol=0, atol=0.02 * np.abs(dense[e]).sum(axis=1).max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", [QType.Q3_K, QType.Q4_K, QType.Q8_0], ids=lambda t: t.name)
def test_one_token_s_experts_in_one_call(qtype, isa, monkeypatch):
    """A decode step's k experts (matvec8_experts, one parallel region) give bit for bit what each
    expert's own product gives (the grouped path, an expert at a time), with one input for all the
    experts (gate, up) and one a pair (down); experts of rows that are not whole tiles take the
    grouped path."""
    from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
    monkeypatch.setenv("LLOGOS_CPU_ISA", isa)
    rng = np.random.default_rng(int(qtype))
    n_expert, cols = 6, K_BLOCK
    backend = NumpyBackend("quantized")
    real = backend.quant_matmul.experts
    for out in (2 * cpu_quant_int8.TILE, 24):
        raw = random_rows(qtype, n_expert * out, cols, rng)
        raw.flags.writeable = False
        w = backend.matrix(raw, qtype, matmul=True)
        experts = np.array([[4, 1, 5]])
        calls = []
        monkeypatch.setattr(backend.quant_matmul, "experts", lambda *a: calls.append(a) or real(*a))
        for x in (rng.standard_normal((1, cols)), rng.standard_normal((1, 3, cols))):
            x = x.astype(np.float32)
            together = backend.matmul_experts(x, w, experts, n_expert)
            monkeypatch.setattr(backend.quant_matmul, "experts", lambda *a: None)
            each = backend.matmul_experts(x, w, experts, n_expert)
            monkeypatch.setattr(backend.quant_matmul, "experts", lambda *a: calls.append(a) or real(*a))
            np.testing.assert_array_equal(together, each)
        assert len(calls) == 2 and (real(*calls[0]) is None) == (out % cpu_quant_int8.TILE != 0)


@pytest.mark.parametrize("qtype, rows", [(QType.Q4_1, (48, 16, 16)), (QType.Q4_K, (32, 60)), (QType.Q8_0, (48, 20, 20))])
def test_joined_matrices_multiply_as_each_alone(qtype, rows):
    """Matrices joined at load (q, k and v; gate and up: one matrix, one product) give each
    matrix's product bit for bit as it is alone, for a token and for a prompt's several (the last
    one may end inside a tile); where another does, they stay apart, and multiply the same."""
    from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
    rng = np.random.default_rng(len(rows))
    cols = 2 * K_BLOCK
    raws = [random_rows(qtype, n, cols, rng) for n in rows]
    for raw in raws:
        raw.flags.writeable = False
    alone, joined = NumpyBackend("quantized"), NumpyBackend("quantized")
    ws = joined.matrices(raws, qtype)
    separate = [alone.matrix(raw, qtype, matmul=True) for raw in raws]
    fits = all(n % cpu_quant_int8.TILE == 0 for n in rows[:-1])
    assert (ws[1].blocks.base is ws[0].blocks.base) == fits
    for n_tok in (1, cpu_quant_int8.TOKENS + 3):
        x = rng.standard_normal((n_tok, cols)).astype(np.float32)
        for out, w in zip(joined.matmuls(x, ws), separate):
            assert out.flags.c_contiguous
            assert np.array_equal(out, alone.matmul(x, w))


@pytest.mark.parametrize("isa", ISAS)
def test_mxfp4_scales_from_subnormal_to_large(isa):
    """MXFP4's E8M0 scales 2^(e - 128) turned into float32 in the kernel, e = 0 and 1 (subnormal
    multipliers) included: each row, of one scale, is its weights times the quantized activations."""
    rng = np.random.default_rng(5)
    exponents = np.array([0, 1, 2, 3, 64, 100, 127, 128, 129, 150, 0, 1, 120, 126, 140, 2, 7], np.uint8)
    raw = random_rows(QType.MXFP4, len(exponents), 4 * BLOCK, rng).reshape(len(exponents), 4, 17)
    raw[:, :, 0] = exponents[:, None]
    raw = raw.reshape(len(exponents), -1)
    x = rng.standard_normal((2, 4 * BLOCK)).astype(np.float32)
    w = gguf_quants.dequantize(raw, QType.MXFP4).astype(np.float64)
    xq, dx = cpu_quant._quantize8(x, False)[:2]
    expected = _dequantized(xq, dx, 4 * BLOCK) @ w.T
    ours = _product(isa, x, raw, QType.MXFP4)
    # A block's float32 scale d · dx lies below float32's normal numbers for e 0 and 1: it is then
    # held to 2^-149, which its block's integer sum multiplies.
    values = (w / 2.0 ** (exponents[:, None].astype(np.float64) - 128)).reshape(len(exponents), 4, BLOCK)
    isums = np.abs(np.einsum("rbk,tbk->trb", values, xq.reshape(2, 4, BLOCK).astype(np.float64))).sum(axis=2)
    for r in range(len(exponents)):   # row by row: their magnitudes differ by 2^150
        bound = 1e-5 * np.abs(expected[:, r]).max() + 2.0 ** -149 * isums[:, r]
        assert (np.abs(ours[:, r] - expected[:, r]) <= bound).all(), exponents[r]
