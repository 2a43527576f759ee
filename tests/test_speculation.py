"""Speculative decoding: drafted tokens checked in one forward pass leave every output as it is
without them (greedy token for token, sampled from the same distribution), and the KV of rejected
drafts never reaches a later token."""

import json
import re

import numpy as np
import pytest

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.backends.cuda.cuda_backend import CudaBackend
from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.prefix_cache import BlockManager
from llogos_cli.engine.sampling import Sampler, SamplingParams
from llogos_cli.engine.scheduler import Scheduler
from llogos_cli.engine.speculation import SpecParams, Speculator, ngram_simple, verified
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model import memory
from llogos_cli.model.forward import Model
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.conftest import EXACT_KV, FIXTURES, need
from tests.emu.emulator import EmuKernels
from tests.test_batch import FAMILIES
from tests.test_cli import assert_one_line_error, env, llogos  # noqa: F401  (env is a fixture)
from tests.test_prefix_reuse import NEW_FAMILIES, OWN_FIXTURES

EVERY_FAMILY = FAMILIES + NEW_FAMILIES + ["tiny-gpt-oss", "tiny-qwen2moe"]
NGRAM = SpecParams("ngram-simple", spec_ngram_simple_size_n=1, spec_ngram_simple_size_m=8, draft_max=8)


def load(name: str) -> tuple[Model, Tokenizer]:
    shared = FIXTURES / f"{name}-f32.gguf"
    f = GGUFFile(shared if shared.exists() else need(OWN_FIXTURES / f"{name}-f32.gguf"))
    return Model(f, NumpyBackend(batched=True)), Tokenizer.from_gguf(f)


def repetitive_prompt(n_vocab: int) -> list[int]:
    motif = np.random.default_rng(0).integers(3, n_vocab, 10).tolist()
    return motif * 4


def generate(m, tok, prompt, speculation=SpecParams(), n=60, n_logprobs=0, speculator=None, **sampling):
    # verifying a draft is another route to the same tokens than one at a time: float32 caches
    engine = BatchEngine(m, tok, 1, 256, EXACT_KV, prefix_cache_bytes=0, speculation=speculation)
    if speculator is not None:
        engine.speculator = speculator
    params = SamplingParams(**({"temp": 0.0} | sampling))
    request = Request(0, prompt, params, StopCriteria(n, ignore_eos=True), n_logprobs)
    return next(iter(engine.generate([request]))), engine


class Replay(Speculator):
    """Drafts what a run without speculation wrote next, every other draft wrong from its third
    token on: drafts that hold, and drafts rejected part way, whatever the model."""

    def __init__(self, written: list[int], n_vocab: int):
        super().__init__(SpecParams("ngram-simple", draft_max=5))
        self.written, self.n_vocab, self.n_drafts = written, n_vocab, 0

    def draft(self, row) -> list[int]:
        n = len(row.completion.generated)
        draft = self.written[n:n + 5]
        self.n_drafts += 1
        if self.n_drafts % 2 and len(draft) > 2:
            draft[2:] = [(t + 1) % self.n_vocab for t in draft[2:]]
        return draft


def assert_same_logprobs(got, want):
    for mine, theirs in zip(got.logprobs, want.logprobs):
        assert [i for i, _ in mine] == [i for i, _ in theirs]
        assert np.allclose([lp for _, lp in mine], [lp for _, lp in theirs], atol=1e-4)


@pytest.mark.parametrize("name", EVERY_FAMILY)
def test_greedy_output_is_the_same_with_and_without_speculation(name):
    m, tok = load(name)
    prompt = repetitive_prompt(m.cfg.n_vocab)
    want, _ = generate(m, tok, prompt, n_logprobs=3)
    ngram, engine = generate(m, tok, prompt, NGRAM)
    assert ngram.tokens == want.tokens
    if any(m.cfg.recurrent):   # no rollback of a recurrent state: the engine runs without speculation
        assert engine.speculator is None and ngram.timings.draft_n == 0
        return
    assert ngram.timings.draft_n > 0
    replayed, _ = generate(m, tok, prompt, n_logprobs=3, speculator=Replay(want.tokens, m.cfg.n_vocab))
    assert replayed.tokens == want.tokens
    assert 0 < replayed.timings.draft_n_accepted < replayed.timings.draft_n
    assert_same_logprobs(replayed, want)   # the rejected drafts' KV reaches no later token


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_ngram_drafts_from_a_repeating_output_are_accepted(name):
    m, tok = load(name)
    got, _ = generate(m, tok, repetitive_prompt(m.cfg.n_vocab), NGRAM, n=100)
    assert got.timings.draft_n_accepted > 0
    assert got.as_dict()["timings"]["draft_n"] == got.timings.draft_n


def test_sampled_output_with_a_seed_is_the_same_with_and_without_speculation():
    """Each position's token is the row's own draw from the target's distribution, penalties and
    all; a drafted token is kept exactly when the draw is it."""
    m, tok = load("tiny-qwen2")
    prompt = repetitive_prompt(m.cfg.n_vocab)
    for sampling in ({"temp": 0.7, "seed": 3}, {"temp": 0.7, "seed": 4, "repeat_penalty": 1.3, "top_k": 5}):
        want, _ = generate(m, tok, prompt, n=80, n_logprobs=2, **sampling)
        replayed, _ = generate(m, tok, prompt, n=80, n_logprobs=2, speculator=Replay(want.tokens, m.cfg.n_vocab),
                               **sampling)
        assert replayed.tokens == want.tokens
        assert replayed.timings.draft_n_accepted > 0
        assert_same_logprobs(replayed, want)


def test_a_drafted_token_is_kept_with_its_probability_and_otherwise_the_rest_renormalized():
    """The rule for a deterministic draft d against a known target p: d kept with probability p(d),
    and the token written when it is not distributed as p without d, renormalized (chi-square, a
    fixed seed, a generous bound)."""
    p = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    sampler = Sampler(SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11), 64)
    logits = np.log(p).astype(np.float32)
    drafted, n = 1, 20000
    first = np.array([next(verified((drafted,), lambda i: (sampler.sample(logits), None)))[0] for _ in range(n)])
    kept = (first == drafted).mean()
    assert abs(kept - p[drafted]) < 4 * np.sqrt(p[drafted] * (1 - p[drafted]) / n)
    others = first[first != drafted]
    residual = np.delete(p, drafted) / (1 - p[drafted])
    observed = np.bincount(others, minlength=len(p))[np.arange(len(p)) != drafted]
    expected = residual * len(others)
    assert ((observed - expected) ** 2 / expected).sum() < 20.5   # chi-square, 4 degrees of freedom: p < 0.0005


def test_a_verification_writes_the_draft_then_the_first_token_the_model_chose_otherwise():
    chosen = [5, 6, 9, 1]
    assert [t for t, _ in verified((5, 6, 7), lambda i: (chosen[i], None))] == [5, 6, 9]
    assert [t for t, _ in verified((5, 6, 9), lambda i: (chosen[i], None))] == [5, 6, 9, 1]
    assert [t for t, _ in verified((), lambda i: (chosen[i], None))] == [5]


def test_ngram_simple_drafts_what_followed_the_last_occurrence_as_llama_cpp_does():
    seq = [1, 2, 3, 4, 5, 6, 7, 2, 3, 8, 9, 2, 3]
    assert ngram_simple(seq, 2, 3) == [8, 9, 2]      # the most recent earlier "2 3", not the first
    assert ngram_simple(seq, 2, 9) == []              # not longer than n + m + 1 before the last token
    assert ngram_simple(seq[:-1] + [7], 2, 3) == []   # "3 7" never came before
    assert ngram_simple([2, 3, 4, 5, 6, 7, 1, 8, 9, 2, 3], 2, 3) == []   # the first token starts no match
    assert ngram_simple([1, 2, 3, 4, 5, 6, 7, 1, 8, 9, 2, 3], 2, 3) == [4, 5, 6]
    # only the most recent match counts, here too close to the current tokens to copy n after it
    assert ngram_simple([5, 1, 2, 1, 2, 1, 2, 1, 2], 2, 2) == []


def test_a_draft_takes_only_free_blocks_and_the_budget_left():
    class Row:
        def __init__(self):
            self.tokens, self.n_cached, self.blocks, self.slot = list(range(31)), 30, [], -1
    blocks = BlockManager(3, block_size=16)
    scheduler = Scheduler(1, 8, blocks)
    row = Row()
    row.blocks, row.slot = blocks.take(2), scheduler.slots.take()
    scheduler.running.append(row)
    work = scheduler.schedule({row: list(range(100, 140))})
    assert work[0].draft == tuple(range(100, 107))   # the step's 8 tokens: the row's last and 7 drafted
    assert len(row.blocks) == 3 and blocks.n_free == 0
    row.blocks = row.blocks[:2]
    scheduler.step_tokens = 64
    assert scheduler.schedule({row: list(range(100, 140))})[0].draft == (100,)   # room left in its blocks


def test_a_parked_row_continued_after_speculation_equals_a_fresh_run():
    m, tok = load("tiny-llama")
    prompt = repetitive_prompt(m.cfg.n_vocab)
    engine = BatchEngine(m, tok, 1, 256, EXACT_KV, prefix_cache_bytes=1 << 20, keep_slots=True, speculation=NGRAM)
    first = next(iter(engine.generate([Request("a", prompt, SamplingParams(temp=0.0),
                                               StopCriteria(50, ignore_eos=True))])))
    assert first.timings.draft_n_accepted > 0
    later = Request("b", prompt + first.tokens + prompt[:7], SamplingParams(temp=0.0),
                    StopCriteria(30, ignore_eos=True), 3)
    got = next(iter(engine.generate([later])))
    want, _ = generate(m, tok, later.prompt, n=30, n_logprobs=3)
    assert got.prefix_hit > len(prompt) and got.tokens == want.tokens
    assert_same_logprobs(got, want)


def test_bad_speculation_flags_are_refused():
    with pytest.raises(LlogosError, match="--draft-min"):
        SpecParams("ngram-simple", draft_max=2, draft_min=3)


def test_generate_with_speculation_prints_the_same_text_and_the_acceptance(env):
    gguf = str(need(FIXTURES / "tiny-llama-f32.gguf"))
    args = ["generate", "-m", gguf, "--tokens", ",".join(map(str, repetitive_prompt(512))), "-n", "60", "--temp", "0",
            "--ignore-eos"]
    plain = llogos(env, *args)
    spec = llogos(env, *args, "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1",
                  "--spec-ngram-simple-size-m", "8", "--stats")
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout
    accepted, drafted = map(int, re.search(r"draft acceptance = +[\d.]+ \((\d+) accepted / (\d+) generated\)",
                                           spec.stderr).groups())
    assert 0 < accepted <= drafted
    as_json = llogos(env, *args, "--json", "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1")
    timings = json.loads(as_json.stdout.splitlines()[-1])["timings"]
    assert timings["draft_n"] >= timings["draft_n_accepted"] > 0
    assert_one_line_error(llogos(env, *args, "--spec-type", "ngram-simple", "--draft-max", "2", "--draft-min", "3"),
                          "--draft-min")


def test_the_cuda_backend_runs_the_speculative_step(monkeypatch):
    """Steps without drafts replayed from CUDA graphs, verification passes run as small prompts,
    in the CUDA backend's layout (f16 KV), its kernels run by the CPU emulator."""
    monkeypatch.setattr(memory, "gpu_available", lambda: 1 << 30)
    f = GGUFFile(need(FIXTURES / "tiny-llama-q8_0.gguf"))
    m, tok = Model(f, CudaBackend(EmuKernels())), Tokenizer.from_gguf(f)
    prompt = repetitive_prompt(m.cfg.n_vocab)

    def run(speculation):
        engine = BatchEngine(m, tok, 1, 128, ("f16", "f16"), prefix_cache_bytes=0, speculation=speculation)
        return next(iter(engine.generate([Request(0, prompt, SamplingParams(temp=0.0),
                                                  StopCriteria(40, ignore_eos=True))])))
    want, got = run(SpecParams()), run(NGRAM)
    assert got.tokens == want.tokens and got.timings.draft_n_accepted > 0


def test_the_server_speculates_per_slot_and_counts_the_drafts(env, tmp_path):
    pytest.importorskip("fastapi")
    from tests.test_server import Server
    gguf = str(need(FIXTURES / "tiny-llama-f32.gguf"))
    body = {"prompt": repetitive_prompt(512), "max_tokens": 60, "temperature": 0, "ignore_eos": True}
    server = Server(env, tmp_path / "log", "-m", gguf, "-np", "2", "-c", "256", "--spec-type", "ngram-simple",
                    "--spec-ngram-simple-size-n", "1")
    try:
        texts = [server.post("/v1/completions", body).json()["choices"][0]["text"] for _ in range(2)]
        metrics = server.metrics()
    finally:
        server.stop()
    plain = llogos(env, "generate", "-m", gguf, "--tokens", ",".join(map(str, body["prompt"])), "-n", "60",
                   "--temp", "0", "--ignore-eos")
    assert texts == [plain.stdout] * 2
    assert metrics["llogos_draft_tokens_total"] >= metrics["llogos_draft_tokens_accepted_total"] > 0


def test_rows_of_a_batch_speculate_each_and_equal_the_engine_without():
    """More requests than slots and a step budget that cuts drafts short: prompts chunked beside
    rows verifying drafts, greedy and sampled rows mixed."""
    m, tok = load("tiny-qwen2")
    rng = np.random.default_rng(7)
    requests = []
    for i in range(5):
        motif = rng.integers(3, m.cfg.n_vocab, 6).tolist()
        sampling = SamplingParams(temp=0.0) if i % 2 else SamplingParams(temp=0.8, seed=i)
        requests.append(Request(i, motif * 3, sampling, StopCriteria(40, ignore_eos=True), 2 if i % 3 else 0))

    def run(speculation):
        engine = BatchEngine(m, tok, 3, 128, step_tokens=9, speculation=speculation)
        return {r.id: r for r in engine.generate(requests)}
    want, got = run(SpecParams()), run(NGRAM)
    for rid in want:
        assert got[rid].tokens == want[rid].tokens, rid
        if rid % 3:
            assert_same_logprobs(got[rid], want[rid])
    assert sum(r.timings.draft_n_accepted for r in got.values()) > 0


def test_a_constrained_row_checks_its_draft_under_its_grammar():
    """A grammar's mask after a drafted token depends on that token: the row chooses on the host,
    position by position, the grammar fed each kept token first; drafts it forbids are rejected."""
    from llogos_cli.engine.grammar import Grammar
    m, tok = load("tiny-llama")
    grammar = Grammar.json_schema({"type": "array", "items": {"type": "integer"}, "maxItems": 6})
    prompt = tok.encode("x")

    def run(speculator=None):
        engine = BatchEngine(m, tok, 1, 256, prefix_cache_bytes=0)
        engine.speculator = speculator
        request = Request(0, prompt, SamplingParams(temp=0.0), StopCriteria(60), grammar=grammar)
        return next(iter(engine.generate([request])))
    want = run()
    got = run(Replay(want.tokens, m.cfg.n_vocab))
    assert got.tokens == want.tokens and got.text == want.text
    assert 0 < got.timings.draft_n_accepted < got.timings.draft_n
