"""The n-gram kinds of speculation beside ngram-mod (engine/ngram_index.py, ngram_map.py,
ngram_cache.py): each drafts what llama.cpp's kind of the same name would, from an index that grows
with the row, and every kind leaves greedy output token for token as it is without drafts."""

import numpy as np
import pytest

from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.ngram_cache import NgramCache
from llogos_cli.engine.ngram_index import NgramIndex
from llogos_cli.engine.ngram_map import NgramMap
from llogos_cli.engine.sampling import SamplingParams
from llogos_cli.engine.speculation import SPEC_TYPES, Drafting, SpecParams, Speculator, ngram_simple
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.errors import LlogosError
from tests.conftest import FIXTURES, need
from tests.test_cli import assert_one_line_error, env, llogos  # noqa: F401  (env is a fixture)
from tests.test_speculation import load, repetitive_prompt

# small sizes, so that the fixtures' short outputs draft
KINDS = {
    "ngram-simple": SpecParams("ngram-simple", spec_ngram_simple_size_n=1, spec_ngram_simple_size_m=8),
    "ngram-map-k": SpecParams("ngram-map-k", spec_ngram_map_k_size_n=2, spec_ngram_map_k_size_m=6),
    "ngram-map-k4v": SpecParams("ngram-map-k4v", spec_ngram_map_k4v_size_n=2, spec_ngram_map_k4v_size_m=4),
    "ngram-mod": SpecParams("ngram-mod", spec_ngram_mod_n_match=1, spec_ngram_mod_n_min=1, spec_ngram_mod_n_max=8),
    "ngram-cache": SpecParams("ngram-cache"),
}


class Row:
    def __init__(self, tokens):
        self.tokens, self.drafting = tokens, Drafting()


def scanned(tokens: list[int], n: int, m: int) -> list[int]:
    """llama.cpp's ngram-simple as it reads: a scan back from the current tokens at every step."""
    history = len(tokens) - 1
    if history <= n + m + 1:
        return []
    for j in range(history - n - 1, 0, -1):
        if tokens[j:j + n] == tokens[-n:]:
            copy = min(m, history - (j + n))
            return tokens[j + n:j + n + copy] if copy >= n else []
    return []


def test_every_kind_llama_cpp_lists_for_n_grams_is_checked_here():
    assert set(KINDS) == {t for t in SPEC_TYPES if t.startswith("ngram")}


@pytest.mark.parametrize("n,m", [(1, 3), (2, 4), (3, 8)])
def test_a_growing_index_drafts_what_a_scan_of_the_whole_context_drafts(n, m):
    rng = np.random.default_rng(n)
    tokens = rng.integers(0, 6, 400).tolist()   # a small vocabulary: many repeats, many near misses
    index = NgramIndex(n)
    drafted = 0
    for end in range(1, len(tokens) + 1):
        got = ngram_simple(tokens[:end], n, m, index)
        assert got == scanned(tokens[:end], n, m)
        drafted += bool(got)
    assert drafted > 100


def test_ngram_map_k_copies_after_the_latest_key_with_m_tokens_after_it_as_long_as_the_last_draft_held():
    mapk = NgramMap(SpecParams("ngram-map-k", spec_ngram_map_k_size_n=2, spec_ngram_map_k_size_m=3))
    row = Row([9, 1, 2, 3, 4, 5, 1, 2, 6, 7, 8, 0, 0, 1, 2])
    assert mapk.propose(row, 10) == [6, 7, 8]    # the later "1 2", which m tokens follow
    mapk.kept(row, 3, 1)
    assert mapk.propose(row, 10) == [6]          # as many as the key's last draft kept
    mapk.kept(row, 1, 0)
    assert mapk.propose(row, 10) == []           # a key whose draft kept nothing drafts no more
    assert NgramMap(SpecParams("ngram-map-k", spec_ngram_map_k_size_n=2,
                               spec_ngram_map_k_size_m=3)).propose(Row(row.tokens[:-1] + [5]), 10) == []
    hits = NgramMap(SpecParams("ngram-map-k", spec_ngram_map_k_size_n=2, spec_ngram_map_k_size_m=3,
                               spec_ngram_map_k_min_hits=2))
    fresh = Row(list(row.tokens))
    assert hits.propose(fresh, 10) == [] and hits.propose(fresh, 10) == [6, 7, 8]   # the second lookup


def test_ngram_map_k4v_drafts_only_a_continuation_that_came_twice_as_often_as_the_others():
    k4v = SpecParams("ngram-map-k4v", spec_ngram_map_k4v_size_n=1, spec_ngram_map_k4v_size_m=2)
    a, b = [1, 5, 6], [1, 7, 8]
    assert NgramMap(k4v).propose(Row([0] + a + b + [9, 9, 1]), 10) == []   # 1 1: none dominates
    assert NgramMap(k4v).propose(Row([0] + a + b + a + a + [9, 9, 1]), 10) == [5, 6]   # 3 against 1
    assert NgramMap(k4v).propose(Row([0] + a + b + a + [9, 9, 1]), 10) == [5, 6]       # 2 against 1
    assert NgramMap(k4v).propose(Row([0] + a + b + b + a + [9, 9, 1]), 10) == []       # 2 against 2


def test_ngram_cache_drafts_the_likeliest_follower_of_the_longest_convincing_n_gram():
    cache = NgramCache(SpecParams("ngram-cache"))
    assert cache.propose(Row([1, 2, 3, 4, 1, 2, 3, 4, 1, 2]), 8) == [3, 4, 1, 2, 3, 4, 1, 2]   # 8 at most
    assert cache.propose(Row([1, 2, 3, 4, 1, 2, 3, 4, 1, 2]), 3) == [3, 4, 1]
    # a lone token drafts after two occurrences, two-thirds of them followed by the same token...
    assert cache.propose(Row([3, 1, 8, 2, 1]), 8) == []
    assert cache.propose(Row([5, 6, 9, 5, 7, 8, 3, 5]), 8) == []
    # ...then "1 8", followed by 2 and by 6 once each: half is enough for two tokens
    assert cache.propose(Row([3, 1, 8, 2, 1, 8, 6, 7, 1]), 2) == [8, 2]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_greedy_output_is_the_same_with_every_kind(name, kind):
    m, tok = load(name)
    request = Request(0, repetitive_prompt(m.cfg.n_vocab), SamplingParams(temp=0.0), StopCriteria(80, ignore_eos=True))

    def run(speculation):
        return next(iter(BatchEngine(m, tok, 1, 256, prefix_cache_bytes=0, speculation=speculation).generate([request])))
    want, got = run(SpecParams()), run(KINDS[kind])
    assert got.tokens == want.tokens
    assert got.timings.draft_n > 0   # drafts were checked (kept or rolled back) on the way


@pytest.mark.parametrize("kind", ["ngram-simple", "ngram-map-k", "ngram-cache"])
def test_a_shifted_row_indexes_its_tokens_afresh(kind):
    """A context shift drops tokens from the middle of a row: what was indexed of them is forgotten,
    so no lookup points at a position whose token has changed."""
    m, tok = load("tiny-llama")
    stale = []

    def checked(propose):
        def wrapped(row, n):
            index = row.drafting.index
            positions = index.starts.items() if isinstance(index, NgramIndex) else \
                index.index.starts.items() if hasattr(index, "index") else []
            stale.extend(s for key, starts in positions for s in starts if tuple(row.tokens[s:s + len(key)]) != key)
            return propose(row, n)
        return wrapped

    request = Request(0, repetitive_prompt(m.cfg.n_vocab), SamplingParams(temp=0.0), StopCriteria(150, ignore_eos=True))

    def run(speculation):
        engine = BatchEngine(m, tok, 1, 64, prefix_cache_bytes=0, speculation=speculation, context_shift=True)
        if engine.speculator is not None:
            engine.speculator.propose = checked(engine.speculator.propose)
        return next(iter(engine.generate([request])))
    want, got = run(SpecParams()), run(KINDS[kind])
    assert len(want.tokens) == 150 and got.tokens == want.tokens
    assert got.timings.draft_n > 0 and not stale


def test_a_row_backing_off_looks_nothing_up():
    looked = []

    class Counting(Speculator):
        def propose(self, row, n):
            looked.append(n)
            return [1, 2]
    spec = Counting(SpecParams("ngram-simple"))

    class Completion:
        criteria, room, generated = StopCriteria(100), 100, []
    row = Row([0] * 10)
    row.completion = Completion()
    assert spec.draft(row) == [1, 2]
    spec.kept(row, 2, 0)
    spec.kept(row, 2, 0)   # a second wholly rejected draft: two steps' wait
    assert [spec.draft(row) for _ in range(3)] == [[], [], [1, 2]] and len(looked) == 2


def test_bad_ngram_map_flags_are_refused(env):
    with pytest.raises(LlogosError, match="--spec-ngram-map-k4v-size-m"):
        SpecParams("ngram-map-k4v", spec_ngram_map_k4v_size_m=0)
    with pytest.raises(LlogosError, match="--spec-ngram-map-k-min-hits"):
        SpecParams("ngram-map-k", spec_ngram_map_k_min_hits=0)
    gguf = str(need(FIXTURES / "tiny-llama-f32.gguf"))
    args = ["generate", "-m", gguf, "--tokens", ",".join(map(str, repetitive_prompt(512))), "-n", "40", "--temp", "0",
            "--ignore-eos"]
    plain = llogos(env, *args)
    spec = llogos(env, *args, "--spec-type", "ngram-map-k4v", "--spec-ngram-map-k4v-size-n", "2",
                  "--spec-ngram-map-k4v-size-m", "4", "--stats")
    assert spec.returncode == 0 and spec.stdout == plain.stdout and "draft acceptance" in spec.stderr
    assert_one_line_error(llogos(env, *args, "--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "0"),
                          "--spec-ngram-map-k-size-n", code=2)   # a usage error, as click reports it
