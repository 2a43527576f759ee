"""A draft model (-md): one of the target's vocabulary drafts until it is unsure (--draft-p-min) and
leaves the output as it is without it, in generate and for many rows at once: a batch's rows and a
server's slots, each in its slot of the draft model's cache."""

import json

import numpy as np
import pytest

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.draft_model import DraftModel, check_vocabulary
from llogos_cli.engine.sampling import SamplingParams
from llogos_cli.engine.speculation import SpecParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.forward import Model
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.conftest import EXACT_KV, FIXTURES, need
from tests.test_cli import assert_one_line_error, env, llogos  # noqa: F401  (env is a fixture)
from tests.test_prefix_reuse import OWN_FIXTURES
from tests.test_speculation import assert_same_logprobs, generate, load, repetitive_prompt

TARGET, DRAFT = FIXTURES / "tiny-llama-f32.gguf", FIXTURES / "tiny-llama-q8_0.gguf"


def varied_prompts(n_vocab: int, n: int) -> list[list[int]]:
    rng = np.random.default_rng(11)
    return [rng.integers(3, n_vocab, 4 + i).tolist() * 3 for i in range(n)]


def test_rows_of_a_batch_draft_each_in_their_slot_and_equal_the_engine_without():
    """More requests than slots, so a slot's draft cache is reused by the next request; greedy and
    seeded rows mixed."""
    m, tok = load("tiny-llama")
    draft = Model(GGUFFile(need(DRAFT)), NumpyBackend(batched=True))
    requests = [Request(i, p, SamplingParams(temp=0.0) if i % 2 else SamplingParams(temp=0.8, seed=i),
                        StopCriteria(30, ignore_eos=True)) for i, p in enumerate(varied_prompts(m.cfg.n_vocab, 5))]

    def run(speculation, draft_model=None):
        engine = BatchEngine(m, tok, 3, 128, step_tokens=16, speculation=speculation, draft_model=draft_model)
        return {r.id: r for r in engine.generate(requests)}
    want = run(SpecParams())
    got = run(SpecParams(spec_draft_model=str(DRAFT), draft_max=4, draft_p_min=0.0), draft)
    assert {i: r.tokens for i, r in got.items()} == {i: r.tokens for i, r in want.items()}
    assert sum(r.timings.draft_n_accepted for r in got.values()) > 0


def test_llogos_batch_with_a_draft_model_writes_what_it_writes_without(env, tmp_path):
    lines = "".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(varied_prompts(512, 4)))
    args = ["batch", "-m", str(need(TARGET)), "-np", "2", "-n", "24", "--temp", "0", "--ignore-eos"]
    plain = llogos(env, *args, stdin=lines)
    drafted = llogos(env, *args, "-md", str(need(DRAFT)), "--draft-p-min", "0", stdin=lines)
    assert plain.returncode == 0 and drafted.returncode == 0, drafted.stderr

    def by_id(out):
        return {r["id"]: r for r in map(json.loads, out.splitlines())}
    want, got = by_id(plain.stdout), by_id(drafted.stdout)
    assert {i: r["tokens"] for i, r in got.items()} == {i: r["tokens"] for i, r in want.items()}
    assert sum(r["timings"].get("draft_n_accepted", 0) for r in got.values()) > 0
    assert_one_line_error(llogos(env, *args, "-md", str(need(FIXTURES / "tiny-llama-f32.gguf")) + ".missing",
                                 stdin=lines), "missing")


def test_the_server_drafts_with_a_draft_model_per_slot(env, tmp_path):
    pytest.importorskip("fastapi")
    from concurrent.futures import ThreadPoolExecutor

    from tests.test_server import Server
    prompts = varied_prompts(512, 3)
    server = Server(env, tmp_path / "log", "-m", str(need(TARGET)), "-np", "2", "-c", "256",
                    "-md", str(need(DRAFT)), "--draft-p-min", "0")
    try:
        bodies = [{"prompt": p, "max_tokens": 30, "temperature": 0, "ignore_eos": True} for p in prompts]
        with ThreadPoolExecutor(3) as pool:
            texts = list(pool.map(lambda b: server.post("/v1/completions", b).json()["choices"][0]["text"], bodies))
        metrics = server.metrics()
    finally:
        server.stop()
    for p, text in zip(prompts, texts):
        plain = llogos(env, "generate", "-m", str(need(TARGET)), "--tokens", ",".join(map(str, p)), "-n", "30",
                       "--temp", "0", "--ignore-eos")
        assert text == plain.stdout
    assert metrics["llogos_draft_tokens_total"] >= metrics["llogos_draft_tokens_accepted_total"] > 0


def test_a_draft_model_of_the_same_vocabulary_drafts_and_leaves_the_output_as_it_is():
    m, tok = load("tiny-llama")
    draft = Model(GGUFFile(need(FIXTURES / "tiny-llama-q8_0.gguf")), NumpyBackend())
    prompt = repetitive_prompt(m.cfg.n_vocab)
    want, _ = generate(m, tok, prompt, n_logprobs=3)
    params = SpecParams(spec_draft_model="tiny-llama-q8_0", draft_max=4, draft_p_min=0.0)
    engine = BatchEngine(m, tok, 1, 256, EXACT_KV, prefix_cache_bytes=0, speculation=params, draft_model=draft)
    request = Request(0, prompt, SamplingParams(temp=0.0), StopCriteria(60, ignore_eos=True), 3)
    got = next(iter(engine.generate([request])))
    assert got.tokens == want.tokens
    assert_same_logprobs(got, want)
    assert got.timings.draft_n_accepted > 0   # the quantized copy agrees with its original most of the time


def test_a_draft_model_stops_below_draft_p_min():
    m, tok = load("tiny-llama")
    prompt = repetitive_prompt(m.cfg.n_vocab)
    sure, unsure = (SpecParams(spec_draft_model="tiny-llama", draft_max=4, draft_p_min=p) for p in (0.0, 1.0))
    assert DraftModel(sure, m, 1, 256).draft(_decoding_row(m, tok, prompt)) != []
    assert DraftModel(unsure, m, 1, 256).draft(_decoding_row(m, tok, prompt)) == []   # no token of it is certain


def _decoding_row(m, tok, prompt):
    engine = BatchEngine(m, tok, 1, 256, prefix_cache_bytes=0)
    engine.add(Request(0, prompt, SamplingParams(temp=0.0), StopCriteria(20, ignore_eos=True)))
    engine.step()
    return engine.scheduler.running[0]


def test_a_draft_model_must_share_the_vocabulary():
    _, tok = load("tiny-llama")
    other = Tokenizer.from_gguf(GGUFFile(need(OWN_FIXTURES / "vocab-o200k.gguf")))
    check_vocabulary(tok, tok)
    with pytest.raises(LlogosError, match="vocabulary"):
        check_vocabulary(tok, other)
    with pytest.raises(LlogosError, match="either --spec-type or a draft model"):
        SpecParams("ngram-simple", spec_draft_model="x")


def test_generate_with_a_draft_model(env):
    args = ["generate", "-m", str(need(FIXTURES / "tiny-llama-f32.gguf")), "--tokens",
            ",".join(map(str, repetitive_prompt(512))), "-n", "40", "--temp", "0", "--ignore-eos"]
    plain = llogos(env, *args)
    drafted = llogos(env, *args, "-md", str(need(FIXTURES / "tiny-llama-q8_0.gguf")), "--draft-p-min", "0", "--stats")
    assert drafted.returncode == 0, drafted.stderr
    assert drafted.stdout == plain.stdout and "draft acceptance" in drafted.stderr
