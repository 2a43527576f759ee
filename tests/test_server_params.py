"""OpenAI chat parameters beyond sampling through `llogos serve`: logit_bias works, and what is not
supported (n > 1) gets a 400 that names it."""

import pytest

from llogos_cli.gguf.file import GGUFFile
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.conftest import FIXTURES, need
from tests.test_cli import env  # noqa: F401  (env is a fixture)
from tests.test_server import Server

openai = pytest.importorskip("openai")

TINY = FIXTURES / "tiny-llama-f32.gguf"
ASK = [{"role": "user", "content": "a b c"}]


@pytest.fixture(scope="module")
def tiny(env, tmp_path_factory):
    need(TINY)
    server = Server(env, tmp_path_factory.mktemp("params") / "log", "-m", str(TINY), "-np", "2",
                    "--chat-template", "chatml")
    yield server
    server.stop()


def test_logit_bias_bans_and_favours_tokens(tiny):
    client = tiny.client()
    tok = Tokenizer.from_gguf(GGUFFile(TINY))
    favoured = tok.decode([300])

    def reply(**kw):
        return client.chat.completions.create(model="x", messages=ASK, max_tokens=3, temperature=0, logprobs=True,
                                              extra_body={"ignore_eos": True}, **kw).choices[0]

    plain = reply()
    assert plain.message.content != favoured * 3
    assert reply(logit_bias={"300": 100}).message.content == favoured * 3
    top = bytes(plain.logprobs.content[0].bytes)
    top_id = next(i for i in range(tok.n_vocab) if tok.token_bytes(i, special=True) == top)
    assert bytes(reply(logit_bias={str(top_id): -100}).logprobs.content[0].bytes) != top
    done = client.completions.create(model="x", prompt="a", max_tokens=2, temperature=0, logit_bias={"300": 100},
                                     extra_body={"ignore_eos": True})
    assert done.choices[0].text == favoured * 2


@pytest.mark.parametrize("body, fragment", [
    ({"logit_bias": {"x": 5}}, "logit_bias"),
    ({"logit_bias": {"99999": 5}}, "logit_bias"),
    ({"logit_bias": {"3": 500}}, "logit_bias"),
    ({"n": 2}, "n"),
])
def test_unsupported_or_bad_parameters_are_400s_naming_them(tiny, body, fragment):
    r = tiny.post("/v1/chat/completions", {"messages": ASK, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith(fragment)
