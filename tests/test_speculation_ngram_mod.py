"""ngram-mod speculation (engine/ngram_mod.py): llama.cpp's hashed n-gram table shared by every
row, drafts chained through it, the output the same as without."""

import numpy as np
import pytest

from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.ngram_mod import NgramMod, window_hash, window_hashes
from llogos_cli.engine.sampling import SamplingParams
from llogos_cli.engine.speculation import Drafting, SpecParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.errors import LlogosError
from tests.conftest import FIXTURES, need
from tests.test_cli import assert_one_line_error, env, llogos  # noqa: F401  (env is a fixture)
from tests.test_speculation import load, repetitive_prompt

SMALL = SpecParams("ngram-mod", spec_ngram_mod_n_match=3, spec_ngram_mod_n_min=2, spec_ngram_mod_n_max=8)
ONE = SpecParams("ngram-mod", spec_ngram_mod_n_match=1, spec_ngram_mod_n_min=1, spec_ngram_mod_n_max=8)   # drafts often


class Row:
    def __init__(self, tokens):
        self.tokens, self.drafting = tokens, Drafting()


def test_the_table_hashes_every_window_as_the_scalar_hash_does():
    tokens = np.random.default_rng(3).integers(0, 200_000, 300)
    for n in (1, 3, 24):
        got = window_hashes(tokens, n)
        assert [int(h) for h in got] == [window_hash(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def test_a_draft_chains_through_the_table_up_to_n_max_and_is_none_below_n_min():
    rng = np.random.default_rng(5)
    text = rng.integers(3, 50_000, 40).tolist()
    mod = NgramMod(SMALL)
    row = Row(text + text[:3])   # the first window comes round again: what followed it is drafted
    assert mod.propose(row, 8) == text[3:11]
    assert mod.propose(row, 5) == text[3:8]
    fresh = NgramMod(SMALL)
    assert fresh.propose(Row(rng.integers(3, 50_000, 40).tolist()), 8) == []   # no window repeats
    strict = NgramMod(SpecParams("ngram-mod", spec_ngram_mod_n_match=3, spec_ngram_mod_n_min=6,
                                 spec_ngram_mod_n_max=8))
    short = text[:10] + [1, 2] + text[:3]   # what followed the window is known for 9 tokens, then [1, 2] breaks it
    got = strict.propose(Row(short), 8)
    assert got == [] or len(got) >= 6


def test_drafts_that_keep_little_five_times_running_clear_the_table():
    text = np.random.default_rng(6).integers(3, 50_000, 40).tolist()
    mod, row = NgramMod(SMALL), Row(text + text[:3])
    assert mod.propose(row, 8)
    for _ in range(4):
        mod.kept(row, 8, 1)
    assert mod.used > 0
    mod.kept(row, 8, 1)
    assert mod.used == 0 and (mod.table == -1).all() and row.drafting.indexed == 0


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_greedy_output_is_the_same_with_ngram_mod(name):
    m, tok = load(name)
    request = Request(0, repetitive_prompt(m.cfg.n_vocab), SamplingParams(temp=0.0), StopCriteria(100, ignore_eos=True))

    def run(speculation):
        return next(iter(BatchEngine(m, tok, 1, 256, prefix_cache_bytes=0, speculation=speculation).generate([request])))
    want, got = run(SpecParams()), run(ONE)
    assert got.tokens == want.tokens
    assert got.timings.draft_n > 0   # drafts were checked (kept or rolled back) on the way


def test_a_later_request_drafts_from_what_an_earlier_one_wrote():
    """The table is the engine's: the second run of the same prompt finds the first run's output."""
    m, tok = load("tiny-llama")
    prompt = np.random.default_rng(9).integers(3, m.cfg.n_vocab, 12).tolist()
    engine = BatchEngine(m, tok, 1, 256, prefix_cache_bytes=0, speculation=SMALL)

    def run(rid):
        return next(iter(engine.generate([Request(rid, prompt, SamplingParams(temp=0.0),
                                                  StopCriteria(60, ignore_eos=True))])))
    first, second = run(0), run(1)
    assert second.tokens == first.tokens
    assert second.timings.draft_n_accepted > first.timings.draft_n_accepted


def test_bad_ngram_mod_flags_are_refused(env):
    with pytest.raises(LlogosError, match="n-min"):
        SpecParams("ngram-mod", spec_ngram_mod_n_min=10, spec_ngram_mod_n_max=5)
    gguf = str(need(FIXTURES / "tiny-llama-f32.gguf"))
    args = ["generate", "-m", gguf, "--tokens", ",".join(map(str, repetitive_prompt(512))), "-n", "40", "--temp", "0",
            "--ignore-eos"]
    plain = llogos(env, *args)
    spec = llogos(env, *args, "--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "3", "--spec-ngram-mod-n-min",
                  "2", "--stats")
    assert spec.returncode == 0 and spec.stdout == plain.stdout and "draft acceptance" in spec.stderr
    assert_one_line_error(llogos(env, *args, "--spec-type", "ngram-mod", "--spec-ngram-mod-n-min", "70"), "n-min")
