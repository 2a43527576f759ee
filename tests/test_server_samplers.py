"""llama-server's sampler fields in a request to `llogos serve`: typical_p, mirostat*, dry_*, xtc_*,
top_n_sigma, min_keep and samplers take effect, reproducibly with a seed, and bad values are 400s."""

import pytest

from tests.conftest import FIXTURES, need
from tests.test_cli import env  # noqa: F401  (env is a fixture)
from tests.test_server import Server
from tests.test_sampler_flags import FIELDS

TINY = FIXTURES / "tiny-llama-f32.gguf"


@pytest.fixture(scope="module")
def tiny(env, tmp_path_factory):
    need(TINY)
    server = Server(env, tmp_path_factory.mktemp("samplers") / "log", "-m", str(TINY), "-np", "2", "-c", "256",
                    "--chat-template", "chatml")
    yield server
    server.stop()


def complete(server, **fields) -> dict:
    body = {"prompt": "a b c", "max_tokens": 6, "ignore_eos": True, **fields}
    r = server.post("/v1/completions", body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_sampler_fields_take_effect_reproducibly(tiny):
    sampled = {**FIELDS, "temperature": 1.0, "seed": 4, "samplers": "edskyxt"}
    assert complete(tiny, **sampled)["text"] == complete(tiny, **sampled)["text"]
    mirostat = {"temperature": 1.0, "seed": 4, "mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2}
    assert complete(tiny, **mirostat)["text"] == complete(tiny, **mirostat)["text"]
    # Greedy: XTC, which drops the likeliest tokens but one before temperature, changes the choice.
    plain = complete(tiny, temperature=0)["text"]
    assert complete(tiny, temperature=0, xtc_probability=1.0, xtc_threshold=0.0)["text"] != plain
    assert complete(tiny, temperature=0, samplers=["top_k", "typical", "temp"])["text"] == plain
    chat = tiny.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                              "dry_multiplier": 0.8, "dry_sequence_breakers": ["\n"], "seed": 1})
    assert chat.status_code == 200, chat.text


@pytest.mark.parametrize("fields, fragment", [
    ({"mirostat": 3}, "mirostat"), ({"xtc_probability": 1.5}, "xtc_probability"),
    ({"dry_sequence_breakers": []}, "dry_sequence_breakers"), ({"dry_base": 0.9}, "dry_base"),
    ({"samplers": ["top_k", "warp"]}, "unknown sampler 'warp'"), ({"top_n_sigma": "1"}, "top_n_sigma"),
])
def test_bad_sampler_fields_are_400s(tiny, fields, fragment):
    r = tiny.post("/v1/completions", {"prompt": "a", "max_tokens": 1, **fields})
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]["message"]
