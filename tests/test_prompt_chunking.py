"""A prompt's logits do not depend on how it is cut into forward passes: one step, steps cut
anywhere (the -ub chunks, a prefix-cache hit that leaves a few tokens, a second chunk) or a token
at a time give the same bits on the CPU's compiled path, unpaged and through the prefix cache's
scattered blocks. One rounding apart in a layer's attention grows through the 8-bit activations of
the products into logits tenths apart (a cached and an uncached reply disagreeing), so equality is
what is asked, not closeness."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.engine.prefix_cache import BLOCK_SIZE
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.batch import Batch
from llogos_cli.model.forward import Model
from tests.conftest import FIXTURES, copy_gguf, need


def _logits(model: Model, ids: np.ndarray, cuts: tuple, paged: bool, cache_type: str | None = None) -> np.ndarray:
    """Every token's logits, the prompt run in steps ending at cuts, in slot 0 of a fresh cache (of
    cache_type, else the default, f16)."""
    n_ctx = -(-len(ids) // BLOCK_SIZE) * BLOCK_SIZE
    if paged:   # the slot's blocks out of order in the pool, as the prefix cache hands them out
        n_blocks = n_ctx // BLOCK_SIZE
        cache = model.new_cache(1, n_ctx, cache_type, cache_type, n_blocks=n_blocks, block_size=BLOCK_SIZE)
        order = np.random.default_rng(0).permutation(n_blocks).tolist()
        model.backend.write_block_table(cache.block_tables, 0, order)
    else:
        cache = model.new_cache(1, n_ctx, cache_type, cache_type)
    bounds = (0, *cuts, len(ids))
    return np.concatenate([model.forward(cache, Batch.run(ids[a:b], 0, a, np.arange(b - a)))
                           for a, b in zip(bounds[:-1], bounds[1:])])


def _cuts(n: int) -> list[tuple]:
    """Cuts after one token, mid-tile, a few tokens before the end, anywhere, and a token at a time."""
    return [(1,), (45,), (n - 3,), (7, 40, 41, 100, n - 1), tuple(range(1, n))]


def _assert_any_cut_gives_the_same_bits(model: Model, ids: np.ndarray, cuts: list[tuple],
                                        cache_type: str | None = None) -> None:
    for paged in (False, True):
        whole = _logits(model, ids, (), paged, cache_type)
        for c in cuts:
            assert np.array_equal(_logits(model, ids, c, paged, cache_type), whole), (paged, c[:5])


def _wide_gemma3(tmp_path):
    """The Gemma 3 fixture with a window of 90 positions: its local layers' first key moves across chunks."""
    path = need(FIXTURES / "tiny-gemma3-q8_0.gguf")
    packed = {t.name: (t.data, t.tensor_type) for t in GGUFReader(path).tensors
              if t.tensor_type == GGMLQuantizationType.Q8_0}   # their bytes, as the writer takes them
    return copy_gguf(path, tmp_path / "wide.gguf", {"gemma3.attention.sliding_window": 90}, packed)


@pytest.mark.parametrize("name", ("tiny-llama-q8_0", "tiny-gemma3-q8_0"))
def test_a_fixture_prompt_gives_the_same_logits_however_it_is_cut(name, tmp_path):
    """Gemma 3's local layers with a window wider than a chunk of keys, so that a query's first key
    moves across chunks; Llama's causal attention over all of them."""
    path = _wide_gemma3(tmp_path) if name.startswith("tiny-gemma3") else need(FIXTURES / f"{name}.gguf")
    model = Model(GGUFFile(path), NumpyBackend("quantized"))
    ids = np.random.default_rng(1).integers(3, 500, 150).astype(np.int32)
    _assert_any_cut_gives_the_same_bits(model, ids, _cuts(len(ids)))


def test_smollm2_gives_the_same_logits_however_its_prompt_is_cut(smollm_path):
    model = Model(GGUFFile(smollm_path), NumpyBackend("quantized"))
    ids = np.random.default_rng(2).integers(100, 20000, 200).astype(np.int32)
    _assert_any_cut_gives_the_same_bits(model, ids, _cuts(len(ids))[:-1])


@pytest.mark.parametrize("cache_type", ("f16", "q8_0", "q4_0", "iq4_nl"))
def test_any_cut_gives_the_same_bits_with_each_kv_cache_type(cache_type, tmp_path):
    """The compiled attention reads f16 and packed 4-bit rows (decoded a chunk at a time) over the
    same fixed chunks as float32 ones (Gemma 3's heads of 32: a block of the 4-bit types a row)."""
    model = Model(GGUFFile(_wide_gemma3(tmp_path)), NumpyBackend("quantized"))
    ids = np.random.default_rng(3).integers(3, 500, 150).astype(np.int32)
    _assert_any_cut_gives_the_same_bits(model, ids, _cuts(len(ids))[:-1], cache_type)
