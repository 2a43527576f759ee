"""Continuous batching: a batch of rows from several cache slots equals each sequence run alone."""

import numpy as np
import pytest

from llogos_cli.backends.cpu import cpu_rows
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.engine.batch import BatchEngine, Request, row_seed
from llogos_cli.engine.generation import Generation
from llogos_cli.engine.sampling import SamplingParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.batch import Batch
from llogos_cli.model.forward import Model
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.conftest import EXACT_KV, FIXTURES, need, relative_error

FAMILIES = ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-qwen35", "tiny-gemma3"]


@pytest.fixture(autouse=True)
def rows_kernel_on_tiny_matrices(monkeypatch):
    """The fixtures' matrices are below the size the backend hands to cpu_rows; here it takes them
    all, so that batches run through the kernel a batched decode of a real model uses."""
    monkeypatch.setattr(cpu_rows, "MIN_WEIGHTS", 0)


def load(name: str) -> tuple[Model, Tokenizer]:
    f = GGUFFile(need(FIXTURES / f"{name}-f32.gguf"))
    return Model(f, NumpyBackend(batched=True)), Tokenizer.from_gguf(f)


# Each step lists (sequence, slot, tokens): prompt chunks and single tokens (decode rows) mixed, rows
# out of slot order and in order, and slot 0 reused by sequence 2 after sequence 1 has finished.
LENGTHS = [11, 4, 9, 6]
STEPS = [
    [(0, 2, 6), (1, 0, 4)],
    [(2, 0, 1), (0, 2, 1)],                 # slot 0 reused; rows out of slot order
    [(0, 2, 1), (2, 0, 1), (3, 1, 1)],      # out of order
    [(2, 0, 1), (3, 1, 1), (0, 2, 1)],      # contiguous slots in order
    [(0, 2, 2), (3, 1, 1), (2, 0, 5)],
    [(3, 1, 3), (2, 0, 1)],
]


@pytest.mark.parametrize("name", FAMILIES)
def test_mixed_batches_give_the_logits_of_each_sequence_alone(name):
    m, _ = load(name)
    rng = np.random.default_rng(1)
    seqs = [rng.integers(3, m.cfg.n_vocab, n).astype(np.int32) for n in LENGTHS]
    alone = [m.forward_seq(m.new_context(32, *EXACT_KV), s, all_logits=True) for s in seqs]
    cache = m.new_cache(3, 32, *EXACT_KV)
    done = [0] * len(seqs)
    for step in STEPS:
        parts = []
        for i, slot, n in step:
            if done[i] == 0:
                cache.reset(slot)
            parts.append(Batch.run(seqs[i][done[i]:done[i] + n], slot, done[i], np.arange(n)))
            done[i] += n
        logits = m.forward(cache, Batch.join(parts))
        row = 0
        for i, slot, n in step:
            got, want = logits[row:row + n], alone[i][done[i] - n:done[i]]
            assert relative_error(got, want) < 1e-5, (name, step, i)
            row += n
    assert done == LENGTHS


def test_a_batch_must_keep_each_slot_in_one_run():
    m, _ = load("tiny-llama")
    cache = m.new_cache(2, 16)
    split = Batch(np.array([5, 6, 7], np.int32), np.array([0, 1, 0], np.int32), np.array([0, 0, 1], np.int32),
                  np.arange(3))
    with pytest.raises(LlogosError, match="one run"):
        m.forward(cache, split)


def greedy_alone(m, tok, prompt, n_predict):
    gen = Generation.alone(m, tok, 64, Request(0, prompt, SamplingParams(temp=0.0), StopCriteria(n_predict, ignore_eos=True)))
    return [t.id for t in gen]


@pytest.mark.parametrize("name", FAMILIES)
def test_engine_greedy_rows_equal_generation_alone(name):
    """More requests than slots and a step budget smaller than the prompts: prompts are split
    across steps and mixed with decoding rows, rows finish at different times and are refilled."""
    m, tok = load(name)
    rng = np.random.default_rng(2)
    requests = [Request(i, rng.integers(3, m.cfg.n_vocab, n).tolist(), SamplingParams(temp=0.0),
                        StopCriteria(k, ignore_eos=True))
                for i, (n, k) in enumerate([(9, 6), (3, 2), (14, 9), (5, 1), (2, 7), (11, 4), (6, 5)])]
    engine = BatchEngine(m, tok, n_slots=3, n_ctx=64, step_tokens=5)
    results = {r.id: r for r in engine.generate(requests)}
    assert sorted(results) == list(range(len(requests)))
    for r in requests:
        assert results[r.id].tokens == greedy_alone(m, tok, r.prompt, r.criteria.n_predict), r.id
        assert results[r.id].stop == "limit"
    assert engine.idle and engine.scheduler.slots.n_free == 3


@pytest.mark.parametrize("n_slots", [1, 4])
def test_sampled_rows_do_not_depend_on_their_batch(n_slots):
    m, tok = load("tiny-qwen35")
    rng = np.random.default_rng(3)
    requests = [Request(f"r{i}", rng.integers(3, m.cfg.n_vocab, 4 + i).tolist(),
                        SamplingParams(temp=1.0, seed=row_seed(7, f"r{i}")), StopCriteria(8, ignore_eos=True))
                for i in range(6)]
    results = {r.id: r.tokens for r in BatchEngine(m, tok, n_slots, 64).generate(requests)}
    alone = {r.id: r.tokens for req in requests for r in BatchEngine(m, tok, 1, 64).generate([req])}
    assert results == alone
    assert len({tuple(t) for t in results.values()}) > 1   # the rows really sampled


def test_bad_requests_fail_alone():
    m, tok = load("tiny-llama")
    requests = [Request("ok", [5, 6, 7], SamplingParams(temp=0.0), StopCriteria(3, ignore_eos=True)),
                Request("long", list(range(3, 40)), SamplingParams(temp=0.0)),
                Request("empty", [], SamplingParams(temp=0.0)),
                Request("vocab", [m.cfg.n_vocab], SamplingParams(temp=0.0))]
    results = {r.id: r for r in BatchEngine(m, tok, 2, 32).generate(requests)}
    assert len(results["ok"].tokens) == 3 and results["ok"].error is None
    assert "more than the context size" in results["long"].error
    assert "empty" in results["empty"].error
    assert "out of range" in results["vocab"].error


def test_row_seed_depends_on_seed_and_id():
    assert row_seed(1, "a") == row_seed(1, "a")
    assert len({row_seed(1, "a"), row_seed(2, "a"), row_seed(1, "b"), row_seed(1, 1)}) == 4
