"""The few-row float32 product (cpu_rows) against a float64 product, and the backends' use of it."""

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from llogos_cli.backends.cpu import cpu_rows, numpy_backend
from llogos_cli.backends.cpu.cpu_simd import ROW_LANES, f32_rows_tile


@pytest.mark.parametrize("n_tok", (0, 1, 2, 15, 16, 17, 33, 48, 64))
@pytest.mark.parametrize("n_out, k_len", ((53, 37), (7, 1536), (1000, 576)))
def test_product_matches_float64(n_tok, n_out, k_len):
    """Token counts across 1-4 vectors of lanes, partial last vectors (and none: a step that
    wants no logits); rows off every tile size (a short last tile); row lengths off the
    16-element prefetch step."""
    rng = np.random.default_rng(n_tok * 1000 + n_out)
    w = rng.standard_normal((n_out, k_len), dtype=np.float32)
    x = rng.standard_normal((n_tok, k_len), dtype=np.float32)
    expected = x.astype(np.float64) @ w.astype(np.float64).T
    got = cpu_rows.matmul_rows(x, w)
    assert got.shape == (n_tok, n_out) and got.flags.c_contiguous
    # float32 sums over k_len terms: error grows as sqrt(k_len) eps times the terms' magnitude
    bound = 8 * np.sqrt(k_len) * np.finfo(np.float32).eps * np.abs(x) @ np.abs(w).T
    assert np.all(np.abs(got - expected) <= bound)


def test_strided_rows_in_and_out():
    """Weight rows and output rows with strides of their own (a column range of a larger output,
    as the quantized path's tiles write); columns beside the range are left alone."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((29, 50), dtype=np.float32)[:, :40]
    x = rng.standard_normal((20, 40), dtype=np.float32)
    out = np.full((20, 60), 7, np.float32)
    cpu_rows.matmul_rows(x, w, out[:, 10:39])
    np.testing.assert_allclose(out[:, 10:39], x.astype(np.float64) @ w.astype(np.float64).T, rtol=1e-4, atol=1e-4)
    assert np.all(out[:, :10] == 7) and np.all(out[:, 39:] == 7)


@pytest.mark.parametrize("rows, vectors", ((6, 1), (3, 2), (2, 3), (1, 4), (8, 2)))
def test_every_tile_geometry(rows, vectors):
    """The tiles of the other table (hosts without AVX-512) as well as this host's, one at a time
    over a matrix whose last tile is short."""
    tile = f32_rows_tile(rows, vectors)

    @numba.njit   # not cached: each geometry is its own closure
    def product(w, xt, out):
        for n0 in range(0, w.shape[0], rows):
            tile(w, xt, out, n0, min(rows, w.shape[0] - n0))

    rng = np.random.default_rng(rows * 10 + vectors)
    n_tok = ROW_LANES * vectors - 3
    w = rng.standard_normal((4 * rows + 1, 70), dtype=np.float32)
    x = rng.standard_normal((n_tok, 70), dtype=np.float32)
    xt = np.zeros((70, ROW_LANES * vectors), np.float32)
    xt[:, :n_tok] = x.T
    out = np.empty((n_tok, w.shape[0]), np.float32)
    product(w, xt, out)
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.astype(np.float64).T, rtol=1e-4, atol=1e-4)


def test_takes_a_few_rows_of_a_large_enough_matrix():
    big = np.empty((cpu_rows.MIN_WEIGHTS // 64, 64), np.float32)
    small = big[:-1]
    assert [cpu_rows.takes(n, big) for n in (0, 1, 2, cpu_rows.MAX_ROWS, cpu_rows.MAX_ROWS + 1)] == \
        [False, False, True, True, False]
    assert not cpu_rows.takes(16, small)


@pytest.mark.parametrize("batched", (False, True))
def test_backend_products_agree_with_blas_on_either_side_of_the_few_rows(batched):
    """One row (a GEMV), 2-64 rows (cpu_rows when batched and the matrix is large enough, else BLAS
    with the weights on the left), 65 (a GEMM): every way gives the BLAS product."""
    rng = np.random.default_rng(2)
    b = numpy_backend.NumpyBackend(batched=batched)
    for n_out in (70, cpu_rows.MIN_WEIGHTS // 96 + 1):   # either side of MIN_WEIGHTS
        raw = rng.standard_normal((n_out, 96), dtype=np.float32)
        w = b.matrix(raw.view(np.uint8), GGMLQuantizationType.F32, matmul=True)
        for n_tok in (1, 2, cpu_rows.MAX_ROWS, cpu_rows.MAX_ROWS + 1):
            x = rng.standard_normal((n_tok, 96), dtype=np.float32)
            np.testing.assert_allclose(b.matmul(x, w), x @ raw.T, rtol=1e-5, atol=1e-4)
