"""ngram-cache's lookup cache files (-lcs static, -lcd dynamic; engine/ngram_cache.py): llama.cpp's
layout read and written byte for byte, bad files refused in one line, llama.cpp's drafting order
(the row's cache, the dynamic one with strict thresholds, the static one), and output unchanged."""

import struct

import numpy as np
import pytest

from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.ngram_cache import NgramCache, count, encode, load, save
from llogos_cli.engine.sampling import SamplingParams
from llogos_cli.engine.speculation import Drafting, SpecParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.errors import LlogosError
from tests.conftest import FIXTURES, lazy_import, need
from tests.test_cli import assert_one_line_error, env, llogos  # noqa: F401  (env is a fixture)
from tests.test_speculation import load as load_model


def record(gram, pairs) -> bytes:
    """One record as llama.cpp's common_ngram_cache_save writes it: 4 int32 n-gram slots (-1 unused),
    an int32 count of pairs, then (token, count) int32 pairs, little-endian."""
    slots = list(gram) + [-1] * (4 - len(gram))
    return struct.pack(f"<4ii{2 * len(pairs)}i", *slots, len(pairs), *[x for pair in pairs for x in pair])


class Row:
    def __init__(self, tokens):
        self.tokens, self.drafting = tokens, Drafting()


def test_a_hand_built_file_is_read_and_the_same_counts_written_back_as_the_same_bytes(tmp_path):
    data = record((5, 6), [(7, 3), (8, 1)]) + record((9,), [(10, 2)]) + record((1, 2, 3, 4), [(0, 1)])
    (tmp_path / "c.bin").write_bytes(data)
    cache = load(str(tmp_path / "c.bin"))
    assert cache == {(5, 6): {7: 3, 8: 1}, (9,): {10: 2}, (1, 2, 3, 4): {0: 1}}
    # records sorted by n-gram, pairs by token: the order chosen here (llama.cpp's is its hash map's)
    assert encode(cache) == record((1, 2, 3, 4), [(0, 1)]) + record((5, 6), [(7, 3), (8, 1)]) + record((9,), [(10, 2)])


def test_a_record_named_twice_keeps_the_first_as_llama_cpp_does(tmp_path):
    (tmp_path / "c.bin").write_bytes(record((5, 6), [(7, 3), (7, 9)]) + record((5, 6), [(1, 1)]))
    assert load(str(tmp_path / "c.bin")) == {(5, 6): {7: 3}}


def test_counts_saved_and_loaded_are_the_same_counts(tmp_path):
    tokens = np.random.default_rng(1).integers(0, 50, 3000).tolist()
    counts = count(tokens)
    save(counts, str(tmp_path / "d.bin"))
    assert load(str(tmp_path / "d.bin")) == counts
    assert encode(load(str(tmp_path / "d.bin"))) == (tmp_path / "d.bin").read_bytes()
    assert not (tmp_path / "d.bin.part").exists()
    # every n-gram of 1 to 4 tokens: a token at i follows the n-grams ending at i - 1
    assert sum(sum(c.values()) for c in counts.values()) == sum(len(tokens) - n for n in (1, 2, 3, 4))
    assert count([3, 4, 3, 4, 3], (2,)) == {(3, 4): {3: 2}, (4, 3): {4: 1}}


GOOD = record((5, 6), [(7, 3), (8, 1)])


@pytest.mark.parametrize("data,why", [
    (GOOD[:-4], "cut short"),                    # a pair's count missing
    (GOOD[:10], "cut short"),                    # inside the n-gram
    (GOOD + b"\x01\x02", "ends inside a record"),
    (record((5, 6), []), "0 following tokens"),
    (GOOD[:16] + struct.pack("<i", -3) + GOOD[20:], "-3 following tokens"),
    (GOOD + record((1,), [(2, 0)]), "counts token 2 0 times"),
    (record((1,), [(2, -1)]), "counts token 2 -1 times"),
])
def test_a_corrupt_file_is_refused_with_where_and_why(tmp_path, data, why):
    (tmp_path / "bad.bin").write_bytes(data)
    with pytest.raises(LlogosError, match=why):
        load(str(tmp_path / "bad.bin"))


def test_the_flags_need_ngram_cache_and_a_static_file_that_is_there(tmp_path):
    with pytest.raises(LlogosError, match="--lookup-cache-static needs --spec-type ngram-cache"):
        SpecParams("ngram-simple", lookup_cache_static=str(tmp_path / "x"))
    with pytest.raises(LlogosError, match="--lookup-cache-dynamic needs --spec-type ngram-cache"):
        SpecParams(lookup_cache_dynamic=str(tmp_path / "x"))
    with pytest.raises(LlogosError, match="no such file"):
        SpecParams("ngram-cache", lookup_cache_static=str(tmp_path / "x"))
    # a dynamic file not there yet is an empty cache, made when a row ends
    assert NgramCache(SpecParams("ngram-cache", lookup_cache_dynamic=str(tmp_path / "x"))).dynamic == {}


def test_drafts_come_from_the_row_then_the_dynamic_cache_strictly_then_the_static_one():
    cache = NgramCache(SpecParams("ngram-cache"))
    row = [20, 21, 22, 23, 1, 2]   # nothing in the row repeats: the row's own cache drafts nothing
    assert cache.propose(Row(row), 1) == []
    cache.static = {(1, 2): {7: 1}}
    assert cache.propose(Row(row), 1) == []        # the static cache needs 2 occurrences...
    cache.static = {(1, 2): {7: 1, 8: 1}}
    assert cache.propose(Row(row), 1) == [7]       # ...of which half went one way (the first of equals)
    cache.dynamic = {(23, 1, 2): {9: 1}}
    assert cache.propose(Row(row), 1) == [7]       # strict: a 3-gram needs 2 occurrences in the dynamic cache
    cache.dynamic = {(23, 1, 2): {9: 2}}
    assert cache.propose(Row(row), 1) == [9]       # and then comes before the static cache
    cache.dynamic = {(2,): {9: 3}}
    assert cache.propose(Row(row), 1) == [7]       # a 1-gram needs 4 occurrences...
    cache.dynamic = {(2,): {9: 2, 4: 2}}
    assert cache.propose(Row(row), 1) == [7]       # ...three-quarters of them going one way
    cache.dynamic = {(22, 23, 1, 2): {9: 1, 4: 1}}
    assert cache.propose(Row(row), 1) == [7]       # a 4-gram: 2 occurrences, but not two-thirds one way
    cache.dynamic = {(2,): {9: 3, 4: 1}, (22, 23, 1, 2): {4: 1, 9: 1}}
    assert cache.propose(Row(row), 1) == [9]       # the 1-gram drafts where the 4-gram could not
    # the row's own n-grams come first: "1 2" was followed by 5 twice in the row
    assert cache.propose(Row([1, 2, 5] + row), 1) == [9]
    assert cache.propose(Row([1, 2, 5, 1, 2, 5] + row), 1) == [5]


def test_the_static_counts_weigh_the_row_and_dynamic_candidates():
    cache = NgramCache(SpecParams("ngram-cache"))
    row = [6, 1, 2, 3, 1, 2, 4, 1, 2]   # "1 2" followed by 3 and by 4 once each: 3 came first
    assert cache.propose(Row(row), 1) == [3]
    cache.static = {(1, 2): {4: 1}}       # 4 counts 100 times its static count, 3 once
    assert cache.propose(Row(row), 1) == [4]
    cache.static = {(1, 2): {9: 5}}       # no candidate in the static cache: unweighted
    assert cache.propose(Row(row), 1) == [3]


PROMPT_LEN = 24


def engine_run(m, tok, prompt, speculation, n=40):
    request = Request(0, prompt, SamplingParams(temp=0.0), StopCriteria(n, ignore_eos=True))
    return next(iter(BatchEngine(m, tok, 1, 256, prefix_cache_bytes=0, speculation=speculation).generate([request])))


def test_a_static_cache_of_text_holding_the_continuation_drafts_accepted_tokens_and_output_is_unchanged(tmp_path):
    m, tok = load_model("tiny-llama")
    prompt = np.random.default_rng(5).integers(3, m.cfg.n_vocab, PROMPT_LEN).tolist()
    want = engine_run(m, tok, prompt, SpecParams())
    plain = engine_run(m, tok, prompt, SpecParams("ngram-cache"))
    path = str(tmp_path / "static.bin")
    # a 2-gram seen once does not draft (llama.cpp's threshold): a corpus holding the text twice
    save(count(2 * (prompt + want.tokens), (2,)), path)
    got = engine_run(m, tok, prompt, SpecParams("ngram-cache", lookup_cache_static=path))
    assert plain.tokens == want.tokens and got.tokens == want.tokens
    assert got.timings.draft_n_accepted > plain.timings.draft_n_accepted
    assert got.timings.draft_n_accepted >= len(want.tokens) // 2, got.timings


def test_the_dynamic_file_takes_each_finished_request_and_drafts_in_later_runs(tmp_path):
    m, tok = load_model("tiny-llama")
    prompt = np.random.default_rng(6).integers(3, m.cfg.n_vocab, PROMPT_LEN).tolist()
    want = engine_run(m, tok, prompt, SpecParams())
    path = tmp_path / "dynamic.bin"
    spec = SpecParams("ngram-cache", lookup_cache_dynamic=str(path))
    runs = [engine_run(m, tok, prompt, spec) for _ in range(3)]
    assert all(r.tokens == want.tokens for r in runs)
    once = count(prompt + want.tokens)
    assert load(str(path)) == {key: {t: 3 * n for t, n in c.items()} for key, c in once.items()}
    # the third run read two runs' counts: enough for the strict thresholds everywhere
    assert runs[2].timings.draft_n_accepted > runs[0].timings.draft_n_accepted


@pytest.fixture(scope="module")
def gguf():
    return str(need(FIXTURES / "tiny-llama-f32.gguf"))


def test_the_cli_flags_draft_from_the_files_and_refuse_bad_ones_in_one_line(env, gguf, tmp_path):
    tokens = np.random.default_rng(7).integers(3, 500, PROMPT_LEN).tolist()
    args = ["generate", "-m", gguf, "--tokens", ",".join(map(str, tokens)), "-n", "30", "--temp", "0", "--ignore-eos"]
    plain = llogos(env, *args)
    assert plain.returncode == 0, plain.stderr
    dyn = tmp_path / "dyn.bin"
    spec = llogos(env, *args, "--spec-type", "ngram-cache", "-lcd", str(dyn), "--stats")
    assert spec.returncode == 0 and spec.stdout == plain.stdout, spec.stderr
    assert dyn.stat().st_size > 0 and load(str(dyn))
    static = tmp_path / "static.bin"
    static.write_bytes(dyn.read_bytes())   # any cache file reads as a static one (its 2-grams draft)
    spec = llogos(env, *args, "--spec-type", "ngram-cache", "--lookup-cache-static", str(static), "--stats")
    assert spec.returncode == 0 and spec.stdout == plain.stdout and "draft acceptance" in spec.stderr
    bad = tmp_path / "bad.bin"
    bad.write_bytes(record((1, 2), [(3, 1)])[:-2])
    for flag in ("-lcs", "-lcd"):
        assert_one_line_error(llogos(env, *args, "--spec-type", "ngram-cache", flag, str(bad)), str(bad), "corrupt")
    assert_one_line_error(llogos(env, *args, "--spec-type", "ngram-cache", "-lcs", str(tmp_path / "none.bin")),
                          "no such file")
    assert_one_line_error(llogos(env, *args, "-lcs", str(static)), "needs --spec-type ngram-cache")


def test_lookup_create_writes_the_2_gram_counts_of_the_tokenized_corpus(env, gguf, tmp_path):
    from llogos_cli.model.loader import open_tokenizer
    text = "the cat sat on the mat. the cat sat on the hat.\n"
    (tmp_path / "corpus.txt").write_text(text)
    out = tmp_path / "static.bin"
    r = llogos(env, "lookup-create", "-m", gguf, "-f", str(tmp_path / "corpus.txt"), "-lcs", str(out))
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert load(str(out)) == count(open_tokenizer(gguf).encode(text), (2,))
    assert_one_line_error(llogos(env, "lookup-create", "-m", gguf, "-f", str(tmp_path / "none.txt"), "-lcs", str(out)),
                          "none.txt")


def test_rows_ending_beside_others_are_counted_and_the_file_written_once_when_none_is_left(tmp_path, monkeypatch):
    import llogos_cli.engine.ngram_cache as ngram_cache
    writes = []
    monkeypatch.setattr(ngram_cache, "save", lambda cache, path: writes.append(path) or save(cache, path))
    m, tok = load_model("tiny-llama")
    rng = np.random.default_rng(8)
    prompts = [rng.integers(3, m.cfg.n_vocab, PROMPT_LEN).tolist() for _ in range(3)]
    path = str(tmp_path / "dynamic.bin")
    engine = BatchEngine(m, tok, 3, 256, prefix_cache_bytes=0,
                         speculation=SpecParams("ngram-cache", lookup_cache_dynamic=path))
    requests = [Request(i, p, SamplingParams(temp=0.0), StopCriteria(20, ignore_eos=True)) for i, p in enumerate(prompts)]
    results = {r.id: r for r in engine.generate(requests)}
    assert writes == [path]
    want = {}
    for i, p in enumerate(prompts):
        count(p + results[i].tokens, into=want)
    assert load(path) == want


def test_serve_refuses_a_lookup_cache_for_several_models(env, gguf, tmp_path):
    other = str(need(FIXTURES / "tiny-qwen2-f32.gguf"))
    r = llogos(env, "serve", "-m", gguf, "-m", other, "--port", "0", "--spec-type", "ngram-cache",
               "-lcd", str(tmp_path / "d.bin"))
    assert_one_line_error(r, "router mode")
    assert not (tmp_path / "d.bin").exists()


def test_serve_writes_the_dynamic_file_with_each_finished_request(env, gguf, tmp_path):
    lazy_import("fastapi")
    from tests.test_server import Server
    path = tmp_path / "d.bin"
    server = Server(env, tmp_path / "log", "-m", gguf, "--spec-type", "ngram-cache", "-lcd", str(path))
    try:
        r = server.post("/v1/completions", {"prompt": "one two three one two three one two", "max_tokens": 12,
                                             "temperature": 0})
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
    finally:
        server.stop()
    n = usage["prompt_tokens"] + usage["completion_tokens"]
    counts = load(str(path))
    # every n-gram of 1 to 4 tokens of the request's prompt and output, each followed once
    assert sum(sum(c.values()) for c in counts.values()) == sum(n - size for size in (1, 2, 3, 4))
