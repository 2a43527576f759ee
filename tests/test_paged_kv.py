"""The paged KV cache: KV in a pool of blocks reached through block tables, rows sharing a prefix's
blocks, admission by blocks and recompute preemption when the pool runs dry."""

import numpy as np
import pytest

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.engine.batch import BatchEngine, Request, row_seed
from llogos_cli.engine.generation import Generation
from llogos_cli.engine.prefix_cache import BLOCK_SIZE
from llogos_cli.engine.sampling import SamplingParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model import memory
from llogos_cli.model.batch import Batch
from llogos_cli.model.forward import Model
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.conftest import EXACT_KV, FIXTURES, need, relative_error
from tests.test_batch import FAMILIES, greedy_alone, load
from tests.test_prefix_reuse import NEW_FAMILIES, OWN_FIXTURES

# ---------------------------------------------------------------- the forward pass through tables
B = 4            # positions per block: small, so that runs cross several blocks
N_CTX = 32
LENGTHS = [11, 9, 15, 6]
SHARED = 8       # sequence 2 begins with sequence 0's first SHARED tokens: two full blocks
STEPS = [        # (sequence, tokens): prompt chunks and decode rows mixed, as tests/test_batch.py's
    [(0, 6), (1, 4)],
    [(1, 1), (0, 3), (3, 2)],
    [(0, 1), (2, 5), (1, 1), (3, 1)],   # sequence 2 starts after the shared blocks
    [(3, 1), (0, 1), (2, 1), (1, 3)],
    [(2, 1), (3, 2)],
]


# Every family with a float32 fixture, ../shared's and this repository's, but the embedding and
# reranking models' (tiny-*-embed: test_embeddings.py; tiny-*-rerank: test_rerank.py), which need not
# have an LM head.
ALL_FAMILIES = sorted({p.name[:-len("-f32.gguf")] for d in (FIXTURES, OWN_FIXTURES) for p in d.glob("*-f32.gguf")
                       if not p.name.endswith(("-embed-f32.gguf", "-rerank-f32.gguf"))} | set(FAMILIES) | set(NEW_FAMILIES))


def load_any(name: str) -> tuple[Model, Tokenizer]:
    path = FIXTURES / f"{name}-f32.gguf"
    f = GGUFFile(need(path if path.exists() else OWN_FIXTURES / f"{name}-f32.gguf"))
    return Model(f, NumpyBackend(batched=True)), Tokenizer.from_gguf(f)


@pytest.mark.parametrize("name", ALL_FAMILIES)
def test_a_paged_cache_gives_the_logits_of_each_sequence_alone(name):
    """Four rows in one pool, their blocks scattered and out of order; the attention-only models'
    third row reads the first row's blocks for its beginning instead of computing them."""
    m, _ = load_any(name)
    rng = np.random.default_rng(4)
    seqs = [rng.integers(3, m.cfg.n_vocab, n).astype(np.int32) for n in LENGTHS]
    share = not any(m.cfg.recurrent)
    if share:
        seqs[2][:SHARED] = seqs[0][:SHARED]
    alone = [m.forward_seq(m.new_context(N_CTX, *EXACT_KV), s, all_logits=True) for s in seqs]
    n_rows = -(-N_CTX // B)
    cache = m.new_cache(4, N_CTX, *EXACT_KV, n_blocks=4 * n_rows, block_size=B)
    tables = rng.permutation(4 * n_rows).reshape(4, n_rows).astype(np.int32)
    done = [0] * len(seqs)
    if share:
        tables[2, :SHARED // B] = tables[0, :SHARED // B]
        done[2] = SHARED
    cache.block_tables[:4] = tables
    for step in STEPS:
        parts = []
        step = [(i, n + SHARED if i == 2 and done[i] == 0 else n) for i, n in step]   # unshared: all of it
        for i, n in step:
            if done[i] == 0:
                cache.reset(i)
            parts.append(Batch.run(seqs[i][done[i]:done[i] + n], i, done[i], np.arange(n)))
            done[i] += n
        logits = m.forward(cache, Batch.join(parts))
        row = 0
        for i, n in step:
            got, want = logits[row:row + n], alone[i][done[i] - n:done[i]]
            assert relative_error(got, want) < 1e-5, (name, step, i)
            row += n
    assert done == LENGTHS


def test_the_pool_is_blocks_not_slots_times_the_context():
    m, _ = load_any("tiny-llama")
    cache = m.new_cache(64, 512, n_blocks=40, block_size=BLOCK_SIZE)
    kv = next(kv for kv in cache.kv if kv is not None)
    assert kv.k.shape[:3] == (41, m.cfg.n_head_kv, BLOCK_SIZE)   # and a scratch block for padding rows
    assert cache.block_tables.shape == (65, 512 // BLOCK_SIZE)
    assert (cache.block_tables[cache.pad_slot] == 40).all()


# ---------------------------------------------------------------- the engine on a paged pool
def greedy(rid, prompt, n_predict) -> Request:
    return Request(rid, list(prompt), SamplingParams(temp=0.0), StopCriteria(n_predict, ignore_eos=True))


def smallest_pool(monkeypatch) -> None:
    """Pools as small as they may be: one full context."""
    monkeypatch.setattr(memory, "host_available", lambda: 0)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen35"])
def test_many_short_rows_share_a_pool_smaller_than_the_slots_and_are_preempted_not_failed(name, monkeypatch):
    m, tok = load(name)
    smallest_pool(monkeypatch)
    rng = np.random.default_rng(6)
    requests = [greedy(i, rng.integers(3, m.cfg.n_vocab, int(rng.integers(3, 20))), 14) for i in range(12)]
    engine = BatchEngine(m, tok, n_slots=8, n_ctx=64, step_tokens=32, prefix_cache_bytes=0)
    assert len(engine.scheduler.blocks.blocks) == 64 // BLOCK_SIZE   # 8 slots of 64 would take 32
    results = {r.id: r for r in engine.generate(requests)}
    assert engine.scheduler.n_preempted > 0
    for r in requests:
        assert results[r.id].error is None
        assert results[r.id].tokens == greedy_alone(m, tok, r.prompt, 14), r.id
    assert engine.idle and all(b.refs == 0 for b in engine.scheduler.blocks.blocks)


def test_a_preempted_sampled_row_keeps_its_random_stream(monkeypatch):
    m, tok = load("tiny-llama")
    rng = np.random.default_rng(7)
    requests = [Request(f"r{i}", rng.integers(3, m.cfg.n_vocab, 10).tolist(),
                        SamplingParams(temp=1.0, seed=row_seed(3, f"r{i}")), StopCriteria(20, ignore_eos=True))
                for i in range(6)]
    alone = {r.id: r.tokens for req in requests for r in BatchEngine(m, tok, 1, 64).generate([req])}
    smallest_pool(monkeypatch)
    engine = BatchEngine(m, tok, 6, 64)
    got = {r.id: r.tokens for r in engine.generate(requests)}
    assert engine.scheduler.n_preempted > 0
    assert got == alone


def test_rows_with_a_common_prefix_point_at_the_same_blocks():
    m, tok = load("tiny-llama")
    rng = np.random.default_rng(8)
    system = rng.integers(3, m.cfg.n_vocab, 40).tolist()
    engine = BatchEngine(m, tok, 3, 128)
    list(engine.generate([greedy("first", system + [5, 6], 2)]))
    for rid, tail in (("a", [7, 8, 9]), ("b", [10] * 20), ("c", system[:5])):
        engine.add(greedy(rid, system + tail, 4))
    engine.step()   # admits all three, past the first's two full blocks
    a, b, c = engine.scheduler.running
    assert a.blocks[:2] == b.blocks[:2] == c.blocks[:2]
    assert [a.prefix_hit, b.prefix_hit, c.prefix_hit] == [32, 32, 32]
    assert all(engine.scheduler.blocks.blocks[i].refs == 3 for i in a.blocks[:2])
    assert not set(a.blocks[2:]) & set(b.blocks[2:])   # what each writes is its own
    assert np.array_equal(engine.runner.cache.block_tables[a.slot, :len(a.blocks)], a.blocks)
    while not engine.idle:
        engine.step()


@pytest.mark.parametrize("name", ALL_FAMILIES)
def test_every_family_gives_the_same_greedy_tokens_batched_with_and_without_the_cache_and_alone(name):
    """Shared, partly shared (diverging mid-block) and unshared prefixes running together."""
    m, tok = load_any(name)
    rng = np.random.default_rng(10)
    system, other = rng.integers(3, m.cfg.n_vocab, 40).tolist(), rng.integers(3, m.cfg.n_vocab, 30).tolist()
    prompts = [system + other[:5], system + other[5:12], system[:24] + other[:9], other, system + other[:5] + [4]]
    requests = [greedy(i, p, 6) for i, p in enumerate(prompts)]
    alone = {i: [t.id for t in Generation.alone(m, tok, 128, greedy(i, p, 6))]
             for i, p in enumerate(prompts)}   # the same n_ctx: Phi-3's rope factors depend on it
    for cache in (0, 1 << 20):
        engine = BatchEngine(m, tok, 3, 128, step_tokens=24, prefix_cache_bytes=cache)
        got = {r.id: r for r in engine.generate(requests)}
        assert {i: r.tokens for i, r in got.items()} == alone, (name, cache)
        hits = sum(r.prefix_hit for r in got.values())
        assert hits > 0 if cache and not any(m.cfg.recurrent) else hits == 0, (name, cache)


# ---------------------------------------------------------------- the CUDA backend (emulated)
def test_the_cuda_backend_pages_shares_and_preempts_the_same_way(monkeypatch):
    """Block tables in the CUDA kernels (run by the CPU emulator), decode steps through captured
    graphs whose tables are rewritten in place, in the smallest pool: rows share a prefix's blocks,
    are preempted and recomputed, and each gives what it gives alone."""
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    from tests.emu.emulator import EmuKernels
    monkeypatch.setattr(memory, "gpu_available", lambda: 0)
    f = GGUFFile(need(FIXTURES / "tiny-llama-q8_0.gguf"))
    # Float32 products: a row's prompt may go through a joined step's f16 GEMM here and through
    # the 8-bit products alone, and on this random-weight model that moves greedy near-ties.
    m, tok = Model(f, CudaBackend(EmuKernels(), "float")), Tokenizer.from_gguf(f)
    rng = np.random.default_rng(9)
    system = rng.integers(3, m.cfg.n_vocab, 20).tolist()
    requests = [greedy(i, system + rng.integers(3, m.cfg.n_vocab, int(rng.integers(1, 6))).tolist(), 12)
                for i in range(5)]
    alone = {r.id: r.tokens for req in requests
             for r in BatchEngine(m, tok, 1, 64, ("f16", "f16"), prefix_cache_bytes=0).generate([req])}
    engine = BatchEngine(m, tok, 4, 64, ("f16", "f16"))
    assert len(engine.scheduler.blocks.blocks) == 64 // BLOCK_SIZE
    got = {r.id: r for r in engine.generate(requests)}
    assert {rid: r.tokens for rid, r in got.items()} == alone
    assert engine.scheduler.n_preempted > 0 and sum(r.prefix_hit for r in got.values()) > 0
