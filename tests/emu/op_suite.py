"""Checks of every CudaBackend operation against the references, run twice: under the CPU emulator
(test_cuda_emulated.py) and on a GPU (test_cuda_gpu.py). Each of those modules imports these
tests and supplies the `backend` fixture: a CudaBackend over its kernel provider.

References: `gguf.quants.dequantize` for decoding, the NumPy backend for everything else. Shapes
are chosen to leave partial thread blocks, warps and row chunks.
"""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType
from gguf.quants import dequantize as gguf_dequantize

from bench.synthetic_gguf import random_rows
from llogos_cli.backends.cuda import cuda_attention, cuda_experts, cuda_matmul, cuda_ops
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.forward import Model
from tests.conftest import FIXTURES, need, relative_error

WEIGHT_TYPES = [QType.F32, QType.F16, QType.BF16, QType.Q8_0, QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K,
                QType.Q6_K, QType.IQ4_NL, QType.IQ4_XS, QType.MXFP4]
CPU = NumpyBackend()


def random_weights(rng, qtype: QType, rows: int, cols: int) -> np.ndarray:
    """Random GGUF bytes (rows, bytes per row): every quant bit pattern, finite scales, weights ~1."""
    return random_rows(qtype, rows, cols, rng, scale=1.0)


def reference(raw: np.ndarray, qtype: QType) -> np.ndarray:
    return gguf_dequantize(raw, qtype).reshape(raw.shape[0], -1).astype(np.float32)


def host(backend, x) -> np.ndarray:
    return backend.to_host(x)


def assert_close(got, want, rtol=1e-5, scale=None):
    """|got - want| <= rtol * scale elementwise, scale defaulting to max|want| (error relative to the data)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    bound = rtol * (np.abs(want).max() if scale is None else scale) + 1e-30
    err = np.abs(got - want) / bound
    assert np.all(err <= 1), f"max error {err.max():.3g} x the bound at {np.unravel_index(err.argmax(), err.shape)}"


# ------------------------------------------------------------------ quantized weights
@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda t: t.name)
def test_dequantize_to_f16(backend, qtype):
    rng = np.random.default_rng(1)
    cols = 512 if GGML_QUANT_SIZES[qtype][0] == 256 else 96
    raw = random_weights(rng, qtype, 7, cols)
    out = backend.xp.zeros((7, cols), np.float16)
    cuda_matmul.dequantize(backend.kernels, backend.xp.asarray(raw), qtype, out)
    want = reference(raw, qtype)
    # One float16 rounding of the exact value, plus float32 rounding in the decode.
    assert np.all(np.abs(host(backend, out).astype(np.float64) - want) <= np.abs(want) * 2.0 ** -11 + 1e-7)


@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda t: t.name)
def test_embed_gathers_and_decodes_rows(backend, qtype):
    rng = np.random.default_rng(2)
    cols = 768 if GGML_QUANT_SIZES[qtype][0] == 256 else 160
    raw = random_weights(rng, qtype, 11, cols)
    ids = np.array([3, 0, 10, 3, 7], np.int32)
    got = host(backend, backend.embed(backend.matrix(raw, qtype, matmul=False), ids))
    assert_close(got, reference(raw, qtype)[ids], rtol=1e-6)


def test_embed_rejects_ids_outside_the_vocabulary(backend):
    table = backend.matrix(random_weights(np.random.default_rng(0), QType.Q8_0, 4, 32), QType.Q8_0, matmul=False)
    with pytest.raises(LlogosError, match="outside the vocabulary"):
        backend.embed(table, np.array([1, 4]))


def _check_product(backend, qtype, n_tok, scratch=None):
    rng = np.random.default_rng(n_tok)
    cols = 768 if GGML_QUANT_SIZES[qtype][0] == 256 else 160
    raw = random_weights(rng, qtype, 37, cols)
    w = backend.matrix(raw, qtype, matmul=True)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    if scratch is None:
        got = host(backend, backend.matmul(backend.xp.asarray(x), w))
    else:
        got = host(backend, cuda_matmul.matmul(backend.kernels, backend.xp.asarray(x), w, scratch))
    dense = reference(raw, qtype).astype(np.float64)
    # Error bound relative to sum |x||w|: float32 accumulation for matvec, float16 inputs for GEMM.
    rtol = 1e-5 if n_tok < cuda_matmul.GEMM_MIN_TOKENS else 2e-3
    assert_close(got, x @ dense.T, rtol=rtol, scale=np.abs(x) @ np.abs(dense).T)


@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 3, cuda_matmul.MATVEC_MAX_TOKENS + 3, cuda_matmul.GEMM_MIN_TOKENS + 5])
def test_matmul(backend, qtype, n_tok):
    _check_product(backend, qtype, n_tok)


@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda t: t.name)
def test_one_token_products_with_two_rows_a_warp(backend, qtype):
    """The one-token kernels that give a warp 2 rows, on 37 rows (the last warp's second row past
    the end) of activations with a wide range: float32-exact as the one-row kernel is."""
    rows = 2
    rng = np.random.default_rng(rows)
    cols = 768 if GGML_QUANT_SIZES[qtype][0] == 256 else 160
    raw = random_weights(rng, qtype, 37, cols)
    w = backend.matrix(raw, qtype, matmul=True)
    x = (rng.standard_normal((1, cols)) * np.exp(rng.uniform(-3, 3, cols))).astype(np.float32)
    y = backend.xp.full((1, 37), np.nan, np.float32)
    cuda_matmul.matvec(backend.kernels, backend.xp.asarray(x), w, y, rows_per_warp=lambda _: rows)
    if hasattr(backend.kernels, "launched"):  # the emulator's record of kernel names
        assert backend.kernels.launched[-1] == f"matvec_rows{rows}_{cuda_matmul.TYPE_SUFFIX[qtype]}"
    dense = reference(raw, qtype).astype(np.float64)
    assert_close(host(backend, y), x @ dense.T, rtol=1e-5, scale=np.abs(x) @ np.abs(dense).T)


def _wide_range_activations(rng, n_tok: int, cols: int) -> np.ndarray:
    """Activations over six orders of magnitude, with a run of 32 all zero."""
    x = (rng.standard_normal((n_tok, cols)) * np.exp(rng.uniform(-7, 7, (n_tok, cols)))).astype(np.float32)
    x[:, 32:64] = 0.0
    return x


def test_activations_quantized_to_8_bits(backend):
    """Per run of 32: step d = max|x| / 127, values round(x / d) in [-127, 127], (d, d * sum)."""
    rng = np.random.default_rng(21)
    x = _wide_range_activations(rng, 3, 256)
    xq, xs = (host(backend, a) for a in cuda_matmul.quantize_q8(backend.kernels, backend.xp.asarray(x)))
    runs, q = x.reshape(3, -1, 32).astype(np.float64), xq.reshape(3, -1, 32).astype(np.float64)
    step = np.abs(runs).max(axis=2) / 127
    assert_close(xs[..., 0], step, rtol=1e-6, scale=step)
    assert np.abs(xq.astype(np.int32)).max() == 127 and np.all(q[:, 1] == 0) and np.all(xs[:, 1] == 0)
    assert np.all(np.abs(runs - step[..., None] * q) <= step[..., None] * (0.5 + 1e-6))
    assert_close(xs[..., 1], step * q.sum(axis=2), rtol=1e-6, scale=step * np.abs(q).sum(axis=2))


def int8_product_bound(x: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """Bound on |x · Wᵀ - product with x quantized per run of 32|: each activation is off by at
    most half its run's step (max|x| / 127), times |w|; plus float32 accumulation (1e-5 of |x||w|)."""
    half_step = np.repeat(np.abs(x.astype(np.float64)).reshape(x.shape[0], -1, 32).max(axis=2) / 254, 32, axis=1)
    return half_step @ np.abs(dense).T * (1 + 1e-5) + 1e-5 * (np.abs(x) @ np.abs(dense).T)


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("qtype", sorted(cuda_matmul.INT8_TYPES, key=int), ids=lambda t: t.name)
def test_one_token_products_with_8_bit_activations(backend, qtype, rows):
    """matvec_q8 on 37 rows (the last warp's second row past the end), activations of a wide range
    with a zero run: within the activations' rounding of the exact product."""
    rng = np.random.default_rng(int(qtype) + rows)
    cols = 768 if GGML_QUANT_SIZES[qtype][0] == 256 else 160
    raw = random_weights(rng, qtype, 37, cols)
    w = backend.matrix(raw, qtype, matmul=True)
    x = _wide_range_activations(rng, 1, cols)
    y = backend.xp.full((1, 37), np.nan, np.float32)
    x8 = cuda_matmul.quantize_q8(backend.kernels, backend.xp.asarray(x))
    cuda_matmul.matvec_q8(backend.kernels, x8, w, y, rows_per_warp=lambda _: rows)
    if hasattr(backend.kernels, "launched"):
        assert backend.kernels.launched[-1] == f"matvec_q8_{'' if rows == 1 else f'rows{rows}_'}{cuda_matmul.TYPE_SUFFIX[qtype]}"
    dense = reference(raw, qtype).astype(np.float64)
    got, want = host(backend, y).astype(np.float64), x @ dense.T
    assert np.all(np.abs(got - want) <= int8_product_bound(x, dense))


@pytest.mark.parametrize("qtype", sorted(cuda_matmul.INT8_TYPES, key=int), ids=lambda t: t.name)
def test_a_token_s_8_bit_product_does_not_depend_on_the_tokens_beside_it(backend, qtype):
    """Bit for bit, one token alone (1 or 2 rows a warp) and among up to MATVEC_MAX_TOKENS of
    matvec_q8_batch: the engine's rows give what they give alone. Each within the bound too."""
    rng = np.random.default_rng(int(qtype) + 30)
    cols = 512 if GGML_QUANT_SIZES[qtype][0] == 256 else 160
    raw = random_weights(rng, qtype, 37, cols)
    w = backend.matrix(raw, qtype, matmul=True)
    x = _wide_range_activations(rng, cuda_matmul.MATVEC_MAX_TOKENS, cols)
    xq, xs = cuda_matmul.quantize_q8(backend.kernels, backend.xp.asarray(x))
    together = backend.xp.empty((x.shape[0], 37), np.float32)
    cuda_matmul.matvec_q8(backend.kernels, (xq, xs), w, together)
    if hasattr(backend.kernels, "launched"):
        assert backend.kernels.launched[-1] == f"matvec_q8_batch_{cuda_matmul.TYPE_SUFFIX[qtype]}"
    together = host(backend, together)
    dense = reference(raw, qtype).astype(np.float64)
    assert np.all(np.abs(together - x @ dense.T) <= int8_product_bound(x, dense))
    for t in (0, 3, x.shape[0] - 1):
        for rows in (1, 2):
            alone = backend.xp.empty((1, 37), np.float32)
            cuda_matmul.matvec_q8(backend.kernels, (xq[t:t + 1], xs[t:t + 1]), w, alone, rows_per_warp=lambda _: rows)
            np.testing.assert_array_equal(host(backend, alone)[0], together[t])


@pytest.mark.parametrize("tile", [cuda_matmul.MMQ_ROWS, cuda_matmul.MMQ_ROWS // 2])
@pytest.mark.parametrize("qtype", sorted(cuda_matmul.MMA_TYPES, key=int), ids=lambda t: t.name)
def test_prompt_products_on_int8_tensor_cores(backend, qtype, tile):
    """matmul_q8_mma with tiles of both sizes, on partial tiles of rows and tokens, with a partial
    stage of runs for the 32-element types and a zero run: up to float32 rounding the 8-bit activations as quantize_q8
    made them times the weights, so each fragment of the int8 products sits where PTX puts it
    (a lane's bytes in another row or run would be off by the products' size); and within the
    activations' rounding of x · Wᵀ."""
    rng = np.random.default_rng(int(qtype) + tile)
    rows, n_tok = cuda_matmul.MMQ_ROWS + 3, cuda_matmul.MMQ_TOKENS + 6
    cols = 768 if GGML_QUANT_SIZES[qtype][0] == 256 else 160
    raw = random_weights(rng, qtype, rows, cols)
    w = backend.matrix(raw, qtype, matmul=True)
    x = (rng.standard_normal((n_tok, cols)) * np.exp(rng.uniform(-2, 2, (n_tok, 1)))).astype(np.float32)
    x[:, 32:64] = 0.0
    x8 = cuda_matmul.quantize_q8(backend.kernels, backend.xp.asarray(x))
    y = backend.xp.full((n_tok, rows), np.nan, np.float32)
    cuda_matmul.matmul_q8_mma(backend.kernels, x8, w, y, tile)
    if hasattr(backend.kernels, "launched"):
        form = "" if tile == cuda_matmul.MMQ_ROWS else f"rows{tile}_"
        assert backend.kernels.launched[-1] == f"matmul_q8_mma_{form}{cuda_matmul.TYPE_SUFFIX[qtype]}"
    xq, xs = (host(backend, a).astype(np.float64) for a in x8)
    rounded = (xq.reshape(n_tok, -1, 32) * xs[..., :1]).reshape(n_tok, cols)
    dense = reference(raw, qtype).astype(np.float64)
    got = host(backend, y).astype(np.float64)
    assert_close(got, rounded @ dense.T, rtol=1e-5, scale=np.abs(rounded) @ np.abs(dense).T)
    assert np.all(np.abs(got - x @ dense.T) <= int8_product_bound(x, dense))


@pytest.mark.parametrize("big", [True, False])
def test_products_sharing_an_input_with_8_bit_activations(backend, big, monkeypatch):
    """A backend with int8 products: below GEMM_MIN_TOKENS, products with matrices of INT8_TYPES
    take the integer path (in chunks of MATVEC_MAX_TOKENS), each within its bound, with x quantized
    once for all; other types stay float32-exact. Unless none of the matrices is INT8_MIN_BYTES
    big: then all stay float32-exact (here the threshold moves, not the matrices)."""
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    int8 = CudaBackend(backend.kernels, "int8")
    rng = np.random.default_rng(8)
    types = (QType.Q4_K, QType.Q6_K, QType.Q5_K, QType.Q8_0)
    raws = [random_weights(rng, qtype, 24 + i, 512) for i, qtype in enumerate(types)]
    ws = [int8.matrix(raw, qtype, matmul=True) for raw, qtype in zip(raws, types)]
    biggest = max(raw.nbytes for raw in raws)
    monkeypatch.setattr(cuda_matmul, "INT8_MIN_BYTES", biggest if big else biggest + 1)
    for n_tok in (1, 3, cuda_matmul.MATVEC_MAX_TOKENS + 3):
        x = rng.standard_normal((n_tok, 512)).astype(np.float32)
        launched = len(getattr(int8.kernels, "launched", ()))
        products = int8.matmuls(int8.xp.asarray(x), ws)
        if hasattr(int8.kernels, "launched"):  # the emulator's record: x quantized once for all
            assert int8.kernels.launched[launched:].count("quantize_q8") == big
        for raw, qtype, got in zip(raws, types, products):
            dense = reference(raw, qtype).astype(np.float64)
            want, exact = x @ dense.T, np.abs(x) @ np.abs(dense).T
            bound = int8_product_bound(x, dense) if big and qtype in cuda_matmul.INT8_TYPES else 1e-5 * exact
            assert np.all(np.abs(host(int8, got) - want) <= bound), (n_tok, qtype.name)


@pytest.mark.parametrize("op", ["rmsnorm", "swiglu", "geglu"])
@pytest.mark.parametrize("shape", [(1, 2880), (3, 576), (cuda_matmul.GEMM_MIN_TOKENS - 1, 64), (cuda_matmul.GEMM_MIN_TOKENS + 9, 64)])
def test_norms_and_glus_quantize_their_output_for_the_products(backend, op, shape, monkeypatch):
    """With int8 products, a few tokens' (and, with int8 tensor cores, a prompt's) RMSNorm or GLU
    output is quantized by the op itself: bit for bit its float32 output and that output's
    quantize_q8. A product after takes that form (no quantize_q8 launch) and gives bit for bit
    what it gives with the output quantized apart."""
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    monkeypatch.setattr(cuda_matmul, "INT8_MIN_BYTES", 0)
    int8 = CudaBackend(backend.kernels, "int8")
    rng = np.random.default_rng(len(op) + shape[0])
    x, up = (_wide_range_activations(rng, *shape) for _ in range(2))
    w = rng.standard_normal(shape[1]).astype(np.float32)
    make = {"rmsnorm": lambda b: b.rmsnorm(b.xp.asarray(x), b.xp.asarray(w), 1e-6),
            "swiglu": lambda b: b.glu(b.xp.asarray(x), b.xp.asarray(up), False),
            "geglu": lambda b: b.glu(b.xp.asarray(x / 1e3), b.xp.asarray(up), True)}[op]
    y = make(int8)
    np.testing.assert_array_equal(host(int8, y), host(backend, make(CudaBackend(backend.kernels, "float"))))
    for fused, apart in zip(int8._x8[1], cuda_matmul.quantize_q8(backend.kernels, y)):
        np.testing.assert_array_equal(host(int8, fused), host(int8, apart))
    wm = int8.matrix(random_weights(rng, QType.Q8_0, 8, shape[1]), QType.Q8_0, matmul=True)
    launched = len(getattr(int8.kernels, "launched", ()))
    got = int8.matmul(y, wm)
    if hasattr(int8.kernels, "launched"):
        assert "quantize_q8" not in int8.kernels.launched[launched:]
    want = int8.matmul(int8.xp.asarray(host(int8, y)), wm)   # another array: quantized on the way in
    np.testing.assert_array_equal(host(int8, got), host(int8, want))


@pytest.mark.parametrize("rows", [(64, 16, 16), (64, 18, 16)], ids=["joined", "not-aligned"])
def test_products_loaded_together(backend, rows):
    """q, k and v loaded with matrices(): one token's products in one launch, each matrix's output
    bit for bit its own product's; more tokens, or a matrix whose first row would leave the
    output's 16-byte alignment, one launch each."""
    rng = np.random.default_rng(12)
    raws = [random_weights(rng, QType.Q4_K, n, 256) for n in rows]
    ws, alone = backend.matrices(raws, QType.Q4_K), [backend.matrix(raw, QType.Q4_K, matmul=True) for raw in raws]
    joined = all(n % 4 == 0 for n in rows)
    for n_tok in (1, 3):
        x = backend.xp.asarray(rng.standard_normal((n_tok, 256)).astype(np.float32))
        launched = len(getattr(backend.kernels, "launched", ()))
        got = backend.matmuls(x, ws)
        if hasattr(backend.kernels, "launched"):
            assert len(backend.kernels.launched) - launched == (1 if joined and n_tok == 1 else 3)
        for y, w in zip(got, alone):
            np.testing.assert_array_equal(host(backend, y), host(backend, backend.matmul(x, w)))


def test_products_with_a_joined_run_among_them(backend):
    """q and k loaded together, v of another type alone (as Q4_K_M's Q6_K v): one token's three
    products in two launches, each bit for bit its own product's."""
    rng = np.random.default_rng(13)
    raws = [random_weights(rng, qtype, 16, 256) for qtype in (QType.Q4_K, QType.Q4_K, QType.Q6_K)]
    ws = [*backend.matrices(raws[:2], QType.Q4_K), backend.matrix(raws[2], QType.Q6_K, matmul=True)]
    x = backend.xp.asarray(rng.standard_normal((1, 256)).astype(np.float32))
    launched = len(getattr(backend.kernels, "launched", ()))
    got = backend.matmuls(x, ws)
    if hasattr(backend.kernels, "launched"):
        assert len(backend.kernels.launched) - launched == 2
    for y, raw, qtype in zip(got, raws, (QType.Q4_K, QType.Q4_K, QType.Q6_K)):
        alone = backend.matmul(x, backend.matrix(raw, qtype, matmul=True))
        np.testing.assert_array_equal(host(backend, y), host(backend, alone))


@pytest.mark.parametrize("products", ["float", "int8"])
@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q6_K, QType.Q4_1, QType.Q5_0], ids=lambda t: t.name)
def test_products_add_the_residual_in_their_epilogue(backend, qtype, products, monkeypatch):
    """matmul_add(x, w, r): bit for bit r + matmul(x, w) through add, for one token (1 and 2 rows
    a warp), a few (in chunks of MATVEC_MAX_TOKENS) and a GEMM's many, float32 and 8-bit
    activations; below GEMM_MIN_TOKENS with no launch of the add (the matvec_add_* kernels)."""
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    monkeypatch.setattr(cuda_matmul, "INT8_MIN_BYTES", 0)
    b = CudaBackend(backend.kernels, products)
    rng = np.random.default_rng(int(qtype) + len(products))
    cols = 512 if GGML_QUANT_SIZES[qtype][0] == 256 else 160
    raw = random_weights(rng, qtype, 37, cols)
    for rows in (1, 2):
        monkeypatch.setattr(cuda_matmul, "MATVEC_ROWS2_MIN", 0 if rows == 2 else 1 << 30)
        monkeypatch.setattr(cuda_matmul, "MATVEC_ROWS2_TYPES", {k: frozenset({qtype}) for k in ("float", "int8")})
        w = b.matrix(raw, qtype, matmul=True)
        for n_tok in (1, 3, cuda_matmul.MATVEC_MAX_TOKENS + 3, cuda_matmul.GEMM_MIN_TOKENS + 5):
            x = b.xp.asarray(_wide_range_activations(rng, n_tok, cols))
            r = b.xp.asarray(rng.standard_normal((n_tok, 37)).astype(np.float32) * 10)
            launched = len(getattr(b.kernels, "launched", ()))
            got = b.matmul_add(x, w, r)
            if hasattr(b.kernels, "launched"):
                names = b.kernels.launched[launched:]
                assert ("add_f32" in names) == (n_tok >= cuda_matmul.GEMM_MIN_TOKENS), names
                if n_tok == 1:
                    int8 = products == "int8" and qtype in cuda_matmul.INT8_TYPES
                    form = f"{'matvec_q8' if int8 else 'matvec'}_add_{'rows2_' if rows == 2 else ''}"
                    assert names[-1] == form + cuda_matmul.TYPE_SUFFIX[qtype], names
            np.testing.assert_array_equal(host(b, got), host(b, b.add(r, b.matmul(x, w))))


@pytest.mark.parametrize("qtype", [QType.Q4_1, QType.Q4_K, QType.Q8_0, QType.F16], ids=lambda t: t.name)
@pytest.mark.parametrize("cols", [768, 1536])   # the norm's sum as rmsnorm runs it in 32 threads, in 256
def test_products_normalize_their_input(backend, qtype, cols, monkeypatch):
    """rmsnorm_matmuls(x, n, eps, ws): bit for bit matmuls of rmsnorm(x, n, eps), within float32 of
    the NumPy backend's. One token's float products (q, k and v joined; 1 and 2 rows a warp)
    normalize x themselves: a launch per product (matvec_norm_*), none for the norm."""
    rng = np.random.default_rng(int(qtype) + cols)
    raws = [random_weights(rng, qtype, n, cols) for n in (64, 16, 16)]
    norm = rng.uniform(0.5, 2.0, cols).astype(np.float32)
    for rows in (1, 2):
        monkeypatch.setattr(cuda_matmul, "MATVEC_ROWS2_MIN", 0 if rows == 2 else 1 << 30)
        monkeypatch.setattr(cuda_matmul, "MATVEC_ROWS2_TYPES", {k: frozenset({qtype}) for k in ("float", "int8")})
        ws = backend.matrices(raws, qtype)
        for n_tok in (1, 3):
            x = _wide_range_activations(rng, n_tok, cols)
            launched = len(getattr(backend.kernels, "launched", ()))
            got = backend.rmsnorm_matmuls(backend.xp.asarray(x), backend.xp.asarray(norm), 1e-6, ws)
            if hasattr(backend.kernels, "launched") and n_tok == 1:
                suffix = cuda_matmul.TYPE_SUFFIX[qtype]
                assert backend.kernels.launched[launched:] == [f"matvec_norm_{'rows2_' if rows == 2 else ''}{suffix}"]
            h = backend.rmsnorm(backend.xp.asarray(x), backend.xp.asarray(norm), 1e-6)
            cpu_h = CPU.rmsnorm(x, norm, 1e-6)
            for y, want, raw in zip(got, backend.matmuls(h, ws), raws):
                np.testing.assert_array_equal(host(backend, y), host(backend, want))
                dense = reference(raw, qtype).astype(np.float64)
                assert_close(host(backend, y), cpu_h @ dense.T, rtol=1e-5, scale=np.abs(cpu_h) @ np.abs(dense).T)


@pytest.mark.parametrize("qtype", [QType.Q4_1, QType.Q4_K, QType.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize("gelu", [False, True], ids=["swiglu", "geglu"])
def test_gate_and_up_products_apply_the_glu(backend, qtype, gelu):
    """glu_matmuls(x, gate, up, gelu[, norm]): bit for bit glu of the products (of rmsnorm(x) with
    the norm), within float32 of the NumPy backend's. Gate and up joined: one token's in one
    launch (matvec_glu_*, matvec_norm_glu_*), a few tokens' in one after the norm's
    (matvec_glu_batch_*); more tokens, or gate and up apart, as before."""
    rng = np.random.default_rng(int(qtype) + gelu)
    cols, n = 1536, 36
    raws = [random_weights(rng, qtype, n, cols) for _ in range(2)]
    norm = rng.uniform(0.5, 2.0, cols).astype(np.float32)
    joined, apart = backend.matrices(raws, qtype), [backend.matrix(raw, qtype, matmul=True) for raw in raws]
    suffix = cuda_matmul.TYPE_SUFFIX[qtype]
    for ws in (joined, apart):
        for n_tok in (1, 3, cuda_matmul.MATVEC_MAX_TOKENS + 1):
            x = _wide_range_activations(rng, n_tok, cols) / (1e3 if gelu else 1)
            for normed in (False, True):
                launched = len(getattr(backend.kernels, "launched", ()))
                nw = backend.xp.asarray(norm) if normed else None
                got = host(backend, backend.glu_matmuls(backend.xp.asarray(x), *ws, gelu, nw, 1e-6))
                if hasattr(backend.kernels, "launched") and ws is joined:
                    names = backend.kernels.launched[launched:]
                    if n_tok == 1:
                        assert names == [f"matvec{'_norm' if normed else ''}_glu_{suffix}"]
                    elif n_tok <= cuda_matmul.MATVEC_MAX_TOKENS:
                        assert names == ["rmsnorm_f32"] * normed + [f"matvec_glu_batch_{suffix}"]
                h = backend.rmsnorm(backend.xp.asarray(x), nw, 1e-6) if normed else backend.xp.asarray(x)
                np.testing.assert_array_equal(got, host(backend, backend.glu(*backend.matmuls(h, ws), gelu)))
                cpu_h = CPU.rmsnorm(x, norm, 1e-6) if normed else x
                gate, up = (cpu_h @ reference(raw, qtype).astype(np.float64).T for raw in raws)
                want = CPU.glu(gate.astype(np.float32), up.astype(np.float32), gelu)
                bound = 1e-5 * (np.abs(cpu_h) @ np.abs(reference(raws[1], qtype)).T) * (np.abs(gate) + 1)
                assert np.all(np.abs(got - want) <= bound), (n_tok, normed)


@pytest.mark.parametrize("qtype", sorted(cuda_matmul.INT8_TYPES, key=int), ids=lambda t: t.name)
@pytest.mark.parametrize("gelu", [False, True], ids=["swiglu", "geglu"])
def test_8_bit_gate_and_up_products_apply_the_glu_and_quantize_it(backend, qtype, gelu, monkeypatch):
    """With int8 products, one token's glu_matmuls with gate and up joined is one launch after the
    norm's or the input's quantization (matvec_q8_glu_*): bit for bit the products apart
    (matvec_q8_*) and the GLU after them (swiglu_q8, geglu_q8), its 8-bit form included, which
    the down product then takes as it is (no quantize_q8)."""
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    monkeypatch.setattr(cuda_matmul, "INT8_MIN_BYTES", 0)
    int8 = CudaBackend(backend.kernels, "int8")
    rng = np.random.default_rng(int(qtype) + 40 + gelu)
    cols, n, suffix = (512 if GGML_QUANT_SIZES[qtype][0] == 256 else 160), 96, cuda_matmul.TYPE_SUFFIX[qtype]
    raws = [random_weights(rng, qtype, n, cols) for _ in range(2)]
    joined, apart = int8.matrices(raws, qtype), [int8.matrix(raw, qtype, matmul=True) for raw in raws]
    down = int8.matrix(random_weights(rng, QType.Q8_0, 8, n), QType.Q8_0, matmul=True)
    norm = int8.xp.asarray(rng.uniform(0.5, 2.0, cols).astype(np.float32))
    emulated = hasattr(int8.kernels, "launched")
    for normed in (False, True):
        x = int8.xp.asarray(_wide_range_activations(rng, 1, cols) / (1e3 if gelu else 1))
        nw = norm if normed else None
        launched = len(getattr(int8.kernels, "launched", ()))
        got = int8.glu_matmuls(x, *joined, gelu, nw, 1e-6)
        got8 = int8._x8[1]
        got_down = int8.matmul(got, down)
        if emulated:
            assert int8.kernels.launched[launched:] == [
                "rmsnorm_q8" if normed else "quantize_q8", f"matvec_q8_glu_{suffix}", "matvec_q8_q8_0"]
        launched = len(getattr(int8.kernels, "launched", ()))
        want = int8.glu_matmuls(x, *apart, gelu, nw, 1e-6)
        if emulated:
            assert int8.kernels.launched[launched:][-1] == f"{'geglu' if gelu else 'swiglu'}_q8"
        np.testing.assert_array_equal(host(int8, got), host(int8, want))
        for fused, unfused in zip(got8, int8._x8[1]):
            np.testing.assert_array_equal(host(int8, fused), host(int8, unfused))
        np.testing.assert_array_equal(host(int8, got_down), host(int8, int8.matmul(want, down)))


@pytest.mark.parametrize("n_tok", [1, 2])
def test_8_bit_products_of_two_types_in_one_launch(backend, n_tok, monkeypatch):
    """With int8 products, one token's products with q and k joined in Q4_K and v in Q6_K (as
    llama.cpp's Q4_K_M makes attn_v in half the layers) are one launch after the quantization
    (matvec_q8_pair_q4_K_q6_K), bit for bit each product alone (matvec_q8_*); two tokens' are
    launched apart, as before. v's 30 rows leave a thread block part-filled."""
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    monkeypatch.setattr(cuda_matmul, "INT8_MIN_BYTES", 0)
    int8 = CudaBackend(backend.kernels, "int8")
    rng = np.random.default_rng(50 + n_tok)
    cols = 512
    raws = [random_weights(rng, QType.Q4_K, 36, cols), random_weights(rng, QType.Q4_K, 20, cols),
            random_weights(rng, QType.Q6_K, 30, cols)]
    ws = [*int8.matrices(raws[:2], QType.Q4_K), int8.matrix(raws[2], QType.Q6_K, matmul=True)]
    x = int8.xp.asarray(_wide_range_activations(rng, n_tok, cols))
    launched = len(getattr(int8.kernels, "launched", ()))
    got = int8.matmuls(x, ws)
    if hasattr(int8.kernels, "launched"):
        pair = "matvec_q8_pair_q4_K_q6_K"
        assert (int8.kernels.launched[launched:] == ["quantize_q8", pair]) == (n_tok == 1)
        assert (pair in int8.kernels.launched[launched:]) == (n_tok == 1)
    for g, raw, qtype in zip(got, raws, (QType.Q4_K, QType.Q4_K, QType.Q6_K)):
        alone = int8.matmul(x, int8.matrix(raw, qtype, matmul=True))
        assert g.shape == (n_tok, raw.shape[0])
        np.testing.assert_array_equal(host(int8, g), host(int8, alone))


def test_the_products_path_is_checked():
    from llogos_cli.backends.cuda.cuda_backend import choose_products
    assert choose_products("float") == "float"
    with pytest.raises(LlogosError, match="not one of"):
        choose_products("int4")


@pytest.mark.parametrize("n_expert, k", [(32, 4), (128, 8), (200, 6), (1024, 2)])
def test_route_of_real_expert_counts(backend, n_expert, k):
    """The router's picks and probabilities at gpt-oss's, Qwen3-MoE's and larger expert counts (lanes
    holding several experts each), ties among the top ones to the lower index, as the CPU backend."""
    rng = np.random.default_rng(n_expert)
    logits = rng.standard_normal((7, n_expert)).astype(np.float32)
    top = np.argsort(-logits[1])[:3]
    logits[1, top] = logits[1, top[0]]                   # three-way tie at the top
    logits[2, 33 % n_expert] = logits[2, 1] = 9.0        # a tie across lanes
    for normalize in (True, False):
        experts, weights = backend.route(backend.xp.asarray(logits), k, normalize=normalize)
        want_experts, want_weights = CPU.route(logits, k, normalize=normalize)
        np.testing.assert_array_equal(host(backend, experts), want_experts)
        assert_close(host(backend, weights), want_weights, rtol=1e-6)


@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda t: t.name)
def test_route_and_matmul_experts(backend, qtype):
    """A mixture-of-experts layer's ops: 9 tokens routed to 3 of 6 experts (ties included), through
    stacked expert matrices; the same routing, products and weighted sums as the CPU backend."""
    rng = np.random.default_rng(15)
    n_expert, k, out, cols, n_tok = 6, 3, 40, 256, 9
    logits = rng.standard_normal((n_tok, n_expert)).astype(np.float32)
    logits[0, 2] = logits[0, 4]   # a tie: the lower index first, on both backends
    experts, weights = backend.route(backend.xp.asarray(logits), k)
    want_experts, want_weights = CPU.route(logits, k)
    np.testing.assert_array_equal(host(backend, experts), want_experts)
    assert_close(host(backend, weights), want_weights, rtol=1e-6)
    plain = host(backend, backend.route(backend.xp.asarray(logits), k, normalize=False)[1])   # Qwen2-MoE
    assert_close(plain, CPU.route(logits, k, normalize=False)[1], rtol=1e-6)
    assert np.all(plain.sum(axis=1) < 0.999)
    raw = random_weights(rng, qtype, n_expert * out, cols)
    w, cpu_w = backend.matrix(raw, qtype, matmul=True), CPU.matrix(raw, qtype, matmul=True)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    got = host(backend, backend.matmul_experts(backend.xp.asarray(x), w, experts, n_expert))
    assert_close(got, CPU.matmul_experts(x, cpu_w, want_experts, n_expert), rtol=1e-5)
    per_pair = rng.standard_normal((n_tok, k, cols)).astype(np.float32)   # a down product: one input per pair
    got = host(backend, backend.matmul_experts(backend.xp.asarray(per_pair), w, experts, n_expert, weights))
    assert_close(got, CPU.matmul_experts(per_pair, cpu_w, want_experts, n_expert, want_weights), rtol=1e-5)
    bias = rng.standard_normal(n_expert * out).astype(np.float32)   # gpt-oss: each expert's own bias
    got = host(backend, backend.matmul_experts(backend.xp.asarray(per_pair), w, experts, n_expert, weights,
                                               backend.xp.asarray(bias)))
    assert_close(got, CPU.matmul_experts(per_pair, cpu_w, want_experts, n_expert, want_weights, bias), rtol=1e-5)


def skewed_routing(rng, n_tok: int, n_expert: int, k: int) -> np.ndarray:
    """(n_tok, k) distinct experts a token, expert e chosen in proportion to 1 / (e + 1)^2: a few
    experts with many tokens, many with few or none."""
    p = 1.0 / np.arange(1, n_expert + 1) ** 2
    return np.stack([rng.choice(n_expert, k, replace=False, p=p / p.sum()) for _ in range(n_tok)]).astype(np.int32)


@pytest.mark.parametrize("n_expert, k, n_tok", [(6, 3, 20), (128, 8, 300), (1024, 2, 37)])
def test_group_pairs_by_expert(backend, n_expert, k, n_tok):
    """moe_sort's grouping, as the CPU backend's stable sort of the pairs by expert (300 x 8 pairs:
    several tiles of them), its plan (experts with EXPERT_GEMM_MIN_TOKENS pairs or more a GEMM each,
    the others' pairs in tiles of up to 8), and moe_gather's rows in that order (float32, float16,
    and quantize_q8's form)."""
    rng = np.random.default_rng(n_expert)
    experts = skewed_routing(rng, n_tok, n_expert, k)
    grouping = cuda_experts.group(backend.kernels, backend.xp.asarray(experts), n_expert)
    order = np.argsort(experts.ravel(), kind="stable")
    np.testing.assert_array_equal(host(backend, grouping.order), order)
    counts = np.bincount(experts.ravel(), minlength=n_expert)
    starts = np.concatenate([[0], np.cumsum(counts)])
    assert [e for e, _, _ in grouping.gemms] == np.flatnonzero(counts >= cuda_experts.EXPERT_GEMM_MIN_TOKENS).tolist()
    assert all((a, b) == (starts[e], starts[e + 1]) for e, a, b in grouping.gemms)
    tiles = host(backend, grouping.tiles)
    assert np.all((tiles[:, 2] >= 1) & (tiles[:, 2] <= cuda_experts.TILE_TOKENS))
    covered = np.zeros(experts.size, np.int32)
    for e, first, count in tiles:
        assert starts[e] <= first and first + count <= starts[e + 1]
        covered[first:first + count] += 1
    for _, a, b in grouping.gemms:
        covered[a:b] += 1
    assert np.all(covered == 1)
    mma, rest = host(backend, grouping.mma_tiles), host(backend, grouping.mma_rest)   # the plan on int8 tensor cores
    assert np.all((mma[:, 2] >= 1) & (mma[:, 2] <= cuda_matmul.MMQ_TOKENS))
    assert np.all((rest[:, 2] >= 1) & (rest[:, 2] <= cuda_experts.TILE_TOKENS))
    assert set(mma[:, 0]) == set(np.flatnonzero(counts >= cuda_experts.EXPERT_MMA_MIN_TOKENS))
    assert set(rest[:, 0]) == set(np.flatnonzero((counts > 0) & (counts < cuda_experts.EXPERT_MMA_MIN_TOKENS)))
    covered[:] = 0
    for e, first, count in np.concatenate([mma, rest]):
        assert starts[e] <= first and first + count <= starts[e + 1]
        covered[first:first + count] += 1
    assert np.all(covered == 1)
    cols = 96
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    per_pair = rng.standard_normal((n_tok, k, cols)).astype(np.float32)
    for source, rows in ((x, x[order // k]), (per_pair, per_pair.reshape(-1, cols)[order])):
        got = host(backend, cuda_experts.gather(backend.kernels, backend.xp.asarray(source), grouping.order, k, np.float32))
        np.testing.assert_array_equal(got, rows)
        got = host(backend, cuda_experts.gather(backend.kernels, backend.xp.asarray(source), grouping.order, k, np.float16))
        np.testing.assert_array_equal(got.view(np.uint16), rows.astype(np.float16).view(np.uint16))
        x8 = cuda_matmul.quantize_q8(backend.kernels, backend.xp.asarray(source.reshape(-1, cols)))
        picked = order // k if source.ndim == 2 else order
        gq, gs = cuda_experts.gather_q8(backend.kernels, x8, grouping.order, k, source.ndim == 3)
        np.testing.assert_array_equal(host(backend, gq), host(backend, x8[0])[picked])
        np.testing.assert_array_equal(host(backend, gs), host(backend, x8[1])[picked])


@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda t: t.name)
def test_grouped_matmul_experts(backend, qtype):
    """A prompt's expert products (GROUP_MIN_TOKENS tokens or more): 70 tokens through 3 of 6
    experts, expert 1 chosen by every one (an f16 GEMM) and the others by fewer than
    EXPERT_GEMM_MIN_TOKENS (moe_matvec's tiles), put back in pair order, with bias and weights; as the CPU."""
    rng = np.random.default_rng(16)
    n_expert, k, out, cols, n_tok = 6, 3, 40, 256, 70
    experts = np.stack([np.concatenate([[1], rng.choice([0, 2, 3, 4, 5], k - 1, replace=False)])
                        for _ in range(n_tok)]).astype(np.int32)
    counts = np.bincount(experts.ravel())
    assert n_tok >= cuda_experts.GROUP_MIN_TOKENS and counts[[0, 2, 3, 4, 5]].max() < cuda_experts.EXPERT_GEMM_MIN_TOKENS <= counts[1]
    weights = rng.uniform(0.1, 1, (n_tok, k)).astype(np.float32)
    raw = random_weights(rng, qtype, n_expert * out, cols)
    w, cpu_w = backend.matrix(raw, qtype, matmul=True), CPU.matrix(raw, qtype, matmul=True)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    dense = np.abs(reference(raw, qtype).astype(np.float64)).reshape(n_expert, out, cols)
    scale = np.einsum("tc,tjoc->tjo", np.abs(x), dense[experts])   # sum |x||w| of each output
    if hasattr(backend.kernels, "launched"):
        backend.kernels.launched.clear()
    got = host(backend, backend.matmul_experts(backend.xp.asarray(x), w, backend.xp.asarray(experts), n_expert))
    want = CPU.matmul_experts(x, cpu_w, experts, n_expert)
    gemm = experts == 1
    assert_close(got[gemm], want[gemm], rtol=2e-3, scale=scale[gemm])    # float16 inputs
    assert_close(got[~gemm], want[~gemm], rtol=1e-5, scale=scale[~gemm])
    if hasattr(backend.kernels, "launched"):
        suffix = cuda_matmul.TYPE_SUFFIX[qtype]
        assert {"moe_sort_i32", "moe_gather_f32", "moe_gather_f16", f"moe_matvec_{suffix}", f"dequantize_{suffix}",
                "moe_scatter_f32"} <= set(backend.kernels.launched)
        assert f"matvec_experts_{suffix}" not in backend.kernels.launched
    per_pair = rng.standard_normal((n_tok, k, cols)).astype(np.float32)   # a down product: one input per pair
    bias = rng.standard_normal(n_expert * out).astype(np.float32)
    got = host(backend, backend.matmul_experts(backend.xp.asarray(per_pair), w, backend.xp.asarray(experts), n_expert,
                                               backend.xp.asarray(weights), backend.xp.asarray(bias)))
    want = CPU.matmul_experts(per_pair, cpu_w, experts, n_expert, weights, bias)
    scale = np.einsum("tj,tjc,tjoc->to", weights, np.abs(per_pair), dense[experts])
    assert_close(got, want, rtol=2e-3, scale=scale)


@pytest.mark.parametrize("qtype", sorted(cuda_matmul.MMA_TYPES, key=int), ids=lambda t: t.name)
def test_grouped_matmul_experts_on_int8_tensor_cores(backend, qtype):
    """A prompt's expert products with int8 products on a GPU that has int8 tensor cores: 90 tokens
    through 3 of 6 experts, expert 1 chosen by all (two token tiles), expert 5 by 3 (fewer than
    EXPERT_MMA_MIN_TOKENS: moe_matvec, float32-exact), the others by ~44. The tensor-core pairs are,
    up to float32 rounding, their 8-bit activations (quantize_q8's) times their expert's weights,
    so a tile reading another expert's weights or another tile's rows would be off by the products'
    size; within the activations' rounding of the CPU's. A down product (a row a pair) with weights
    and bias: within the same bounds, weighted."""
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend

    int8 = CudaBackend(backend.kernels, "int8")
    if not int8.kernels.int8_mma:
        pytest.skip("the GPU has no int8 tensor cores")
    rng = np.random.default_rng(int(qtype) + 44)
    n_expert, k, out, cols, n_tok = 6, 3, 40, 256, 90
    experts = np.stack([np.concatenate([[1], [5] if t < 3 else [], rng.choice([0, 2, 3, 4], k - 1 - (t < 3), replace=False)])
                        for t in range(n_tok)]).astype(np.int32)
    counts = np.bincount(experts.ravel(), minlength=n_expert)
    assert counts[1] > cuda_matmul.MMQ_TOKENS and 0 < counts[5] < cuda_experts.EXPERT_MMA_MIN_TOKENS <= counts[[0, 2, 3, 4]].min()
    raw = random_weights(rng, qtype, n_expert * out, cols)
    w, cpu_w = int8.matrix(raw, qtype, matmul=True), CPU.matrix(raw, qtype, matmul=True)
    dense = reference(raw, qtype).astype(np.float64).reshape(n_expert, out, cols)
    x = (rng.standard_normal((n_tok, cols)) * np.exp(rng.uniform(-2, 2, (n_tok, 1)))).astype(np.float32)
    x[:, 32:64] = 0.0
    launched = len(getattr(int8.kernels, "launched", ()))
    got = host(int8, int8.matmul_experts(int8.xp.asarray(x), w, int8.xp.asarray(experts), n_expert)).astype(np.float64)
    if hasattr(int8.kernels, "launched"):   # the emulator's record of kernel names
        suffix, names = cuda_matmul.TYPE_SUFFIX[qtype], set(int8.kernels.launched[launched:])
        assert {f"moe_matmul_q8_mma_{suffix}", f"moe_matvec_{suffix}", "quantize_q8", "moe_gather_q8"} <= names
        assert not {f"dequantize_{suffix}", f"matvec_experts_{suffix}"} & names
    xq, xs = (host(int8, a).astype(np.float64) for a in cuda_matmul.quantize_q8(int8.kernels, int8.xp.asarray(x)))
    rounded = (xq.reshape(n_tok, -1, 32) * xs[..., :1]).reshape(n_tok, cols)
    for e in range(n_expert):
        t, j = np.nonzero(experts == e)
        if e == 5:
            assert_close(got[t, j], x[t] @ dense[e].T, rtol=1e-5, scale=np.abs(x[t]) @ np.abs(dense[e]).T)
            continue
        assert_close(got[t, j], rounded[t] @ dense[e].T, rtol=1e-5, scale=np.abs(rounded[t]) @ np.abs(dense[e]).T)
        assert np.all(np.abs(got[t, j] - x[t] @ dense[e].T) <= int8_product_bound(x[t], dense[e]))

    per_pair = rng.standard_normal((n_tok, k, cols)).astype(np.float32)
    weights = rng.uniform(0.1, 1, (n_tok, k)).astype(np.float32)
    bias = rng.standard_normal(n_expert * out).astype(np.float32)
    got = host(int8, int8.matmul_experts(int8.xp.asarray(per_pair), w, int8.xp.asarray(experts), n_expert,
                                         int8.xp.asarray(weights), int8.xp.asarray(bias))).astype(np.float64)
    want = CPU.matmul_experts(per_pair, cpu_w, experts, n_expert, weights, bias).astype(np.float64)
    bound = np.zeros((n_tok, out))
    for t in range(n_tok):
        for j, e in enumerate(experts[t]):
            bound[t] += weights[t, j] * (int8_product_bound(per_pair[t, j:j + 1], dense[e])[0] + 1e-5 * np.abs(bias[e * out:(e + 1) * out]))
    assert np.all(np.abs(got - want) <= bound + 1e-5 * np.abs(want))


@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q6_K, QType.BF16], ids=lambda t: t.name)
def test_matmul_dequantizes_in_row_chunks(backend, qtype):
    cols = 768 if GGML_QUANT_SIZES[qtype][0] == 256 else 160
    _check_product(backend, qtype, cuda_matmul.GEMM_MIN_TOKENS, cuda_matmul.Scratch(backend.xp, limit=5 * cols))


def test_plain_matrices_need_rows_of_four(backend):
    with pytest.raises(LlogosError, match="multiple of 4"):
        backend.matrix(np.zeros((2, 34 * 4), np.uint8), QType.F32, matmul=True)
    # Shorter rows are a convolution kernel's (LFM2's are 3 wide), held as float32 for ssm_conv.
    kernel = np.arange(2 * 3, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(host(backend, backend.matrix(kernel.view(np.uint8), QType.F32, matmul=True)), kernel)


# ------------------------------------------------------------------ elementwise and norms
@pytest.mark.parametrize("shape", [(5, 64), (3, 4, 128), (2, 1536), (1, 100)])
def test_rmsnorm(backend, shape):
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape[-1]).astype(np.float32)
    got = backend.rmsnorm(backend.xp.asarray(x), backend.xp.asarray(w), 1e-6)
    assert_close(host(backend, got), CPU.rmsnorm(x, w, 1e-6))


@pytest.mark.parametrize("shape", [(5, 64), (2, 1536)])
def test_l2norm(backend, shape):
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    x[0] = 0  # all-zero row: eps keeps it finite
    assert_close(host(backend, backend.l2norm(backend.xp.asarray(x), 1e-6)), CPU.l2norm(x, 1e-6))


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("dims", [64, 32])
def test_rope(backend, neox, dims):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 5, 64)).astype(np.float32)
    pos = np.array([0, 17, 4999], np.int32)
    got = backend.rope(backend.xp.asarray(x), pos, dims, 1e6, 0.25, neox)
    assert_close(host(backend, got), CPU.rope(x, pos, dims, 1e6, 0.25, neox), rtol=2e-6)
    factors = rng.uniform(1.0, 8.0, dims // 2).astype(np.float32)  # Llama 3-style rope_freqs
    got = backend.rope(backend.xp.asarray(x), pos, dims, 1e6, 0.25, neox, backend.xp.asarray(factors))
    assert_close(host(backend, got), CPU.rope(x, pos, dims, 1e6, 0.25, neox, factors), rtol=2e-6)
    got = backend.rope(backend.xp.asarray(x), pos, dims, 1e6, 0.25, neox, backend.xp.asarray(factors), 1.2)  # Phi-3's
    assert_close(host(backend, got), CPU.rope(x, pos, dims, 1e6, 0.25, neox, factors, 1.2), rtol=2e-6)


@pytest.mark.parametrize("gelu", [False, True])
def test_glu(backend, gelu):
    rng = np.random.default_rng(6)
    gate, up = (rng.standard_normal((3, 300)).astype(np.float32) * 4 for _ in range(2))
    got = backend.glu(backend.xp.asarray(gate), backend.xp.asarray(up), gelu)
    assert_close(host(backend, got), CPU.glu(gate, up, gelu))


def test_scale_rows(backend):
    rng = np.random.default_rng(17)
    x, s = rng.standard_normal((5, 300)).astype(np.float32), rng.standard_normal((5, 1)).astype(np.float32)
    assert_close(host(backend, backend.scale_rows(backend.xp.asarray(x), backend.xp.asarray(s))), CPU.scale_rows(x, s))


def test_swiglu_oai(backend):
    rng = np.random.default_rng(16)
    gate, up = (rng.standard_normal((3, 300)).astype(np.float32) * 6 for _ in range(2))   # past the limit
    got = backend.swiglu_oai(backend.xp.asarray(gate), backend.xp.asarray(up), 1.702, 7.0)
    assert_close(host(backend, got), CPU.swiglu_oai(gate, up, 1.702, 7.0))


@pytest.mark.parametrize("op", ["add", "mul"])
@pytest.mark.parametrize("b_shape", [(7, 300), (300,)])
def test_add_and_mul_repeat_b_along_a(backend, op, b_shape):
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((7, 300)).astype(np.float32), rng.standard_normal(b_shape).astype(np.float32)
    got = getattr(backend, op)(backend.xp.asarray(a), backend.xp.asarray(b))
    np.testing.assert_array_equal(host(backend, got), getattr(CPU, op)(a, b))


def test_mul_takes_strided_views(backend):
    rng = np.random.default_rng(8)
    qg = rng.standard_normal((3, 4, 16)).astype(np.float32)
    a = rng.standard_normal((3, 4, 8)).astype(np.float32)
    got = backend.mul(backend.xp.asarray(a), backend.xp.asarray(qg)[..., 8:])
    np.testing.assert_array_equal(host(backend, got), a * qg[..., 8:])


def test_scale_and_sigmoid(backend):
    x = np.random.default_rng(9).standard_normal((3, 333)).astype(np.float32) * 10
    np.testing.assert_array_equal(host(backend, backend.scale(backend.xp.asarray(x), 0.3)), CPU.scale(x, 0.3))
    assert_close(host(backend, backend.sigmoid(backend.xp.asarray(x))), CPU.sigmoid(x), rtol=1e-6)


def test_softcap(backend):
    x = np.random.default_rng(14).standard_normal((3, 333)).astype(np.float32) * 10
    got = host(backend, backend.softcap(backend.xp.asarray(x), 3.0))
    assert_close(got, CPU.softcap(x, 3.0), rtol=1e-6)
    assert np.abs(got).max() <= 3.0


@pytest.mark.parametrize("op", ["silu", "softplus"])
def test_silu_and_softplus(backend, op):
    x = np.random.default_rng(10).standard_normal((3, 333)).astype(np.float32) * 10
    x[0, :4] = [-100, 100, 0, -0.0]  # exp overflows on one side or the other
    got = host(backend, getattr(backend, op)(backend.xp.asarray(x)))
    with np.errstate(over="ignore"):
        assert_close(got, getattr(CPU, op)(x), rtol=1e-6)


# ------------------------------------------------------------------ batches
def runs_batch(runs) -> tuple[np.ndarray, np.ndarray]:
    """Slots and positions (int32) of a batch of runs (slot, first position, tokens)."""
    slots = np.concatenate([np.full(n, slot, np.int32) for slot, _, n in runs])
    pos = np.concatenate([np.arange(p, p + n, dtype=np.int32) for _, p, n in runs])
    return slots, pos


def layouts(backend, runs):
    """The batch of runs laid out by the NumPy backend and by this one."""
    slots, pos = runs_batch(runs)
    return CPU.batch_layout(slots, pos), backend.batch_layout(slots, pos)


# ------------------------------------------------------------------ recurrence (Gated DeltaNet)
# Runs (slot, tokens) of the slots 0..3 of a 5-slot state: decode rows alone (one launch), and runs
# of several lengths mixed with rows (a launch per group of equal runs). Slot 4 is never touched.
CONV_BATCHES = {"decode rows": [(2, 1), (0, 1), (3, 1)], "runs and rows": [(1, 7), (0, 1), (3, 1), (2, 2)]}
DELTA_BATCHES = {"decode rows": [(2, 1), (0, 1), (3, 1)], "runs and rows": [(1, 70), (0, 1), (3, 1), (2, 5)]}


@pytest.mark.parametrize("runs", CONV_BATCHES.values(), ids=CONV_BATCHES)
def test_ssm_conv_advances_each_slots_state(backend, runs):
    rng = np.random.default_rng(11)
    channels, kernel = 70, 4
    cpu_layout, layout = layouts(backend, [(slot, 3, n) for slot, n in runs])
    raw = rng.standard_normal((channels, kernel)).astype(np.float32).view(np.uint8)
    state = rng.standard_normal((5, kernel - 1, channels)).astype(np.float32)
    x = rng.standard_normal((sum(n for _, n in runs), channels)).astype(np.float32)
    state_dev = backend.xp.array(state)  # a copy, also under the emulator
    got = backend.ssm_conv(backend.xp.asarray(x), state_dev, backend.matrix(raw, QType.F32, matmul=True), layout)
    want = CPU.ssm_conv(x, state, CPU.matrix(raw, QType.F32, matmul=True), cpu_layout)
    assert_close(host(backend, got), want, rtol=1e-6)
    np.testing.assert_array_equal(host(backend, state_dev), state)


@pytest.mark.parametrize("runs", DELTA_BATCHES.values(), ids=DELTA_BATCHES)
def test_delta_net_advances_each_slots_state(backend, runs):
    rng = np.random.default_rng(12)
    n_k, n_v, dk, dv = 2, 4, 48, 24
    cpu_layout, layout = layouts(backend, [(slot, 3, n) for slot, n in runs])
    n_tok = sum(n for _, n in runs)
    q, k = (rng.standard_normal((n_tok, n_k, dk)).astype(np.float32) / 7 for _ in range(2))
    v = rng.standard_normal((n_tok, n_v, dv)).astype(np.float32)
    g = -rng.uniform(0, 0.5, (n_tok, n_v)).astype(np.float32)
    beta = rng.uniform(0, 1, (n_tok, n_v)).astype(np.float32)
    state = rng.standard_normal((5, n_v, dv, dk)).astype(np.float32)
    state_dev = backend.xp.array(state)  # a copy, also under the emulator
    got = backend.delta_net(*(backend.xp.asarray(a) for a in (q, k, v, g, beta)), state_dev, layout)
    want = CPU.delta_net(q, k, v, g, beta, state, cpu_layout)
    assert_close(host(backend, got), want, rtol=1e-5)
    assert_close(host(backend, state_dev), state, rtol=1e-5)


# ------------------------------------------------------------------ attention
def test_softmax_lengths(backend):
    rng = np.random.default_rng(10)
    x = rng.standard_normal((6, 1100)).astype(np.float32) * 3
    lengths = np.array([1, 5, 1100, 0, 700, 64], np.int32)
    for window, softcap in ((0, 0.0), (50, 0.0), (50, 1.5)):
        got = host(backend, cuda_ops.softmax_lengths(backend.kernels, backend.xp.asarray(x), backend.xp.asarray(lengths),
                                                     window, 0.5, softcap))
        want = np.zeros_like(x)
        for r, n in enumerate(lengths):
            lo = max(0, n - window) if window else 0
            s = x[r, lo:n] * 0.5
            s = softcap * np.tanh(s / softcap) if softcap else s
            e = np.exp(s - s.max(initial=-np.inf))
            want[r, lo:n] = e / e.sum()
        assert_close(got, want, rtol=1e-6)


CACHE_PAIRS = [("f32", "f32"), ("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "f16"), ("f16", "f32"), ("q4_0", "q4_0"),
               ("iq4_nl", "iq4_nl"), ("q4_0", "f16"), ("f16", "iq4_nl")]
_CACHE_QTYPE = {"f32": QType.F32, "f16": QType.F16, "q8_0": QType.Q8_0, "q4_0": QType.Q4_0, "iq4_nl": QType.IQ4_NL}


# One rounding step of each cache type, relative to the data's largest magnitude: a value an ulp of
# float arithmetic apart from another may be stored a step away from it. iq4_nl's widest gap
# between levels is 24 of 127.
ROUNDING_STEP = {"f32": 2e-6, "f16": 1e-3, "q8_0": 1 / 127, "q4_0": 1 / 8, "iq4_nl": 24 / 127}


def _decoded(b, cache, name: str, cache_type: str) -> np.ndarray:
    """A backend's stored keys or values as float32 rows, decoded by gguf."""
    if b is CPU and getattr(cache, name).dtype != np.uint8:   # the NumPy backend's float rows (q8_0 rounded)
        return getattr(cache, name).astype(np.float32).reshape(-1, getattr(cache, name).shape[-1])
    stored = host(b, getattr(cache, name))
    return reference(stored.reshape(-1, stored.shape[-1]), _CACHE_QTYPE[cache_type])


def _check_cached(backend, caches, type_k, type_v, shape_k, shape_v):
    """Both backends' caches hold the same values: the GPU's rows decoded by gguf, against the
    CPU's float rows or its packed 4-bit rows decoded alike (bytes equal but for the rare f16 scale
    that an ulp of float rounding order moves)."""
    for name, cache_type, shape in (("k", type_k, shape_k), ("v", type_v, shape_v)):
        stored, cpu = host(backend, getattr(caches[1], name)), getattr(caches[0], name)
        decoded = reference(stored.reshape(-1, stored.shape[-1]), _CACHE_QTYPE[cache_type]).reshape(shape)
        if cpu.dtype == np.uint8:
            assert np.mean(stored != cpu) < 1e-3
            assert_close(decoded, reference(cpu.reshape(-1, cpu.shape[-1]), _CACHE_QTYPE[cache_type]).reshape(shape),
                         rtol=2e-3)
        else:
            np.testing.assert_array_equal(decoded, cpu.astype(np.float32))
# What slots 0..3 of a 64-position cache hold before the batch: positions [0, n). Slot 4 stays empty.
HISTORY = {0: 29, 1: 0, 2: 5, 3: 0}
# Runs (slot, tokens) after that history: decode rows (one fused launch), short runs (one fused
# launch), and long runs between rows (GEMM per long run, fused launches for the rows between).
ATTENTION_BATCHES = {"decode rows": [(2, 1), (0, 1), (3, 1)],
                     "short runs": [(0, 5), (3, 1), (2, cuda_attention.FUSED_MAX_TOKENS)],
                     "long runs": [(3, 1), (0, cuda_attention.FUSED_MAX_TOKENS + 4), (2, 1),
                                   (1, cuda_attention.FUSED_MAX_TOKENS + 2)]}


def _store(backend, caches, rng, runs, n_kv, dk, dv):
    """Random keys and values for runs (slot, first position, tokens), stored in both caches."""
    cpu_layout, layout = layouts(backend, runs)
    n_tok = len(cpu_layout.pos)
    k = rng.standard_normal((n_tok, n_kv, dk)).astype(np.float32)
    v = rng.standard_normal((n_tok, n_kv, dv)).astype(np.float32)
    CPU.kv_store(caches[0], k, v, cpu_layout)
    backend.kv_store(caches[1], backend.xp.asarray(k), backend.xp.asarray(v), layout)
    return cpu_layout, layout


def paged_caches(backend, tables: np.ndarray, n_blocks: int, block: int, n_kv: int, dk: int, dv: int, type_k: str,
                 type_v: str) -> list:
    """A paged cache of n_blocks blocks on the NumPy backend and on this one, slots reaching them
    through the same block tables (n_slots, blocks per slot)."""
    caches = []
    for b in (CPU, backend):
        device_tables = b.block_tables(*tables.shape)
        for slot in range(tables.shape[0]):
            b.write_block_table(device_tables, slot, tables[slot].tolist())
        caches.append(b.paged_kv_cache(device_tables, n_blocks, block, n_kv, dk, dv, type_k, type_v))
    return caches


@pytest.mark.parametrize("type_k, type_v", CACHE_PAIRS)
@pytest.mark.parametrize("runs", ATTENTION_BATCHES.values(), ids=ATTENTION_BATCHES)
@pytest.mark.parametrize("window", [0, 7])
def test_kv_store_and_attention(backend, type_k, type_v, runs, window):
    rng = np.random.default_rng(len(runs) + window)
    n_slots, n_ctx, n_kv, n_head, dk, dv = 5, 64, 2, 6, 64, 32
    caches = [b.kv_cache(n_slots, n_ctx, n_kv, dk, dv, type_k, type_v) for b in (CPU, backend)]
    _store(backend, caches, rng, [(slot, 0, n) for slot, n in HISTORY.items() if n], n_kv, dk, dv)
    cpu_layout, layout = _store(backend, caches, rng, [(slot, HISTORY[slot], n) for slot, n in runs], n_kv, dk, dv)
    _check_cached(backend, caches, type_k, type_v, (n_slots, n_kv, n_ctx, dk), (n_slots, n_kv, n_ctx, dv))
    q = rng.standard_normal((len(cpu_layout.pos), n_head, dk)).astype(np.float32)
    got = backend.attention(backend.xp.asarray(q), caches[1], layout, 0.125, window)
    assert_close(host(backend, got), CPU.attention(q, caches[0], cpu_layout, 0.125, window), rtol=2e-5)


@pytest.mark.parametrize("dv", [64, 32, 48])
@pytest.mark.parametrize("runs", ATTENTION_BATCHES.values(), ids=ATTENTION_BATCHES)
def test_attention_writes_the_output_projection_s_8_bit_input(backend, runs, dv, monkeypatch):
    """With int8 products, an attention the fused kernel takes whole writes its output (bit for bit
    the float backend's) and that output's quantize_q8 too, seen as (T, H * dv): the output
    projection then takes it with no quantize_q8 launch and gives bit for bit what it gives with
    the output quantized apart. Batches with a long (GEMM) run, or heads of dv not in runs of 32,
    leave the quantizing to the product."""
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    monkeypatch.setattr(cuda_matmul, "INT8_MIN_BYTES", 0)
    int8 = CudaBackend(backend.kernels, "int8")
    rng = np.random.default_rng(dv + len(runs))
    n_slots, n_ctx, n_kv, n_head, dk = 5, 64, 2, 6, 64
    caches = [b.kv_cache(n_slots, n_ctx, n_kv, dk, dv, "f16", "f16") for b in (CPU, int8)]
    _store(int8, caches, rng, [(slot, 0, n) for slot, n in HISTORY.items() if n], n_kv, dk, dv)
    _, layout = _store(int8, caches, rng, [(slot, HISTORY[slot], n) for slot, n in runs], n_kv, dk, dv)
    q = int8.xp.asarray(rng.standard_normal((len(layout.pos), n_head, dk)).astype(np.float32))
    o = int8.attention(q, caches[1], layout, 0.125, 0)
    np.testing.assert_array_equal(host(int8, o), host(backend, backend.attention(q, caches[1], layout, 0.125, 0)))
    x = o.reshape(o.shape[0], n_head * dv)
    wm = int8.matrix(random_weights(rng, QType.Q8_0, 8, n_head * dv), QType.Q8_0, matmul=True)
    launched = len(getattr(int8.kernels, "launched", ()))
    got = int8.matmul(x, wm)
    written = cuda_attention.fused_only(layout) and dv % cuda_matmul.Q8_RUN == 0
    if hasattr(int8.kernels, "launched"):
        # (many tokens take 8 bits on int8 tensor cores, else floats in an f16 GEMM)
        quantized_apart = not written and (x.shape[0] < cuda_matmul.GEMM_MIN_TOKENS or int8.kernels.int8_mma)
        assert ("quantize_q8" in int8.kernels.launched[launched:]) == quantized_apart
    if written:
        for fused, apart in zip(int8._x8[1], cuda_matmul.quantize_q8(backend.kernels, x)):
            np.testing.assert_array_equal(host(int8, fused), host(int8, apart))
    want = int8.matmul(int8.xp.asarray(host(int8, x)), wm)   # another array: quantized on the way in
    np.testing.assert_array_equal(host(int8, got), host(int8, want))


@pytest.mark.parametrize("type_k, type_v", [("f32", "f32"), ("f16", "f16"), ("q8_0", "f16"), ("q4_0", "iq4_nl")])
@pytest.mark.parametrize("runs", ATTENTION_BATCHES.values(), ids=ATTENTION_BATCHES)
@pytest.mark.parametrize("window", [0, 7])
def test_paged_kv_store_and_attention(backend, type_k, type_v, runs, window):
    """The same batches through block tables: each slot's 8-position blocks scattered over the pool,
    slots 0 and 2 sharing their first block (the same keys in both), and the scratch block last."""
    rng = np.random.default_rng(len(runs) + window)
    n_slots, n_ctx, n_kv, n_head, dk, dv, block = 5, 64, 2, 6, 64, 32, 8
    n_blocks = n_slots * n_ctx // block
    tables = rng.permutation(n_blocks).astype(np.int32).reshape(n_slots, n_ctx // block)
    tables[2, 0] = tables[0, 0]
    caches = paged_caches(backend, tables, n_blocks + 1, block, n_kv, dk, dv, type_k, type_v)
    history = [(0, 0, HISTORY[0]), (2, block, HISTORY[2])]   # slot 2's first block: slot 0's keys
    _store(backend, caches, rng, history, n_kv, dk, dv)
    cpu_layout, layout = _store(backend, caches, rng, [(slot, HISTORY[slot] + (block if slot == 2 else 0), n)
                                                       for slot, n in runs], n_kv, dk, dv)
    _check_cached(backend, caches, type_k, type_v, (n_blocks + 1, n_kv, block, dk), (n_blocks + 1, n_kv, block, dv))
    q = rng.standard_normal((len(cpu_layout.pos), n_head, dk)).astype(np.float32)
    got = backend.attention(backend.xp.asarray(q), caches[1], layout, 0.125, window)
    assert_close(host(backend, got), CPU.attention(q, caches[0], cpu_layout, 0.125, window), rtol=2e-5)


@pytest.mark.parametrize("runs", ATTENTION_BATCHES.values(), ids=ATTENTION_BATCHES)
def test_attention_soft_caps_scores(backend, runs):
    """Gemma 2's cap, on both of the CUDA paths (fused, GEMM + softmax_lengths); a cap of 1 bounds
    these scores (about unit size) hard enough to change every output."""
    rng = np.random.default_rng(13)
    n_slots, n_ctx, n_kv, n_head, dk, dv = 5, 64, 2, 4, 32, 32
    caches = [b.kv_cache(n_slots, n_ctx, n_kv, dk, dv, "f32", "f16") for b in (CPU, backend)]
    _store(backend, caches, rng, [(slot, 0, n) for slot, n in HISTORY.items() if n], n_kv, dk, dv)
    cpu_layout, layout = _store(backend, caches, rng, [(slot, HISTORY[slot], n) for slot, n in runs], n_kv, dk, dv)
    q = rng.standard_normal((len(cpu_layout.pos), n_head, dk)).astype(np.float32)
    want = CPU.attention(q, caches[0], cpu_layout, 0.25, 7, 1.0)
    assert_close(host(backend, backend.attention(backend.xp.asarray(q), caches[1], layout, 0.25, 7, 1.0)), want, rtol=2e-5)
    assert relative_error(CPU.attention(q, caches[0], cpu_layout, 0.25, 7), want) > 1e-2


@pytest.mark.parametrize("runs", ATTENTION_BATCHES.values(), ids=ATTENTION_BATCHES)
def test_attention_sinks(backend, runs):
    """gpt-oss's sinks, a logit per head in each softmax's denominator, on both CUDA paths (fused,
    GEMM + softmax_lengths), with and without a window."""
    rng = np.random.default_rng(14)
    n_slots, n_ctx, n_kv, n_head, dk, dv = 5, 64, 2, 4, 32, 32
    caches = [b.kv_cache(n_slots, n_ctx, n_kv, dk, dv, "f32", "f32") for b in (CPU, backend)]
    _store(backend, caches, rng, [(slot, 0, n) for slot, n in HISTORY.items() if n], n_kv, dk, dv)
    cpu_layout, layout = _store(backend, caches, rng, [(slot, HISTORY[slot], n) for slot, n in runs], n_kv, dk, dv)
    q = rng.standard_normal((len(cpu_layout.pos), n_head, dk)).astype(np.float32)
    sinks = np.array([3.0, -1.0, 0.5, 2.0], np.float32)
    for window in (0, 7):
        want = CPU.attention(q, caches[0], cpu_layout, 0.25, window, 0.0, sinks)
        got = backend.attention(backend.xp.asarray(q), caches[1], layout, 0.25, window, 0.0, backend.xp.asarray(sinks))
        assert_close(host(backend, got), want, rtol=2e-5)
        assert relative_error(CPU.attention(q, caches[0], cpu_layout, 0.25, window), want) > 1e-2



def _count_f16_gemms(backend, monkeypatch) -> list:
    calls, gemm = [], backend.kernels.gemm_f16
    monkeypatch.setattr(backend.kernels, "gemm_f16", lambda *args: (calls.append(1), gemm(*args)))
    return calls


@pytest.mark.parametrize("type_k, type_v", [("f32", "f32"), ("q8_0", "f16"), ("f16", "f32")])
@pytest.mark.parametrize("window", [0, 7])
@pytest.mark.parametrize("paged", [False, True], ids=["slots", "paged"])
def test_prompt_chunks_multiply_only_the_keys_they_see(backend, type_k, type_v, window, paged, monkeypatch):
    """Chunks of 8 queries of the long runs, each multiplying only the keys from its first query's
    window to its last query: float32 GEMMs still, within the NumPy backend's rounding."""
    monkeypatch.setattr(cuda_attention, "QUERY_CHUNK", 8)
    f16 = _count_f16_gemms(backend, monkeypatch)
    rng = np.random.default_rng(window + 3)
    n_slots, n_ctx, n_kv, n_head, dk, dv, block = 5, 64, 2, 6, 64, 32, 8
    if paged:
        tables = rng.permutation(n_slots * n_ctx // block).astype(np.int32).reshape(n_slots, n_ctx // block)
        caches = paged_caches(backend, tables, n_slots * n_ctx // block, block, n_kv, dk, dv, type_k, type_v)
    else:
        caches = [b.kv_cache(n_slots, n_ctx, n_kv, dk, dv, type_k, type_v) for b in (CPU, backend)]
    runs = ATTENTION_BATCHES["long runs"]
    _store(backend, caches, rng, [(slot, 0, n) for slot, n in HISTORY.items() if n], n_kv, dk, dv)
    cpu_layout, layout = _store(backend, caches, rng, [(slot, HISTORY[slot], n) for slot, n in runs], n_kv, dk, dv)
    q = rng.standard_normal((len(cpu_layout.pos), n_head, dk)).astype(np.float32)
    got = backend.attention(backend.xp.asarray(q), caches[1], layout, 0.125, window)
    assert_close(host(backend, got), CPU.attention(q, caches[0], cpu_layout, 0.125, window), rtol=2e-5)
    assert not f16


# Prompt runs in f16 (cuda_attention._products_f16): with u = 2^-11 (f16's rounding), a score
# c q.k from f16 queries (scaled by c first) and f16 keys, summed in float32 over dk products,
# is off by at most (2u + u^2 + 1.01 dk 2^-24) sum_i |c q_i k_i| =: d_j; a soft cap does not
# widen that (its slope is at most 1). Scores each off by at most d = max_j d_j move every
# probability by a factor within exp(+-2d) (numerator and denominator; a sink is exact). Then the
# probabilities and values are rounded to f16 (a factor of (1 + u) each) and summed in float32
# over n keys (n 2^-24): |out - exact| <= (exp(2d) (1 + u)^2 (1 + 2^-20) - 1 + 1.01 n 2^-24)
# max_j |v_j|, the 2^-20 for float32's softmax, and as much again for the NumPy backend's error.
def _f16_attention_bound(q, keys, values, scale: float, n_keys: int) -> np.ndarray:
    """The bound above for queries q (T, H, dk) of one slot over its decoded keys (n_kv, n, dk)
    and values (n_kv, n, dv), every cached key counted (a superset of those each query sees)."""
    u, ulp32 = 2.0 ** -11, 2.0 ** -24
    n_tok, n_head, dk = q.shape
    group = n_head // keys.shape[0]
    bounds = np.empty((n_tok, n_head))
    for h in range(n_head):
        kv = h // group
        dots = np.abs(q[:, h].astype(np.float64) * scale) @ np.abs(keys[kv].astype(np.float64)).T   # (T, n)
        d = (2 * u + u * u + 1.01 * dk * ulp32) * dots.max(axis=1)
        factor = np.exp(2 * d) * (1 + u) ** 2 * (1 + 2.0 ** -20) - 1 + 1.01 * n_keys * ulp32
        bounds[:, h] = (factor + 2.0 ** -20) * np.abs(values[kv]).max()
    return bounds


@pytest.mark.parametrize("type_k, type_v", [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "iq4_nl")])
@pytest.mark.parametrize("window, softcap, sinks", [(0, 0.0, False), (7, 0.0, False), (0, 1.0, True)],
                         ids=["causal", "window", "softcap-sinks"])
@pytest.mark.parametrize("n_head", [6, 2], ids=["gqa", "mha"])
def test_long_prompts_multiply_in_f16_within_the_float_bound(backend, type_k, type_v, window, softcap, sinks, n_head,
                                                              monkeypatch):
    """Runs of F16_MIN_TOKENS or more (here 17) from caches not of f32 rows take f16 tensor-core
    products; each output within _f16_attention_bound of the NumPy backend's float32 one. With
    one head a KV group (mha), a chunk's queries are a strided view of q, and stay one for f16."""
    monkeypatch.setattr(cuda_attention, "QUERY_CHUNK", 8)
    monkeypatch.setattr(cuda_attention, "F16_MIN_TOKENS", cuda_attention.FUSED_MAX_TOKENS + 1)
    f16 = _count_f16_gemms(backend, monkeypatch)
    rng = np.random.default_rng(window + len(type_k))
    n_slots, n_ctx, n_kv, dk, dv = 5, 64, 2, 64, 32
    caches = [b.kv_cache(n_slots, n_ctx, n_kv, dk, dv, type_k, type_v) for b in (CPU, backend)]
    runs = ATTENTION_BATCHES["long runs"]
    _store(backend, caches, rng, [(slot, 0, n) for slot, n in HISTORY.items() if n], n_kv, dk, dv)
    cpu_layout, layout = _store(backend, caches, rng, [(slot, HISTORY[slot], n) for slot, n in runs], n_kv, dk, dv)
    q = rng.standard_normal((len(cpu_layout.pos), n_head, dk)).astype(np.float32)
    sink = np.array([3.0, -1.0, 0.5, 2.0, 0.0, 1.0][:n_head], np.float32) if sinks else None
    want = CPU.attention(q, caches[0], cpu_layout, 0.125, window, softcap, sink)
    got = host(backend, backend.attention(backend.xp.asarray(q), caches[1], layout, 0.125, window, softcap,
                                          None if sink is None else backend.xp.asarray(sink)))
    # Two long runs, each 3 chunks of 8 queries, 2 products of n_kv heads a chunk.
    assert len(f16) == 2 * 3 * 2 * n_kv
    keys = _decoded(CPU, caches[0], "k", type_k).reshape(n_slots, n_kv, n_ctx, dk)
    values = _decoded(CPU, caches[0], "v", type_v).reshape(n_slots, n_kv, n_ctx, dv)
    errors = np.abs(got - want).max(axis=2)
    for slot, t0, t1 in cpu_layout.runs:
        bound = _f16_attention_bound(q[t0:t1], keys[slot], values[slot], 0.125, n_ctx)
        assert (errors[t0:t1] <= bound).all(), f"slot {slot}: {errors[t0:t1].max()} past {bound.min()}"
    assert errors.max() > 2e-5 * np.abs(want).max()   # the f16 rounding shows: not the float32 path

# Flash attention (attention_flash.cu), here from 17 queries on: (type_k, type_v, head size,
# n_head, n_kv, window, softcap, sinks, paged), each head size, GQA groups of 1, 3 (a block's 64
# rows not filled: 21 queries of 3 heads) and 8, a window within a tile (7) and one across
# tiles (40), soft cap and sinks, through scattered 8-position blocks and unpaged.
FLASH_CASES = {"f16-d64-gqa3": ("f16", "f16", 64, 6, 2, 0, 0.0, False, False),
               "q8_0-d128-gqa8-window40-paged": ("q8_0", "q8_0", 128, 16, 2, 40, 0.0, False, True),
               "q8_0-f16-d256-mha-softcap-sinks-paged": ("q8_0", "f16", 256, 2, 2, 0, 1.0, True, True),
               "f16-q8_0-d64-mha-window7": ("f16", "q8_0", 64, 4, 4, 7, 0.0, False, False)}
# Slot 0: 29 positions, then a run of 70 (two blocks of 21 queries, or one of 64 and one of 6;
# tiles from key 0 to 98); slot 1: a decode row; slot 2: 5 positions, then a run of 40.
FLASH_HISTORY = {0: 29, 2: 5}
FLASH_BATCH = [(0, 70), (1, 1), (2, 40)]


def _flash_setup(backend, case, monkeypatch):
    type_k, type_v, d, n_head, n_kv, window, softcap, sinks, paged = case
    monkeypatch.setattr(cuda_attention, "FLASH_MIN_TOKENS", cuda_attention.FUSED_MAX_TOKENS + 1)
    rng = np.random.default_rng(d + n_head + window)
    n_slots, n_ctx, block = 3, 112, 8
    if paged:
        n_blocks = n_slots * n_ctx // block
        tables = rng.permutation(n_blocks).astype(np.int32).reshape(n_slots, n_ctx // block)
        caches = paged_caches(backend, tables, n_blocks, block, n_kv, d, d, type_k, type_v)
    else:
        caches = [b.kv_cache(n_slots, n_ctx, n_kv, d, d, type_k, type_v) for b in (CPU, backend)]
    _store(backend, caches, rng, [(slot, 0, n) for slot, n in FLASH_HISTORY.items()], n_kv, d, d)
    cpu_layout, layout = _store(backend, caches, rng, [(slot, FLASH_HISTORY.get(slot, 0), n)
                                                       for slot, n in FLASH_BATCH], n_kv, d, d)
    q = rng.standard_normal((len(cpu_layout.pos), n_head, d)).astype(np.float32)
    sink = rng.standard_normal(n_head).astype(np.float32) * 2 if sinks else None
    return caches, cpu_layout, layout, q, sink, (window, softcap)


def _flash_attention(backend, caches, layout, q, sink, window, softcap):
    return host(backend, backend.attention(backend.xp.asarray(q), caches[1], layout, 0.125, window, softcap,
                                           None if sink is None else backend.xp.asarray(sink)))


@pytest.mark.parametrize("case", FLASH_CASES.values(), ids=FLASH_CASES)
def test_flash_attention_within_the_f16_bound(backend, case, monkeypatch):
    """Each long run in one attention_flash launch; each output within _f16_attention_bound of the
    NumPy backend's float32 one. The flash kernel rounds as the f16 GEMMs do, and besides rounds
    each tile's rescaling of the sums (n / 32 roundings of 2^-24 at most) and probabilities below
    f16's normal range (2^-25 each, absolute, of max|v|): the bound's n 2^-24 for n keys, counted
    twice, covers both. A fragment in another lane's register moves outputs by their own size."""
    caches, cpu_layout, layout, q, sink, (window, softcap) = _flash_setup(backend, case, monkeypatch)
    launched = len(getattr(backend.kernels, "launched", ()))
    got = _flash_attention(backend, caches, layout, q, sink, window, softcap)
    if hasattr(backend.kernels, "launched"):
        name = f"attention_flash_{case[0]}_{case[1]}_d{case[2]}"
        assert backend.kernels.launched[launched:].count(name) == 2
    want = CPU.attention(q, caches[0], cpu_layout, 0.125, window, softcap, sink)
    n_kv, d = case[4], case[2]
    # Every cached row counted: a superset of the keys each query sees, wherever its blocks are.
    keys = _decoded(CPU, caches[0], "k", case[0]).reshape(-1, n_kv, d).transpose(1, 0, 2)
    values = _decoded(CPU, caches[0], "v", case[1]).reshape(-1, n_kv, d).transpose(1, 0, 2)
    errors = np.abs(got - want).max(axis=2)
    for slot, t0, t1 in cpu_layout.runs:
        bound = _f16_attention_bound(q[t0:t1], keys, values, 0.125, 2 * keys.shape[1])
        assert (errors[t0:t1] <= bound).all(), f"slot {slot}: {errors[t0:t1].max()} past {bound.min()}"
    assert errors.max() > 2e-5 * np.abs(want).max()   # the f16 rounding shows: not the float32 path


@pytest.mark.parametrize("case", FLASH_CASES.values(), ids=FLASH_CASES)
def test_flash_attention_gives_the_same_bits_under_any_cut(backend, case, monkeypatch):
    """A query's output from attention_flash is the same bits whichever queries share its block:
    slot 0's run cut in two runs of 17 or more (the second in a batch beside the others), and
    each run alone."""
    caches, cpu_layout, layout, q, sink, (window, softcap) = _flash_setup(backend, case, monkeypatch)
    whole = _flash_attention(backend, caches, layout, q, sink, window, softcap)
    first = 23
    _, head = layouts(backend, [(0, FLASH_HISTORY[0], first)])
    _, rest = layouts(backend, [(0, FLASH_HISTORY[0] + first, 70 - first), (1, 0, 1), (2, FLASH_HISTORY[2], 40)])
    cut = np.concatenate([_flash_attention(backend, caches, head, q[:first], sink, window, softcap),
                          _flash_attention(backend, caches, rest, q[first:], sink, window, softcap)])
    np.testing.assert_array_equal(cut, whole)
    _, alone = layouts(backend, [(2, FLASH_HISTORY[2], 40)])
    np.testing.assert_array_equal(_flash_attention(backend, caches, alone, q[71:], sink, window, softcap), whole[71:])


# Decode at depth, where a fused launch splits each query's keys into chunks (attention_split.cu,
# attention_combine.cu): slots holding 1000-3000 keys in a cache of 3072 positions a slot, so 12
# chunks of 256 keys, the deepest query's last one partial, a shallower one's leaving chunks empty;
# a window of 700 starts mid-chunk. A run of 3 tokens joins the decode rows' launch.
DEEP_HISTORY = {0: 2997, 1: 1000, 2: 1733}
DEEP_BATCH = [(2, 1), (0, 3), (1, 1)]
# The split sums the same terms as the NumPy backend in another order: a lane's chain of at most
# 64 keys of its chunk, then 4 warps and 12 chunks, where the NumPy backend sums 64-key chunks and
# then the chunks in order. Each float32 addition errs by at most u = 2^-24 of its running sum, so
# a chain of n additions by about sqrt(n) u for terms of random sign (n u at worst): ~100 additions
# on the longer chain, ~1e-6 of the largest output, which the scores' dot products (64 terms) do
# not outgrow. The bound is 5e-6 of max|out|; measured under the emulator: at most 1.4e-6. A chunk
# lost or counted twice moves outputs by several per cent.
DEEP_RTOL = 5e-6


def _deep_caches(backend, rng, caches, n_kv, dk, dv, runs=DEEP_BATCH):
    _store(backend, caches, rng, [(slot, 0, n) for slot, n in DEEP_HISTORY.items()], n_kv, dk, dv)
    return _store(backend, caches, rng, [(slot, DEEP_HISTORY[slot], n) for slot, n in runs], n_kv, dk, dv)


def _launched_split(backend, before: int) -> bool:
    launched = getattr(backend.kernels, "launched", None)
    return launched is None or "attention_combine" in launched[before:]


@pytest.mark.parametrize("type_k, type_v", CACHE_PAIRS)
@pytest.mark.parametrize("window", [0, 700])
def test_attention_split_along_the_keys_at_depth(backend, type_k, type_v, window):
    rng = np.random.default_rng(window + len(type_k))
    n_slots, n_ctx, n_kv, n_head, dk, dv = 3, 3072, 2, 8, 64, 32
    caches = [b.kv_cache(n_slots, n_ctx, n_kv, dk, dv, type_k, type_v) for b in (CPU, backend)]
    cpu_layout, layout = _deep_caches(backend, rng, caches, n_kv, dk, dv)
    n_tok = len(cpu_layout.pos)
    assert cuda_attention.split_chunks(caches[1], n_tok, n_head) == n_ctx // cuda_attention.SPLIT_MIN_KEYS
    q = rng.standard_normal((n_tok, n_head, dk)).astype(np.float32)
    before = len(getattr(backend.kernels, "launched", ()))
    got = backend.attention(backend.xp.asarray(q), caches[1], layout, 0.125, window)
    assert _launched_split(backend, before)
    assert_close(host(backend, got), CPU.attention(q, caches[0], cpu_layout, 0.125, window), rtol=DEEP_RTOL)


@pytest.mark.parametrize("window", [0, 700])
def test_attention_split_along_the_keys_paged_with_sinks_and_softcap(backend, window):
    """The split through block tables of 16-position blocks, every head with its sink and its scores
    capped (both changing every output), GQA groups of 8 heads (SPLIT_MAX_GROUP)."""
    rng = np.random.default_rng(15 + window)
    n_slots, n_ctx, n_kv, n_head, dk, dv, block = 3, 3072, 1, 8, 32, 64, 16
    n_blocks = n_slots * n_ctx // block
    tables = rng.permutation(n_blocks).astype(np.int32).reshape(n_slots, n_ctx // block)
    caches = paged_caches(backend, tables, n_blocks + 1, block, n_kv, dk, dv, "q8_0", "f16")
    cpu_layout, layout = _deep_caches(backend, rng, caches, n_kv, dk, dv)
    q = rng.standard_normal((len(cpu_layout.pos), n_head, dk)).astype(np.float32) * 2
    sinks = rng.standard_normal(n_head).astype(np.float32) * 3
    want = CPU.attention(q, caches[0], cpu_layout, 0.25, window, 1.5, sinks)
    before = len(getattr(backend.kernels, "launched", ()))
    got = backend.attention(backend.xp.asarray(q), caches[1], layout, 0.25, window, 1.5, backend.xp.asarray(sinks))
    assert _launched_split(backend, before)
    assert_close(host(backend, got), want, rtol=DEEP_RTOL)
    assert relative_error(CPU.attention(q, caches[0], cpu_layout, 0.25, window, 0.0, sinks), want) > 1e-2
    assert relative_error(CPU.attention(q, caches[0], cpu_layout, 0.25, window, 1.5), want) > 1e-2


def test_attention_split_along_the_keys_writes_the_8_bit_output(backend, monkeypatch):
    """With int8 products the combine writes the output's quantize_q8 too, bit for bit the one the
    product would make, and the output bit for bit the float backend's."""
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    monkeypatch.setattr(cuda_matmul, "INT8_MIN_BYTES", 0)
    int8 = CudaBackend(backend.kernels, "int8")
    rng = np.random.default_rng(16)
    n_slots, n_ctx, n_kv, n_head, dk, dv = 3, 3072, 2, 4, 64, 64
    caches = [b.kv_cache(n_slots, n_ctx, n_kv, dk, dv, "f16", "q4_0") for b in (CPU, int8)]
    _, layout = _deep_caches(int8, rng, caches, n_kv, dk, dv, [(2, 1), (0, 1)])
    q = int8.xp.asarray(rng.standard_normal((len(layout.pos), n_head, dk)).astype(np.float32))
    before = len(getattr(backend.kernels, "launched", ()))
    o = int8.attention(q, caches[1], layout, 0.125, 0)
    assert _launched_split(backend, before)
    np.testing.assert_array_equal(host(int8, o), host(backend, backend.attention(q, caches[1], layout, 0.125, 0)))
    x = o.reshape(o.shape[0], n_head * dv)
    for fused, apart in zip(int8._x8[1], cuda_matmul.quantize_q8(backend.kernels, x)):
        np.testing.assert_array_equal(host(int8, fused), host(int8, apart))


@pytest.mark.parametrize("type_k, type_v", CACHE_PAIRS)
@pytest.mark.parametrize("neox, dims", [(False, 64), (True, 64), (True, 16)])
def test_rope_kv_store(backend, type_k, type_v, neox, dims):
    """The queries and keys turned and the keys and values stored in one launch (a rope_store
    kernel for every pair of cache types), against the NumPy backend's rope and kv_store: the
    queries within rope's bound, the stored rows within one rounding step of the cache type (keys
    an f32 rounding apart can round to neighbouring steps)."""
    rng = np.random.default_rng(dims + neox)
    n_slots, n_ctx, n_kv, n_head, dk, dv = 5, 64, 2, 6, 64, 32
    cpu_layout, layout = layouts(backend, [(2, 5, 1), (0, 29, 3), (3, 0, 1)])
    n_tok = len(cpu_layout.pos)
    q, k = (rng.standard_normal((n_tok, h, dk)).astype(np.float32) for h in (n_head, n_kv))
    v = rng.standard_normal((n_tok, n_kv, dv)).astype(np.float32)
    factors = rng.uniform(1.0, 8.0, dims // 2).astype(np.float32)
    caches = [b.kv_cache(n_slots, n_ctx, n_kv, dk, dv, type_k, type_v) for b in (CPU, backend)]
    turn = (dims, 1e6, 0.25, neox)
    want = CPU.rope_kv_store(caches[0], q, k, v, cpu_layout, *turn, factors, 1.2)
    xp = backend.xp
    got = backend.rope_kv_store(caches[1], xp.asarray(q), xp.asarray(k), xp.asarray(v), layout, *turn,
                                xp.asarray(factors), 1.2)
    if hasattr(backend.kernels, "launched"):   # one launch for every pair of cache types
        assert backend.kernels.launched[-1] == f"rope_store_{'neox' if neox else 'norm'}_{type_k}_{type_v}"
    assert_close(host(backend, got), want, rtol=2e-6)
    for name, cache_type, d in (("k", type_k, dk), ("v", type_v, dv)):
        got, want = (_decoded(backend if i else CPU, caches[i], name, cache_type) for i in (1, 0))
        assert_close(got.reshape(n_slots, n_kv, n_ctx, d), want.reshape(n_slots, n_kv, n_ctx, d),
                     rtol=ROUNDING_STEP[cache_type])


@pytest.mark.parametrize("type_k, type_v", CACHE_PAIRS)
@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("paged", [False, True])
def test_kv_shift(backend, type_k, type_v, neox, paged):
    """A context shift moves a slot's rows down and turns its keys back, as the NumPy backend does:
    partial rotary with per-pair factors, more positions moved than the shift (several launches),
    the slot's rows before them and another slot's untouched."""
    rng = np.random.default_rng(int(neox) + 2 * int(paged))
    n_slots, n_ctx, n_kv, dk, dv, block = 3, 64, 2, 64, 32, 8
    slot, src, n, delta = 1, 29, 30, 11
    rope = (48, 500.0, 0.5, neox, rng.uniform(1, 4, 24).astype(np.float32))
    caches = []
    for b in (CPU, backend):
        if paged:
            tables = b.block_tables(n_slots, n_ctx // block)
            for s, blocks in enumerate(np.random.default_rng(9).permutation(n_slots * n_ctx // block).reshape(n_slots, -1)):
                b.write_block_table(tables, s, blocks.astype(np.int32).tolist())
            caches.append(b.paged_kv_cache(tables, n_slots * n_ctx // block + 1, block, n_kv, dk, dv, type_k, type_v))
        else:
            caches.append(b.kv_cache(n_slots, n_ctx, n_kv, dk, dv, type_k, type_v))
    _store(backend, caches, rng, [(s, 0, src + n) for s in range(n_slots)], n_kv, dk, dv)
    CPU.kv_shift(caches[0], slot, src, n, delta, rope)
    backend.kv_shift(caches[1], slot, src, n, delta, rope[:4] + (backend.xp.asarray(rope[4]),))
    for name, cache_type, d in (("k", type_k, dk), ("v", type_v, dv)):
        got, want = (_decoded(backend if i else CPU, caches[i], name, cache_type) for i in (1, 0))
        # a quantized type may round a turned value to the next step where the two rotations differ in the last bit
        assert_close(got, want.reshape(got.shape), rtol=max(1e-5, 2 * ROUNDING_STEP[cache_type]))


def test_kv_store_rejects_writes_outside_the_cache(backend):
    cache = backend.kv_cache(2, 8, 1, 32, 32, "f16", "f16")
    k = backend.xp.zeros((1, 1, 32), np.float32)
    for slot, pos in ((2, 0), (0, 8)):
        with pytest.raises(LlogosError, match="outside the KV cache"):
            backend.kv_store(cache, k, k, backend.batch_layout(np.array([slot]), np.array([pos])))


def test_contexts_default_to_an_f16_cache(backend):
    model = Model(GGUFFile(need(FIXTURES / "tiny-llama-f32.gguf")), backend)
    cache = model.new_context(8).cache.kv[0]  # slot 0 and the scratch pad slot
    assert (cache.type_k, cache.type_v) == ("f16", "f16") and cache.k.shape == (2, 2, 8, 2 * model.cfg.head_dim_k)


@pytest.mark.parametrize("b", ["this", "cpu"])
def test_kv_cache_rejects_unusable_types(backend, b):
    b = backend if b == "this" else CPU
    with pytest.raises(LlogosError, match="multiples of 32"):
        b.kv_cache(1, 8, 2, 48, 48, "q8_0", "f16")
    with pytest.raises(LlogosError, match="unknown KV cache type"):
        b.kv_cache(1, 8, 2, 64, 64, "q5_1", "f16")


# ------------------------------------------------------------------ sampling
@pytest.mark.parametrize("n", [1, 1000, 70001])
def test_argmax_rows_take_each_rows_first_maximum(backend, n):
    x = np.random.default_rng(n).standard_normal((3, n)).astype(np.float32) - 10
    x[0, n // 3] = x[0, n - 1] = 5.0  # a tie: NumPy returns the first
    x[1, n - 1] = 6.0
    x[2, 0] = 7.0
    got = backend.argmax_rows(backend.xp.asarray(x))
    assert got.tolist() == np.argmax(x, axis=1).tolist() == [n // 3, n - 1, 0]


def _masked_reference(x: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """x with token i of row r at -inf unless bit i % 32 of bits[r, i // 32] is set (none past the words)."""
    want = np.full(x.shape, -np.inf, np.float32)
    for r in range(x.shape[0]):
        for i in range(min(x.shape[1], 32 * bits.shape[1])):
            if (int(bits[r, i // 32]) >> (i % 32)) & 1:
                want[r, i] = x[r, i]
    return want


@pytest.mark.parametrize("n, words", [(1037, 33), (1037, 30), (64, 2)])
def test_mask_logits_leaves_each_row_its_allowed_tokens(backend, n, words):
    """A grammar's bitmask per row (llguidance's layout); 30 words cover fewer tokens than the row
    has: the rest are forbidden, as the logits' padding past the vocabulary is."""
    rng = np.random.default_rng(n + words)
    x = rng.standard_normal((3, n)).astype(np.float32)
    bits = rng.integers(0, 2 ** 32, (3, words), dtype=np.uint64).astype(np.uint32)
    bits[1] = 0                  # nothing allowed
    bits[2, 0] = 1 << 5          # one token in the first word, none elsewhere
    bits[2, 1:] = 0
    want = _masked_reference(x, bits)
    got = host(backend, backend.mask_logits(backend.xp.asarray(x), bits))
    assert np.array_equal(got, want)
    assert np.array_equal(CPU.mask_logits(x, bits), want)
    assert backend.argmax_rows(backend.mask_logits(backend.xp.asarray(x), bits))[2] == 5  # on the host
