"""llama.cpp's samplers where users set them: the command line's flags (llama.cpp's names), a
request to `llogos serve` and a `llogos batch` line (llama-server's field names), and rows of one
batch, each sampling as it would alone."""

import dataclasses
import json

import numpy as np
import pytest

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.cli.generate import generate
from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.sampling import SamplingOverrides, SamplingParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.jobs.lines import Line, LineDefaults, LineError, to_request
from llogos_cli.model.forward import Model
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.conftest import FIXTURES, need
from tests.test_cli import assert_one_line_error, env, llogos  # noqa: F401  (env is a fixture)

TINY = FIXTURES / "tiny-llama-f32.gguf"
# Every new sampler on at once, in llama-server's names.
FIELDS = {"typical_p": 0.9, "top_n_sigma": 2.0, "xtc_probability": 0.5, "xtc_threshold": 0.05,
          "dry_multiplier": 0.8, "dry_base": 2.0, "dry_allowed_length": 1, "dry_penalty_last_n": 32,
          "dry_sequence_breakers": ["\n", "c"], "min_keep": 2, "repeat_last_n": 16}


def parsed(*args: str) -> SamplingParams:
    """The SamplingParams the command line gives (parsed by `generate`'s own options; nothing runs)."""
    ctx = generate.make_context("generate", list(args))
    names = [f.name for f in dataclasses.fields(SamplingOverrides)]
    return SamplingOverrides(**{name: ctx.params[name] for name in names}).params({})


def test_flags_take_llama_cpps_names_and_defaults():
    assert parsed() == SamplingParams()
    p = parsed("--typical", "0.5", "--top-nsigma", "1.5", "--xtc-probability", "0.5", "--xtc-threshold", "0.2",
               "--mirostat", "2", "--mirostat-lr", "0.2", "--mirostat-ent", "3", "--dry-multiplier", "0.8",
               "--dry-base", "2", "--dry-allowed-length", "3", "--dry-penalty-last-n", "128", "--min-keep", "2",
               "--samplers", "top_k;typical;temp", "-l", "5+1", "--logit-bias", "7-inf", "-s", "42",
               "--temperature", "0.3")
    assert (p.typical_p, p.top_n_sigma, p.xtc_probability, p.xtc_threshold) == (0.5, 1.5, 0.5, 0.2)
    assert (p.mirostat, p.mirostat_eta, p.mirostat_tau) == (2, 0.2, 3.0)
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n) == (0.8, 2.0, 3, 128)
    assert (p.min_keep, p.seed, p.temp) == (2, 42, 0.3)
    assert p.samplers == ("top_k", "typ_p", "temperature")
    assert p.logit_bias == ((5, 1.0), (7, -np.inf))
    assert parsed("--sampling-seq", "kt").samplers == ("top_k", "temperature")
    assert parsed("--typical-p", "0.7", "--top-n-sigma", "1").typical_p == 0.7


def test_sequence_breakers_replace_the_defaults_and_none_clears_them():
    assert parsed().dry_sequence_breakers == ("\n", ":", "\"", "*")
    assert parsed("--dry-sequence-breaker", "###").dry_sequence_breakers == ("###",)
    assert parsed("--dry-sequence-breaker", "a", "--dry-sequence-breaker", "none",
                  "--dry-sequence-breaker", "b").dry_sequence_breakers == ("b",)
    assert parsed("--dry-sequence-breaker", "none").dry_sequence_breakers == ()


def test_bad_sampler_flags_are_one_line_errors(env):
    need(TINY)
    base = ["generate", "-m", str(TINY), "-p", "a", "-n", "1"]
    assert_one_line_error(llogos(env, *base, "-l", "x+1"), "-l/--logit-bias", "TOKEN_ID+BIAS", code=2)
    assert_one_line_error(llogos(env, *base, "--mirostat", "3"), "--mirostat must be 0")
    assert_one_line_error(llogos(env, *base, "--samplers", "top_k;warp"), "unknown sampler 'warp'")
    assert_one_line_error(llogos(env, *base, "--samplers", "k", "--sampling-seq", "k"), "not both")
    # Known only once the vocabulary is: after the model loads (and, on a first run, its kernels compile).
    r = llogos(env, *base, "-l", "999999+1")
    assert r.returncode == 1 and "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1] == "error: logit bias: token id 999999 is not in the vocabulary (0..508)"


def test_generate_runs_the_samplers_reproducibly_and_bans_with_logit_bias(env):
    need(TINY)
    base = ["generate", "-m", str(TINY), "-p", "a b c", "-n", "6", "--ignore-eos", "--json"]
    flags = ["--temp", "1", "-s", "3", "--typical", "0.9", "--top-nsigma", "2", "--xtc-probability", "0.5",
             "--dry-multiplier", "0.8", "--dry-sequence-breaker", "c", "--min-keep", "2"]
    runs = [llogos(env, *base, *flags) for _ in range(2)]
    assert runs[0].returncode == 0, runs[0].stderr
    tokens = [[json.loads(record)["id"] for record in run.stdout.splitlines()[:-1]] for run in runs]
    assert len(tokens[0]) == 6 and tokens[0] == tokens[1]
    greedy = llogos(env, *base, "--temp", "0")
    first = json.loads(greedy.stdout.splitlines()[0])["id"]
    banned = llogos(env, *base, "--temp", "0", "-l", f"{first}-inf")
    assert json.loads(banned.stdout.splitlines()[0])["id"] != first


# ------------------------------------------------------------------------------------ batch lines

@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(need(TINY)))


def line(tok, fields: dict):
    defaults = LineDefaults(SamplingParams(), StopCriteria(4, ignore_eos=True), 0, 7)
    return to_request(Line("a", 1, {"prompt": "hi", **fields}), tok, None, defaults)


def test_a_batch_line_takes_the_sampler_fields(tok):
    p = line(tok, {**FIELDS, "mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2,
                   "samplers": ["top_k", "typical", "temperature"]}).params
    for name, value in FIELDS.items():
        assert getattr(p, name) == (tuple(value) if isinstance(value, list) else value), name
    assert (p.mirostat, p.mirostat_tau, p.mirostat_eta) == (2, 3.0, 0.2)
    assert p.samplers == ("top_k", "typ_p", "temperature")
    assert line(tok, {"samplers": "kt"}).params.samplers == ("top_k", "temperature")


@pytest.mark.parametrize("fields, fragment", [
    ({"mirostat": 3}, "mirostat: "), ({"typical_p": 2.0}, "typical_p: "), ({"dry_base": 0.5}, "dry_base: "),
    ({"dry_sequence_breakers": []}, "dry_sequence_breakers: "), ({"xtc_threshold": "0.1"}, "xtc_threshold: "),
    ({"samplers": ["top_k", "warp"]}, "unknown sampler 'warp'"), ({"samplers": "kq"}, "unknown sampler letter 'q'"),
])
def test_a_batch_line_with_bad_sampler_fields_is_an_error_of_its_own(tok, fields, fragment):
    e = line(tok, fields)
    assert isinstance(e, LineError) and fragment in e.error, e


# ------------------------------------------------------------------------------- rows of a batch

SETTINGS = [dict(FIELDS, dry_sequence_breakers=("\n",)), dict(mirostat=1, mirostat_tau=3.0),
            dict(mirostat=2, mirostat_tau=3.0), dict(typical_p=0.5, samplers="ykt"),
            dict(xtc_probability=1.0, xtc_threshold=0.01, temp=0.0), dict(top_n_sigma=1.0, dry_multiplier=1.0)]


def test_each_row_samples_as_it_would_alone():
    f = GGUFFile(need(TINY))
    m, tok = Model(f, NumpyBackend(batched=True)), Tokenizer.from_gguf(f)
    rng = np.random.default_rng(5)
    requests = [Request(f"r{i}", rng.integers(3, m.cfg.n_vocab, 5 + i).tolist(),
                        SamplingParams(**({"temp": 1.0, "seed": 11 + i} | s)), StopCriteria(10, ignore_eos=True))
                for i, s in enumerate(SETTINGS)]
    together = {r.id: r.tokens for r in BatchEngine(m, tok, 3, 64).generate(requests)}
    alone = {r.id: r.tokens for req in requests for r in BatchEngine(m, tok, 1, 64).generate([req])}
    assert together == alone
    assert all(len(tokens) == 10 for tokens in together.values())
