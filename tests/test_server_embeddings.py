"""`llogos serve`'s /v1/embeddings through the openai client, and llama-server's /embedding, on
the two embedding fixtures (an encoder serves embeddings alone; a decoder serves text as well),
against transformers' vectors (tests/fixtures/make_embedding_fixtures.py)."""

import base64

import numpy as np
import pytest

from tests.conftest import lazy_import
from tests.test_cli import env, llogos  # noqa: F401  (env is a fixture)
from tests.test_embeddings import HERE, TEXTS, assert_close, oracle
from tests.test_server import Server

openai = lazy_import("openai")


@pytest.fixture(scope="module")
def compiled(env):  # noqa: F811
    """The CPU kernels compiled into env's cache by a command with no start-up deadline, which a
    server's first start on a fresh cache may outrun on a busy machine."""
    r = llogos(env, "embed", "-m", str(HERE / "tiny-bert-embed-f32.gguf"), "-p", "x")
    assert r.returncode == 0, r.stderr
    return env


@pytest.fixture(scope="module")
def bert(compiled, tmp_path_factory):
    server = Server(compiled, tmp_path_factory.mktemp("bert") / "log", "-m",
                    str(HERE / "tiny-bert-embed-f32.gguf"), "-np", "2", "-c", "32")
    yield server
    server.stop()
    assert server.proc.returncode == 0, server.log.read_text()
    assert "Traceback" not in server.log.read_text()


@pytest.fixture(scope="module")
def qwen3(compiled, tmp_path_factory):
    server = Server(compiled, tmp_path_factory.mktemp("qwen3") / "log", "-m", str(HERE / "tiny-qwen3-embed-f32.gguf"),
                    "-np", "2", "-c", "64")
    yield server
    server.stop()
    assert server.proc.returncode == 0, server.log.read_text()
    assert "Traceback" not in server.log.read_text()


def vector(embedding) -> np.ndarray:
    """A vector as the client hands it back: asked for base64 explicitly, it leaves the string as sent."""
    return np.frombuffer(base64.b64decode(embedding), "<f4") if isinstance(embedding, str) else np.array(embedding)


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_openai_client_gets_transformers_embeddings(bert, qwen3, encoding_format):
    for server, name, pooling in ((bert, "tiny-bert-embed", "mean"), (qwen3, "tiny-qwen3-embed", "last")):
        want, ids = oracle(name)
        r = server.client().embeddings.create(model="any", input=TEXTS, encoding_format=encoding_format)
        assert [d.index for d in r.data] == list(range(len(TEXTS)))
        got = np.array([vector(d.embedding) for d in r.data])
        assert_close(got, want[pooling])
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        assert r.usage.prompt_tokens == r.usage.total_tokens == sum(map(len, ids))


def test_the_clients_default_is_base64_decoded(qwen3):
    r = qwen3.client().embeddings.create(model="any", input=TEXTS[1])   # the client asks for base64 itself
    assert_close([r.data[0].embedding], oracle("tiny-qwen3-embed")[0]["last"][1:2])


def test_token_id_inputs_embed_as_their_text(bert):
    want, ids = oracle("tiny-bert-embed")
    client = bert.client()
    one = client.embeddings.create(model="any", input=ids[0], encoding_format="float")
    many = client.embeddings.create(model="any", input=ids, encoding_format="float")
    assert_close([one.data[0].embedding], want["mean"][:1])
    assert_close([d.embedding for d in many.data], want["mean"])


def test_llama_server_embedding_route(bert):
    r = bert.post("/embedding", {"content": TEXTS[0]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [item["index"] for item in body] == [0]
    assert_close(body[0]["embedding"], oracle("tiny-bert-embed")[0]["mean"][:1])


@pytest.mark.parametrize("body, param", [
    ({"input": TEXTS[0], "dimensions": 8}, "dimensions"),
    ({"input": []}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [[10 ** 6]]}, "input"),
    ({"input": TEXTS[0], "encoding_format": "int8"}, "encoding_format"),
    ({"input": TEXTS[0], "pooling": "mean"}, "pooling"),
])
def test_bad_requests_are_400_in_openai_shape(bert, body, param):
    r = bert.post("/v1/embeddings", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_an_encoder_refuses_text_generation_with_a_400(bert):
    with pytest.raises(openai.BadRequestError, match="no LM head"):
        bert.client().completions.create(model="any", prompt="hi", max_tokens=2)


def test_a_decoder_serves_text_and_embeddings(qwen3):
    client = qwen3.client()
    r = client.completions.create(model="any", prompt="Hello", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens >= 1
    assert len(client.embeddings.create(model="any", input="Hello").data[0].embedding) == 64
