"""Checks of the CUDA backend's encoder ops (layernorm, gelu, attention that is not causal) and of
embeddings through it, against the NumPy backend, run under the CPU emulator (test_cuda_encoders.py)
and on a GPU (test_cuda_gpu.py), which import these tests and supply the `backend` fixture.

Embeddings are compared as llogos gives them, pooled and normalized to unit length, on the two
embedding fixtures: tiny-bert-embed (an encoder) and tiny-qwen3-embed (a decoder pooled by its
last token)."""

import numpy as np
import pytest

from llogos_cli.backends.cuda import cuda_attention, cuda_matmul
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.engine.embedding import Embedder, EmbedOptions
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.forward import Model
from tests.conftest import relative_error
from tests.emu.op_suite import ATTENTION_BATCHES, CPU, HISTORY, _store, assert_close, host, paged_caches
from tests.test_embeddings import HERE, oracle

EMBEDDING_MODELS = ["tiny-bert-embed", "tiny-qwen3-embed"]
MIN_COSINE = 0.99999
F32_ROUNDOFF = 2.0 ** -24
F16_ROUNDOFF = 2.0 ** -11
LONGEST = cuda_attention.FUSED_MAX_TOKENS + 14   # tokens of the longest prompt, within the fixtures' 32


# ------------------------------------------------------------------ the encoder ops
@pytest.mark.parametrize("shape", [(5, 64), (3, 768), (2, 1536), (1, 100)])
def test_encoder_layernorm(backend, shape):
    """Rows far from zero mean (BERT's residual stream can be): the centring must not cancel."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(shape) * 3 + 40).astype(np.float32)
    w, b = (rng.standard_normal(shape[-1]).astype(np.float32) for _ in range(2))
    got = backend.layernorm(backend.xp.asarray(x), backend.xp.asarray(w), backend.xp.asarray(b), 1e-12)
    assert_close(host(backend, got), CPU.layernorm(x, w, b, 1e-12))


def test_encoder_gelu(backend):
    x = np.random.default_rng(12).standard_normal((3, 333)).astype(np.float32) * 4
    x[0, :6] = [-100, 100, -10, 10, 0, -0.0]   # tanh saturated: GELU is 0 and x there
    got = host(backend, backend.gelu(backend.xp.asarray(x)))
    assert_close(got, CPU.gelu(x), rtol=1e-6)
    assert np.array_equal(got[0, :6], [0, 100, 0, 10, 0, 0])


def _caches(backend, paged: bool, n_slots: int, n_ctx: int, n_kv: int, dk: int, dv: int, cache_type: str) -> list:
    """A cache on each backend; paged: 8-position blocks scattered over the pool alike on both."""
    if not paged:
        return [b.kv_cache(n_slots, n_ctx, n_kv, dk, dv, cache_type, cache_type) for b in (CPU, backend)]
    block = 8
    n_blocks = n_slots * n_ctx // block
    tables = np.random.default_rng(15).permutation(n_blocks).astype(np.int32).reshape(n_slots, n_ctx // block)
    return paged_caches(backend, tables, n_blocks + 1, block, n_kv, dk, dv, cache_type, cache_type)


@pytest.mark.parametrize("cache_type, paged", [("f32", False), ("f16", False), ("q8_0", False), ("f16", True)])
@pytest.mark.parametrize("runs", ATTENTION_BATCHES.values(), ids=ATTENTION_BATCHES)
def test_encoder_attention_sees_its_whole_run(backend, cache_type, paged, runs):
    """Not causal: each query attends its slot's keys up to its run's last position, on both CUDA
    paths (short runs fused, long ones GEMM + softmax_lengths) and through block tables."""
    rng = np.random.default_rng(len(runs))
    n_slots, n_ctx, n_kv, n_head, dk, dv = 5, 64, 2, 6, 64, 32
    caches = _caches(backend, paged, n_slots, n_ctx, n_kv, dk, dv, cache_type)
    _store(backend, caches, rng, [(slot, 0, n) for slot, n in HISTORY.items() if n], n_kv, dk, dv)
    cpu_layout, layout = _store(backend, caches, rng, [(slot, HISTORY[slot], n) for slot, n in runs], n_kv, dk, dv)
    q = rng.standard_normal((len(cpu_layout.pos), n_head, dk)).astype(np.float32)
    want = CPU.attention(q, caches[0], cpu_layout, 0.125, 0, causal=False)
    got = backend.attention(backend.xp.asarray(q), caches[1], layout, 0.125, 0, causal=False)
    assert_close(host(backend, got), want, rtol=2e-5)
    if any(n > 1 for _, n in runs):   # a run of one token sees the same keys either way
        assert relative_error(CPU.attention(q, caches[0], cpu_layout, 0.125, 0), want) > 1e-2


# ------------------------------------------------------------------ embeddings
def _prompts(n_vocab: int) -> list[list[int]]:
    """Two prompts longer than FUSED_MAX_TOKENS, whose runs take the GEMM attention (the fixtures'
    texts, a few tokens each, take the fused kernel)."""
    rng = np.random.default_rng(16)
    return [rng.integers(0, n_vocab, n).tolist() for n in (LONGEST, cuda_attention.FUSED_MAX_TOKENS + 1)]


def _embeddings(backend, name: str, pooling: str, batch_tokens: int) -> tuple[np.ndarray, np.ndarray, Model]:
    """(CUDA's, NumPy's) unit embeddings (rows) of the fixture's texts and two longer prompts."""
    f = GGUFFile(HERE / f"{name}-f32.gguf")
    cpu, gpu = Model(f, NumpyBackend()), Model(f, backend)
    prompts = oracle(name)[1] + _prompts(cpu.cfg.n_vocab)
    options = EmbedOptions(pooling, 2)
    got, want = (np.concatenate(Embedder(m, 32, batch_tokens).embed(prompts, options)).reshape(-1, cpu.cfg.n_embd)
                 for m in (gpu, cpu))
    return got, want, cpu


def float32_bound(cfg, n_tok: int) -> float:
    """A first-order worst-case bound on an element of a unit embedding, backend against backend:
    each backend's float32 sum of n terms is within n·u of the exact sum, relative to the sum of the
    terms' magnitudes (Higham's γ_n), and a value passes through these sums on its way from the
    embeddings to the pooled, normalized vector."""
    per_layer = (cfg.n_embd                        # q, k and v
                 + cfg.head_dim_k + n_tok          # scores; values weighted by the softmax
                 + cfg.n_head * cfg.head_dim_v     # attention output
                 + cfg.n_embd + cfg.n_ff           # up (and gate); down
                 + 2 * cfg.n_embd)                 # the layer's two norms
    chain = cfg.n_layer * per_layer + cfg.n_embd + n_tok + cfg.n_embd   # first or last norm, pooling, normalizing
    return 2 * chain * F32_ROUNDOFF


def _check_unit_embeddings(got: np.ndarray, want: np.ndarray, bound: float) -> None:
    cosine = np.sum(got.astype(np.float64) * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= MIN_COSINE, cosine
    assert_close(got, want, rtol=bound, scale=1.0)


@pytest.mark.parametrize("pooling", ["mean", "cls", "last", "none"])
@pytest.mark.parametrize("name", EMBEDDING_MODELS)
def test_embeddings_match_the_cpu_backend(backend, name, pooling):
    """Forward passes of fewer than GEMM_MIN_TOKENS tokens: float32 products throughout."""
    got, want, cpu = _embeddings(backend, name, pooling, cuda_matmul.GEMM_MIN_TOKENS - 1)
    _check_unit_embeddings(got, want, float32_bound(cpu.cfg, LONGEST))


@pytest.mark.parametrize("name", EMBEDDING_MODELS)
def test_embeddings_of_a_long_batch_match_the_cpu_backend(backend, name):
    """All prompts in one pass of GEMM_MIN_TOKENS tokens or more: the products take f16 GEMMs, whose
    operands are rounded to half precision (2^-11 each, two a product) on the CUDA side, through
    the 4 products of every layer (q, k and v; output; up; down)."""
    got, want, cpu = _embeddings(backend, name, "mean", 512)
    assert len(oracle(name)[0]["ids"]) + sum(map(len, _prompts(cpu.cfg.n_vocab))) >= cuda_matmul.GEMM_MIN_TOKENS
    _check_unit_embeddings(got, want, 4 * cpu.cfg.n_layer * 2 * F16_ROUNDOFF)
