"""Embeddings (engine/embedding.py, `llogos embed`) of the two fixture families against transformers:
tiny-bert-embed (an encoder: non-causal attention, absolute positions, LayerNorm, GELU) and
tiny-qwen3-embed (a decoder pooled by its last token, as Qwen3-Embedding). Both fixtures and their
oracles are made by tests/fixtures/make_embedding_fixtures.py."""

import json
from pathlib import Path

import numpy as np
import pytest

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.engine.embedding import Embedder, EmbedOptions, normalize, prompt_ids
from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.forward import Model
from llogos_cli.model.loader import load, open_tokenizer
from tests.conftest import copy_gguf
from tests.test_cli import env, llogos  # noqa: F401  (env is a fixture)

HERE = Path(__file__).resolve().parent / "fixtures"
TEXTS = ["Hello world", "the quick brown fox runs to the main street", "a", "We came, we saw: 12 white ones."]
FAMILIES = {"tiny-bert-embed": "mean", "tiny-qwen3-embed": "last"}   # and the pooling each GGUF names
MIN_COSINE = 0.9999


def oracle(name: str) -> tuple[dict, list[list[int]]]:
    o = dict(np.load(HERE / f"{name}.oracle.npz"))
    return o, [ids.tolist() for ids in np.split(o["ids"], np.cumsum(o["lengths"])[:-1])]


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def assert_close(got, want) -> None:
    cosine = np.sum(unit(np.asarray(got, np.float64)) * unit(want), axis=-1)
    assert cosine.min() >= MIN_COSINE, cosine


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    loaded = load(str(HERE / f"{request.param}-f32.gguf"), backend="cpu")
    return request.param, loaded


def test_the_gguf_names_its_pooling(family):
    name, loaded = family
    assert loaded.model.cfg.pooling == FAMILIES[name]


def test_tokenizer_gives_transformers_ids(family):
    name, loaded = family
    _, ids = oracle(name)
    assert [loaded.tokenizer.encode(text) for text in TEXTS] == ids


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_pooled_embeddings_match_transformers(family, pooling):
    name, loaded = family
    want, ids = oracle(name)
    got = Embedder(loaded.model, 32).embed(ids, EmbedOptions(pooling, 2))
    assert_close(got, want[pooling])
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_pooling_none_gives_every_tokens_state(family):
    name, loaded = family
    want, ids = oracle(name)
    got = Embedder(loaded.model, 32).embed(ids, EmbedOptions("none", -1))
    assert [g.shape for g in got] == [(len(i), loaded.model.cfg.n_embd) for i in ids]
    assert_close(np.concatenate(got), want["states"])


def test_a_text_alone_and_among_others_embeds_the_same(family):
    """Each prompt attends only its own slot, the encoder's whole-sequence attention included."""
    name, loaded = family
    _, ids = oracle(name)
    embedder = Embedder(loaded.model, 32, batch_tokens=16)   # several forward passes of several prompts
    together = embedder.embed(ids, EmbedOptions("mean", -1))
    alone = [embedder.embed([i], EmbedOptions("mean", -1))[0] for i in ids]
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-6)


def test_bad_inputs_are_one_line_errors(family):
    name, loaded = family
    embedder = Embedder(loaded.model, 8)
    with pytest.raises(LlogosError, match="input 1 is empty"):
        embedder.embed([[1], []], EmbedOptions("mean"))
    with pytest.raises(LlogosError, match="more than the context of 8"):
        embedder.embed([list(range(9))], EmbedOptions("mean"))
    with pytest.raises(LlogosError, match="outside the vocabulary"):
        embedder.embed([[loaded.model.cfg.n_vocab]], EmbedOptions("mean"))
    with pytest.raises(LlogosError, match="pooling 'rank' is not supported"):
        EmbedOptions("rank")


def test_eos_ends_a_text_where_the_vocabulary_adds_it(tmp_path):
    """As Qwen3-Embedding's GGUF asks (add_eos_token), for the last token's state to be EOS's."""
    path = copy_gguf(HERE / "tiny-qwen3-embed-f32.gguf", tmp_path / "eos.gguf", meta={"tokenizer.ggml.add_eos_token": True})
    tokenizer = open_tokenizer(str(path))
    plain = open_tokenizer(str(HERE / "tiny-qwen3-embed-f32.gguf"))
    assert prompt_ids(tokenizer, TEXTS[0]) == prompt_ids(plain, TEXTS[0]) + [tokenizer.eos_id]
    assert tokenizer.encode(TEXTS[0]) == plain.encode(TEXTS[0])   # generation's prompts stay as they were
    bert = open_tokenizer(str(HERE / "tiny-bert-embed-f32.gguf"))   # its GGUF says add_eos: [SEP] is that
    assert prompt_ids(bert, TEXTS[0]) == oracle("tiny-bert-embed")[1][0]


def test_normalize_as_llama_cpp():
    x = np.array([[3.0, -4.0, 0.0], [0.0, 0.0, 0.0]], np.float32)
    np.testing.assert_allclose(normalize(x, -1), x)
    np.testing.assert_allclose(normalize(x, 0)[0], x[0] * 32760 / 4, rtol=1e-6)
    np.testing.assert_allclose(normalize(x, 1)[0], x[0] / 7, rtol=1e-6)
    np.testing.assert_allclose(normalize(x, 2)[0], x[0] / 5, rtol=1e-6)
    np.testing.assert_allclose(normalize(x, 3)[0], x[0] / (27 + 64) ** (1 / 3), rtol=1e-6)
    for kind in (0, 1, 2, 3):
        assert not normalize(x, kind)[1].any()


def test_an_encoder_has_no_lm_head():
    model = load(str(HERE / "tiny-bert-embed-f32.gguf"), backend="cpu").model
    ctx = model.new_context(8)
    with pytest.raises(LlogosError, match="no LM head"):
        model.forward_seq(ctx, np.array([2, 3], np.int32))


def test_a_backend_without_encoder_ops_refuses_an_encoder():
    class NoEncoders(NumpyBackend):
        encoders = False
    with pytest.raises(LlogosError, match="cannot run encoder models"):
        Model(GGUFFile(HERE / "tiny-bert-embed-f32.gguf"), NoEncoders())


def test_pooling_type_is_read_from_the_file(tmp_path):
    path = tmp_path / "bert.gguf"
    copy_gguf(HERE / "tiny-bert-embed-f32.gguf", path, meta={"bert.pooling_type": 2})
    assert load(str(path), backend="cpu").model.cfg.pooling == "cls"


# ---------------------------------------------------------------- llogos embed

def test_cli_json_lines_match_transformers(env, tmp_path):
    """Each family with the pooling its GGUF names; texts from a file, one a line."""
    for name, pooling in FAMILIES.items():
        (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
        r = llogos(env, "embed", "-m", str(HERE / f"{name}-f32.gguf"), "-f", str(tmp_path / "texts.txt"), "--json")
        assert r.returncode == 0, r.stderr
        records = [json.loads(line) for line in r.stdout.splitlines()]
        assert [rec["index"] for rec in records] == list(range(len(TEXTS)))
        assert_close([rec["embedding"] for rec in records], oracle(name)[0][pooling])


def test_cli_plain_output_and_options(env):
    bert = str(HERE / "tiny-bert-embed-f32.gguf")
    r = llogos(env, "embed", "-m", bert, "-p", TEXTS[0], "-p", TEXTS[1], "--pooling", "cls", "--embd-normalize", "0")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["embedding 0", "embedding 1"]
    got = np.array([[float(v) for v in line.split(":")[1].split()] for line in lines])
    assert np.abs(got).max(axis=1).tolist() == [32760.0, 32760.0]
    assert_close(got, oracle("tiny-bert-embed")[0]["cls"][:2])
    r = llogos(env, "embed", "-m", bert, "--pooling", "none", "--json", stdin=TEXTS[2] + "\n")
    assert r.returncode == 0, r.stderr
    assert np.array(json.loads(r.stdout)["embedding"]).shape == (3, 64)


@pytest.mark.parametrize("args, message", [
    (["embed", "-p", "x", "--pooling", "max"], "Invalid value for '--pooling'"),
    (["embed", "-p", "x", "--embd-normalize", "-2"], "Invalid value for '--embd-normalize'"),
    (["embed"], "nothing to embed"),
    (["generate", "-p", "x", "-n", "1"], "without an LM head"),
])
def test_cli_bad_input_is_one_line(env, args, message):
    r = llogos(env, args[0], "-m", str(HERE / "tiny-bert-embed-f32.gguf"), *args[1:], stdin=None)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0 and message in r.stderr, r.stderr
    assert r.stdout == ""


def test_info_tells_an_encoder_from_a_decoder(env):
    facts = {name: json.loads(llogos(env, "info", "-m", str(HERE / f"{name}-f32.gguf"), "--json").stdout)
             for name in FAMILIES}
    bert, qwen3 = facts["tiny-bert-embed"], facts["tiny-qwen3-embed"]
    assert bert["embeddings"] == {"pooling": "mean", "causal": False, "lm_head": False}
    assert bert["rope"] is None and bert["feed_forward"]["activation"] == "GELU"
    assert qwen3["embeddings"] == {"pooling": "last", "causal": True, "lm_head": True}
    assert qwen3["rope"]["neox"] and qwen3["feed_forward"]["activation"] == "SwiGLU"
