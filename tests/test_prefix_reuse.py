"""Prefix caching in the batch engine: prompts that begin alike reuse the kept KV blocks, and every
result equals the one without the cache."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from llogos_cli.backends.cuda.cuda_backend import CudaBackend
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.prefix_cache import BLOCK_SIZE
from llogos_cli.engine.sampling import SamplingParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model import memory
from llogos_cli.model.batch import Batch
from llogos_cli.model.forward import Model
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.conftest import EXACT_KV, FIXTURES, need
from tests.emu.emulator import EmuKernels
from tests.test_batch import FAMILIES, load
from tests.test_cli import env, llogos  # noqa: F401  (env is a fixture)

CACHE = 1 << 20   # bytes of prefix cache: ample for the tiny models
ATTENTION_ONLY = [f for f in FAMILIES if f != "tiny-qwen35"]
OWN_FIXTURES = Path(__file__).resolve().parent / "fixtures"   # the families added beside ../shared's
NEW_FAMILIES = ["tiny-gemma2", "tiny-phi3", "tiny-phi3-longrope", "tiny-granite", "tiny-olmo2", "tiny-smollm3",
                "tiny-lfm2", "tiny-qwen3moe"]


def request(rid, prompt, n_predict=6, n_logprobs=3, **sampling) -> Request:
    params = SamplingParams(**({"temp": 0.0} | sampling))
    return Request(rid, list(prompt), params, StopCriteria(n_predict, ignore_eos=True), n_logprobs)


def prompts(n_vocab: int) -> dict[str, list[int]]:
    """Prompts sharing a 40-token beginning (2.5 blocks), diverging at it, mid-block, or not at all."""
    rng = np.random.default_rng(5)
    system = rng.integers(3, n_vocab, 40).tolist()
    other = rng.integers(3, n_vocab, 30).tolist()
    return {"a": system + other[:9], "b": system + other[9:20], "same": system + other[:9],
            "mid": system[:20] + other[:15], "aligned": system[:32], "none": other,
            "short": system[:5]}


def run(engine: BatchEngine, requests: list[Request]) -> dict:
    return {r.id: r for r in engine.generate(requests)}


def assert_same(got, want, label):
    assert got.tokens == want.tokens, label
    assert got.stop == want.stop, label
    for mine, theirs in zip(got.logprobs, want.logprobs):
        assert [i for i, _ in mine] == [i for i, _ in theirs], label
        assert np.allclose([lp for _, lp in mine], [lp for _, lp in theirs], atol=1e-4), label


@pytest.mark.parametrize("name", FAMILIES)
def test_batched_rows_with_shared_prefixes_equal_the_engine_without_the_cache(name):
    """Two slots and a small step budget: prompts are chunked, rows admitted while others decode
    take blocks that earlier rows kept, generated tokens' blocks included."""
    m, tok = load(name)
    ps = prompts(m.cfg.n_vocab)
    requests = [request(rid, p) for rid, p in ps.items()]
    requests.append(request("turn2", ps["a"] + [7] * 8 + [9] * 10))   # a's conversation, one turn on
    want = run(BatchEngine(m, tok, 2, 128, step_tokens=7, prefix_cache_bytes=0), requests)
    engine = BatchEngine(m, tok, 2, 128, step_tokens=7, prefix_cache_bytes=CACHE)
    got = run(engine, requests)
    for r in requests:
        assert_same(got[r.id], want[r.id], (name, r.id))
        assert want[r.id].prefix_hit == 0
    hits = sum(r.prefix_hit for r in got.values())
    if name in ATTENTION_ONLY:
        assert hits > 0 and engine.scheduler.cache_prefixes
    else:   # the hybrid's recurrent state cannot be rebuilt from KV blocks: its blocks are never named
        assert hits == 0 and not engine.scheduler.cache_prefixes
        assert not any(b.digest for b in engine.scheduler.blocks.blocks)
    assert engine.idle and engine.scheduler.slots.n_free == 2
    assert all(b.refs == 0 for b in engine.scheduler.blocks.blocks)   # every row gave its blocks back


@pytest.mark.parametrize("name", ATTENTION_ONLY)
def test_a_later_prompt_reuses_whole_blocks_and_recomputes_at_least_its_last_token(name):
    m, tok = load(name)
    ps = prompts(m.cfg.n_vocab)
    engine = BatchEngine(m, tok, 1, 128, prefix_cache_bytes=CACHE)
    first = run(engine, [request("a", ps["a"])])["a"]
    assert first.prefix_hit == 0
    expected = {"b": 32,                          # 40 shared tokens: two whole blocks
                "same": 48,                       # 49 tokens: all but the last, in whole blocks
                "mid": 16,                        # diverges in the second block
                "aligned": 16,                    # 32 tokens, the last recomputed: one block
                "none": 0, "short": 0}
    for rid, hit in expected.items():
        assert run(engine, [request(rid, ps[rid])])[rid].prefix_hit == hit, (name, rid)
    # The first request's reply was kept too: the next turn of its conversation starts past it.
    turn2 = ps["a"] + first.tokens + [9] * 20
    assert run(engine, [request("turn2", turn2)])["turn2"].prefix_hit == (len(ps["a"]) + 5) // BLOCK_SIZE * BLOCK_SIZE


@pytest.mark.parametrize("name", ATTENTION_ONLY)
def test_reused_prefix_gives_the_logits_of_the_whole_prompt_run_alone(name):
    m, tok = load(name)
    ps = prompts(m.cfg.n_vocab)
    engine = BatchEngine(m, tok, 2, 128, EXACT_KV, prefix_cache_bytes=CACHE)
    run(engine, [request("a", ps["a"], n_predict=1)])
    row_logits = {}
    original = engine.runner._sample

    def capture(work, logits):
        for w, row_l in zip(work, np.asarray(logits)):
            row_logits[w.row.request.id] = row_l.copy()
        return original(work, logits)

    engine.runner._sample = capture
    got = run(engine, [request("b", ps["b"], n_predict=1), request("same", ps["same"], n_predict=1)])
    assert got["b"].prefix_hit == 32 and got["same"].prefix_hit == 48
    for rid in ("b", "same"):
        alone = m.forward_seq(m.new_context(128, *EXACT_KV), np.array(ps[rid], np.int32))[0]
        assert np.abs(row_logits[rid] - alone).max() / np.abs(alone).max() < 1e-5, (name, rid)


def test_sampled_rows_are_the_same_with_and_without_the_cache():
    m, tok = load("tiny-llama")
    ps = prompts(m.cfg.n_vocab)
    requests = [request(rid, p, n_predict=10, n_logprobs=0, temp=1.0, seed=i) for i, (rid, p) in enumerate(ps.items())]
    want = run(BatchEngine(m, tok, 3, 128, step_tokens=9, prefix_cache_bytes=0), requests)
    got = run(BatchEngine(m, tok, 3, 128, step_tokens=9, prefix_cache_bytes=CACHE), requests)
    assert {k: r.tokens for k, r in got.items()} == {k: r.tokens for k, r in want.items()}
    assert sum(r.prefix_hit for r in got.values()) > 0
    assert len({tuple(r.tokens) for r in got.values()}) > 1   # the rows really sampled


def test_a_pool_of_one_context_runs_every_row_and_keeps_what_fits(monkeypatch):
    """The smallest pool (one context's blocks, for 2 slots): rows wait or are preempted for blocks,
    and the named blocks left over are still hit after another row has taken unnamed ones."""
    m, tok = load("tiny-llama")
    ps = prompts(m.cfg.n_vocab)
    monkeypatch.setattr(memory, "host_available", lambda: 0)
    engine = BatchEngine(m, tok, 2, 128, prefix_cache_bytes=CACHE)
    assert len(engine.scheduler.blocks.blocks) == 128 // BLOCK_SIZE
    want = run(BatchEngine(m, tok, 2, 128, prefix_cache_bytes=0), [request("a", ps["a"]), request("b", ps["b"])])
    got = run(engine, [request("a", ps["a"]), request("b", ps["b"])])
    for rid in ("a", "b"):
        assert_same(got[rid], want[rid], rid)
    run(engine, [request("x", [5] * 12, n_predict=1)])   # takes a block no prompt can hit first
    again = run(engine, [request("same", ps["same"])])["same"]
    assert again.prefix_hit == 48
    assert_same(again, run(BatchEngine(m, tok, 1, 128, prefix_cache_bytes=0), [request("same", ps["same"])])["same"],
                "same")


def test_batch_results_report_the_cached_tokens():
    m, tok = load("tiny-llama")
    ps = prompts(m.cfg.n_vocab)
    engine = BatchEngine(m, tok, 1, 128, prefix_cache_bytes=CACHE)
    results = run(engine, [request("a", ps["a"]), request("same", ps["same"])])
    assert results["a"].as_dict()["timings"]["cache_n"] == 0
    assert results["same"].as_dict()["timings"]["cache_n"] == 48
    # The prompt's time runs from the step that took it up, for a row that starts past a prefix too.
    assert 0 < results["same"].timings.prompt_ms < results["a"].timings.prompt_ms + 1000


def test_copy_block_copies_the_head_of_a_paged_block():
    m, _ = load("tiny-llama")
    cache = m.new_cache(1, 32, n_blocks=4, block_size=16)
    cache.block_tables[0, :2] = [2, 0]
    m.forward(cache, Batch.run(np.arange(3, 23, dtype=np.int32), 0, 0, [19]))
    cache.copy_block(3, 2, 6)
    for kv in cache.kv:
        assert np.array_equal(kv.k[3, :, :6], kv.k[2, :, :6]) and np.array_equal(kv.v[3, :, :6], kv.v[2, :, :6])
        assert kv.k[2, :, :16].any() and not kv.k[3, :, 6:].any() and not kv.k[1].any()


def test_llogos_batch_reuses_a_shared_instruction_and_says_how_much(env, tmp_path):
    instruction = "Translate the following sentence into French, keeping its tone and its punctuation: "
    lines = [json.dumps({"id": i, "prompt": instruction + s}) for i, s in enumerate(["Hello.", "Good night!", "Yes?"])]
    r = llogos(env, "batch", "-m", str(need(FIXTURES / "tiny-llama-f32.gguf")), "--temp", "0", "-n", "3", "-np", "1",
               stdin="\n".join(lines) + "\n")
    assert r.returncode == 0, r.stderr
    hits = {rec["id"]: rec["timings"]["cache_n"] for rec in map(json.loads, r.stdout.splitlines())}
    assert hits[0] == 0 and hits[1] > 0 and hits[2] > 0
    assert re.search(rf"prefix cache: {hits[1] + hits[2]} of \d+ prompt tokens reused \(\d+%\)", r.stderr)


def test_the_cuda_backend_reuses_prefixes_the_same_way(monkeypatch):
    """The pool and the slots in the CUDA backend's packed layout (f16 rows), decode through its
    captured-graph decoder, its kernels run by the CPU emulator."""
    monkeypatch.setattr(memory, "gpu_available", lambda: 1 << 30)
    f = GGUFFile(need(FIXTURES / "tiny-llama-q8_0.gguf"))
    m, tok = Model(f, CudaBackend(EmuKernels())), Tokenizer.from_gguf(f)
    ps = prompts(m.cfg.n_vocab)
    order = ("a", "none", "same", "b")   # "none" overwrites the slot that "a" left its KV in
    requests = [request(rid, ps[rid], n_predict=3, n_logprobs=0) for rid in order]
    want = run(BatchEngine(m, tok, 1, 64, ("f16", "f16"), prefix_cache_bytes=0), requests)
    got = run(BatchEngine(m, tok, 1, 64, ("f16", "f16"), prefix_cache_bytes=CACHE), requests)
    assert {k: r.tokens for k, r in got.items()} == {k: r.tokens for k, r in want.items()}
    assert [got[rid].prefix_hit for rid in order] == [0, 0, 48, 32]


def test_the_pool_holds_the_slots_and_cache_ram_within_half_the_free_memory_and_one_context_at_least(monkeypatch):
    m, _ = load("tiny-llama")
    per_position = memory.kv_bytes_per_position(m.cfg, "cpu", "f16", "f16")   # the default cache
    assert per_position == sum(kv.k[0, :, 0].nbytes + kv.v[0, :, 0].nbytes for kv in m.new_cache(1, 1).kv)
    per_block = BLOCK_SIZE * per_position
    row = 128 // BLOCK_SIZE

    def blocks(available, cache_blocks):
        monkeypatch.setattr(memory, "host_available", lambda: available * per_block)
        return memory.kv_pool_blocks(m.cfg, "cpu", "f16", "f16", BLOCK_SIZE, 4, 128, cache_blocks * per_block)

    assert blocks(1000, 5) == 4 * row + 5        # every slot full, and 5 blocks of --cache-ram
    assert blocks(1000, 0) == 4 * row
    assert blocks(20, 5) == 10                   # half of what is free
    assert blocks(2, 5) == row                   # one context, whatever is free


@pytest.mark.parametrize("name", NEW_FAMILIES)
def test_the_other_families_reuse_prefixes_with_the_same_results(name):
    f = GGUFFile(need(OWN_FIXTURES / f"{name}-f32.gguf"))
    m, tok = Model(f, NumpyBackend()), Tokenizer.from_gguf(f)
    ps = prompts(m.cfg.n_vocab)
    requests = [request(rid, ps[rid]) for rid in ("a", "none", "same", "b", "mid")]
    want = run(BatchEngine(m, tok, 1, 128, prefix_cache_bytes=0), requests)
    got = run(BatchEngine(m, tok, 1, 128, prefix_cache_bytes=CACHE), requests)
    for r in requests:
        assert_same(got[r.id], want[r.id], (name, r.id))
    hits = [got[rid].prefix_hit for rid in ("a", "none", "same", "b", "mid")]
    assert hits == ([0] * 5 if any(m.cfg.recurrent) else [0, 0, 48, 32, 16])   # lfm2's short convolutions: none


def test_the_cuda_backend_continues_a_parked_slot(monkeypatch):
    """A parked row continued to the token, and a named block's head copied, in the CUDA layout."""
    monkeypatch.setattr(memory, "gpu_available", lambda: 1 << 30)
    f = GGUFFile(need(FIXTURES / "tiny-llama-q8_0.gguf"))
    m, tok = Model(f, CudaBackend(EmuKernels())), Tokenizer.from_gguf(f)
    ps = prompts(m.cfg.n_vocab)
    first = request("a", ps["a"], n_predict=3, n_logprobs=0)
    engine = BatchEngine(m, tok, 1, 64, ("f16", "f16"), prefix_cache_bytes=CACHE, keep_slots=True)
    reply = run(engine, [first])["a"].tokens
    later = [request("on", ps["a"] + reply + ps["b"][:5], n_predict=3, n_logprobs=0),
             request("part", ps["a"][:21] + ps["b"][:4], n_predict=3, n_logprobs=0)]
    want = run(BatchEngine(m, tok, 1, 64, ("f16", "f16"), prefix_cache_bytes=0), later)
    got = {}
    for r in later:
        got.update(run(engine, [r]))
    assert {k: r.tokens for k, r in got.items()} == {k: r.tokens for k, r in want.items()}
    assert got["on"].prefix_hit == len(ps["a"]) + len(reply) - 1 and got["part"].prefix_hit == 21
