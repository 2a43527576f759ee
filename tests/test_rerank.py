"""Reranking (engine/rerank.py, model/rank_head.py, `llogos embed --pooling rank`, `llogos serve
--reranking`'s /v1/rerank and its aliases) on tiny-bert-rerank, a BERT cross-encoder, against
transformers' scores (tests/fixtures/make_rerank_fixtures.py); and the decoder style of
Qwen3-Reranker (a rerank template, the "yes"/"no" rows of the LM head, their softmax): on
tiny-qwen3-embed given such a head, and on tiny-qwen3-rerank, a tiny Qwen3-Reranker made by
transformers and llama.cpp's converter, against transformers' probabilities of "yes", through the
engine, `llogos embed` and /v1/rerank."""

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from llogos_cli.engine.rerank import TEMPLATE_KEY, RankPrompt, Reranker
from llogos_cli.errors import LlogosError
from llogos_cli.model.loader import load
from llogos_cli.model.rank_head import RankHead
from tests.conftest import copy_gguf
from tests.test_cli import assert_one_line_error, env, llogos  # noqa: F401  (env is a fixture)
from tests.test_embeddings import HERE
from tests.test_embeddings import oracle as embedding_oracle
from tests.test_server import Server

NAME = "tiny-bert-rerank"
MODEL = HERE / f"{NAME}-f32.gguf"
PAIRS = [("what is a fox", "the quick brown fox runs to the main street"),
         ("what is a fox", "We came, we saw: 12 white ones."),
         ("hello", "Hello world"),
         ("a", "a"),
         ("where is the main street", "the main street")]
ATOL = 1e-5   # float32 rounding of a 2-layer model's score near 1; the GELU approximation is the oracle's too
QWEN3 = HERE / "tiny-qwen3-rerank-f32.gguf"


def oracle(name: str = NAME) -> dict:
    return dict(np.load(HERE / f"{name}.oracle.npz"))


def split(o: dict, key: str) -> list[list[int]]:
    return [x.tolist() for x in np.split(o[key], np.cumsum(o["lengths"])[:-1])]


@pytest.fixture(scope="module")
def reranker():
    loaded = load(str(MODEL), backend="cpu")
    return Reranker.from_file(loaded.model, loaded.source.file, loaded.tokenizer, 64)


def test_pairs_are_transformers_pair_encoding(reranker):
    o = oracle()
    prompts = [reranker.pair(q, d) for q, d in PAIRS]
    assert [p.ids for p in prompts] == split(o, "ids")
    assert [p.types for p in prompts] == split(o, "types")


def test_scores_match_transformers(reranker):
    scores = reranker.scores([reranker.pair(q, d) for q, d in PAIRS])
    assert scores.shape == (len(PAIRS), 1)
    np.testing.assert_allclose(scores[:, 0], oracle()["scores"], atol=ATOL)


def test_every_token_of_type_0_scores_as_llama_cpp_does(reranker):
    """llama.cpp gives no document its token type: the same ids all of type 0 are its scores."""
    scores = reranker.scores([RankPrompt(reranker.pair(q, d).ids) for q, d in PAIRS])
    np.testing.assert_allclose(scores[:, 0], oracle()["scores_type0"], atol=ATOL)


def test_a_pair_alone_and_among_others_scores_the_same(reranker):
    prompts = [reranker.pair(q, d) for q, d in PAIRS]
    small = Reranker(reranker.model, reranker.head, reranker.tokenizer, None, 64, batch_tokens=30)
    together = small.scores(prompts)   # several forward passes of one or two pairs
    alone = np.concatenate([reranker.scores([p]) for p in prompts])
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-6)


def test_the_converters_file_without_the_pooler_scores_by_the_classifier_alone(tmp_path, reranker):
    """convert_hf_to_gguf.py keeps BERT's classifier but not its pooler: cls.output over the [CLS] state."""
    path = copy_gguf(MODEL, tmp_path / "headless.gguf", keep=lambda name: name not in ("cls.weight", "cls.bias"))
    loaded = load(str(path), backend="cpu")
    headless = Reranker.from_file(loaded.model, loaded.source.file, loaded.tokenizer, 64)
    assert headless.head.dense is None
    scores = headless.scores([headless.pair(q, d) for q, d in PAIRS])
    np.testing.assert_allclose(scores[:, 0], oracle()["headless"], atol=ATOL)


def test_a_model_without_a_classification_head_cannot_rank():
    loaded = load(str(HERE / "tiny-bert-embed-f32.gguf"), backend="cpu")
    with pytest.raises(LlogosError, match="no classification head"):
        RankHead.from_gguf(loaded.source.file, loaded.model.cfg)


def qwen3_reranker(tmp_path):
    """tiny-qwen3-embed as convert_hf_to_gguf.py writes a Qwen3-Reranker: the LM head's rows of two
    tokens as cls.output (standing in for "yes" and "no"), labels, pooling rank, and a rerank template."""
    from gguf import GGUFReader
    table = next(t for t in GGUFReader(HERE / "tiny-qwen3-embed-f32.gguf").tensors if t.name == "token_embd.weight")
    rows = np.array(table.data)[[300, 200]]
    path = copy_gguf(HERE / "tiny-qwen3-embed-f32.gguf", tmp_path / "qwen3-rerank.gguf",
                     meta={TEMPLATE_KEY: "{query}{document}", "qwen3.pooling_type": 4,
                           "qwen3.classifier.output_labels": ["yes", "no"]},
                     tensors={"cls.output.weight": (rows, None)})
    return path, rows


def test_a_qwen3_reranker_scores_the_softmax_of_yes_and_no_at_the_last_token(tmp_path):
    path, rows = qwen3_reranker(tmp_path)
    loaded = load(str(path), backend="cpu")
    reranker = Reranker.from_file(loaded.model, loaded.source.file, loaded.tokenizer, 64)
    want, ids = embedding_oracle("tiny-qwen3-embed")
    texts = ["Hello world", "the quick brown fox runs to the main street"]
    prompts = [reranker.pair(text[:4], text[4:]) for text in texts]   # the template joins them again
    assert [p.ids for p in prompts] == ids[:2] and prompts[0].types is None
    logits = want["last"][:2] @ rows.T
    expected = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    got = reranker.scores(prompts)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert reranker.head.labels == ("yes", "no")


def test_a_converter_made_qwen3_reranker_scores_as_transformers():
    """Its prompts are the converter's rerank template read as transformers tokenizes it, and its
    scores transformers' softmax of the "yes" and "no" logits after the last token."""
    loaded = load(str(QWEN3), backend="cpu")
    reranker = Reranker.from_file(loaded.model, loaded.source.file, loaded.tokenizer, 512)
    want = oracle("tiny-qwen3-rerank")
    prompts = [reranker.pair(q, d) for q, d in PAIRS]
    assert [p.ids for p in prompts] == split(want, "ids")
    assert reranker.head.labels == ("yes", "no") and not reranker.head.first_token
    scores = reranker.scores(prompts)
    np.testing.assert_allclose(scores[:, 0], want["scores"], atol=ATOL)
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, atol=1e-6)


# ---------------------------------------------------------------------------------------- the CLI

def test_embed_pooling_rank_prints_a_score_a_line(env):  # noqa: F811
    lines = "".join(f"{q}\t{d}\n" for q, d in PAIRS)
    r = llogos(env, "embed", "-m", str(MODEL), "--pooling", "rank", stdin=lines)
    assert r.returncode == 0, r.stderr
    scores = oracle()["scores"]
    assert r.stdout.splitlines() == [f"rerank score {i}: {s:8.3f}" for i, s in enumerate(scores)]


def test_embed_pooling_rank_json_and_another_separator(env):  # noqa: F811
    r = llogos(env, "embed", "-m", str(MODEL), "--pooling", "rank", "--json", "--cls-separator", "<#seq#>",
               *[arg for q, d in PAIRS for arg in ("-p", f"{q}<#seq#>{d}")])
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["index"] for row in rows] == list(range(len(PAIRS)))
    np.testing.assert_allclose([row["score"] for row in rows], oracle()["scores"], atol=ATOL)


def test_embed_pooling_rank_of_a_qwen3_reranker_prints_each_label(env, tmp_path):  # noqa: F811
    path, _ = qwen3_reranker(tmp_path)   # its GGUF says pooling rank: no --pooling needed
    r = llogos(env, "embed", "-m", str(path), "-p", "Hell\to world")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split()[-1] for line in lines] == ["[yes]", "[no]"]
    assert abs(sum(float(line.split()[-2]) for line in lines) - 1.0) < 2e-3


def test_embed_of_a_converter_made_qwen3_reranker_prints_transformers_scores(env):  # noqa: F811
    r = llogos(env, "embed", "-m", str(QWEN3), "--json", *[arg for q, d in PAIRS for arg in ("-p", f"{q}\t{d}")])
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["index"] for row in rows] == list(range(len(PAIRS)))
    np.testing.assert_allclose([row["score"] for row in rows], oracle("tiny-qwen3-rerank")["scores"], atol=ATOL)


@pytest.mark.parametrize("args, fragment", [
    (("-m", str(HERE / "tiny-bert-embed-f32.gguf"), "--pooling", "rank", "-p", "a\tb"), "no classification head"),
    (("-m", str(MODEL), "--pooling", "rank", "-p", "a\tb\tc"), "3 parts"),
    (("-m", str(MODEL), "--pooling", "rank", "--cls-separator", "", "-p", "a"), "--cls-separator is empty"),
    (("-m", str(MODEL), "--pooling", "rank", "-p", "a\t" + "b " * 80), "more than the context"),
])
def test_embed_pooling_rank_refuses_with_one_line(env, args, fragment):  # noqa: F811
    assert_one_line_error(llogos(env, "embed", *args), fragment)


# ---------------------------------------------------------------------------------------- the server

def finish(server) -> None:
    server.stop()
    assert server.proc.returncode == 0, server.log.read_text()
    assert "Traceback" not in server.log.read_text()


@pytest.fixture(scope="module")
def compiled(env):  # noqa: F811
    """The CPU kernels compiled into env's cache before any server's start-up deadline runs."""
    r = llogos(env, "embed", "-m", str(MODEL), "--pooling", "rank", "-p", "a\tb")
    assert r.returncode == 0, r.stderr
    return env


@pytest.fixture(scope="module")
def server(compiled, tmp_path_factory):
    server = Server(compiled, tmp_path_factory.mktemp("rerank") / "log", "-m", str(MODEL), "--reranking",
                    "-np", "2", "-c", "64")
    yield server
    finish(server)


def test_v1_rerank_in_jina_and_cohere_shape(server):
    query = PAIRS[0][0]
    documents = [PAIRS[0][1], {"text": PAIRS[1][1]}]
    r = server.post("/v1/rerank", {"model": "any", "query": query, "documents": documents})
    assert r.status_code == 200, r.text
    body = r.json()
    want = oracle()["scores"][:2]
    assert body["object"] == "list" and body["model"] == "any"
    assert [x["index"] for x in body["results"]] == list(np.argsort(-want))
    np.testing.assert_allclose([x["relevance_score"] for x in body["results"]], np.sort(want)[::-1], atol=ATOL)
    assert all("document" not in x for x in body["results"])
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == sum(oracle()["lengths"][:2])


def test_top_n_and_return_documents(server):
    documents = ["the main street", "Hello world", "a", "We came, we saw: 12 white ones."]
    full = server.post("/v1/rerank", {"query": "where is the main street", "documents": documents}).json()
    top = server.post("/v1/rerank", {"query": "where is the main street", "documents": documents, "top_n": 2,
                                     "return_documents": True}).json()
    assert [x["index"] for x in top["results"]] == [x["index"] for x in full["results"][:2]]
    assert [x["document"]["text"] for x in top["results"]] == [documents[x["index"]] for x in top["results"]]
    scores = [x["relevance_score"] for x in full["results"]]
    assert scores == sorted(scores, reverse=True) and len(scores) == 4


@pytest.mark.parametrize("path", ["/rerank", "/reranking", "/v1/reranking"])
def test_llama_servers_other_paths(server, path):
    r = server.post(path, {"query": PAIRS[2][0], "documents": [PAIRS[2][1]]})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["results"][0]["relevance_score"], oracle()["scores"][2], atol=ATOL)


def test_tei_shape_where_the_request_gives_texts(server):
    r = server.post("/rerank", {"query": "what is a fox", "texts": [PAIRS[1][1], PAIRS[0][1]], "return_text": True})
    assert r.status_code == 200, r.text
    want = oracle()["scores"]
    assert r.json() == [{"index": i, "score": pytest.approx(float(want[1 - i]), abs=ATOL), "text": PAIRS[1 - i][1]}
                        for i in np.argsort(-want[[1, 0]])]


@pytest.mark.parametrize("body, param", [
    ({"documents": ["a"]}, "query"),
    ({"query": 3, "documents": ["a"]}, "query"),
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": [{"title": "no text"}]}, "documents"),
    ({"query": "q"}, None),
    ({"query": "q", "documents": ["a"], "texts": ["a"]}, None),
    ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ({"query": "q", "documents": ["a"], "rank_fields": ["text"]}, "rank_fields"),
    ({"query": "q", "documents": ["a", "b " * 80]}, "documents"),
])
def test_bad_requests_are_400_in_openai_shape(server, body, param):
    r = server.post("/v1/rerank", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_a_server_not_started_to_rerank_says_how(compiled, tmp_path_factory):
    plain = Server(compiled, tmp_path_factory.mktemp("plain") / "log", "-m", str(MODEL), "-np", "1", "-c", "64")
    try:
        r = plain.post("/v1/rerank", {"query": "q", "documents": ["a"]})
        assert r.status_code == 501, r.text
        assert "--reranking" in r.json()["error"]["message"]
    finally:
        finish(plain)


def test_distinct_concurrent_requests_on_a_cold_router(compiled, tmp_path_factory):
    """--pooling rank turns reranking on too; each model loads on its first request, while the
    others wait for it, and each request gets its own pairs' scores; a model without a
    classification head answers 400."""
    router = Server(compiled, tmp_path_factory.mktemp("router") / "log", "-m", str(MODEL), "-m",
                    str(HERE / "tiny-bert-embed-f32.gguf"), "--pooling", "rank", "-np", "2", "-c", "64")
    try:
        def ask(i: int):
            query, document = PAIRS[i]
            return router.post("/v1/rerank", {"model": NAME + "-f32", "query": query, "documents": [document]})

        with ThreadPoolExecutor(len(PAIRS)) as pool:
            replies = list(pool.map(ask, range(len(PAIRS))))
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
        got = [r.json()["results"][0]["relevance_score"] for r in replies]
        np.testing.assert_allclose(got, oracle()["scores"], atol=ATOL)
        r = router.post("/v1/rerank", {"model": "tiny-bert-embed-f32", "query": "q", "documents": ["a"]})
        assert r.status_code == 400 and "no classification head" in r.json()["error"]["message"], r.text
    finally:
        finish(router)


def test_v1_rerank_of_a_converter_made_qwen3_reranker(compiled, tmp_path_factory):
    """Each query's documents ordered and scored as transformers scores them, whatever the batch."""
    server = Server(compiled, tmp_path_factory.mktemp("qwen3") / "log", "-m", str(QWEN3), "--reranking",
                    "-np", "2", "-c", "512")
    want = oracle("tiny-qwen3-rerank")
    try:
        by_query: dict[str, list[int]] = {}
        for i, (query, _) in enumerate(PAIRS):
            by_query.setdefault(query, []).append(i)
        for query, pairs in by_query.items():
            r = server.post("/v1/rerank", {"query": query, "documents": [PAIRS[i][1] for i in pairs],
                                           "return_documents": True})
            assert r.status_code == 200, r.text
            results = r.json()["results"]
            order = sorted(range(len(pairs)), key=lambda j: -want["scores"][pairs[j]])
            assert [x["index"] for x in results] == order
            np.testing.assert_allclose([x["relevance_score"] for x in results], want["scores"][[pairs[j] for j in order]],
                                       atol=ATOL)
            assert [x["document"]["text"] for x in results] == [PAIRS[pairs[j]][1] for j in order]
            assert r.json()["usage"]["prompt_tokens"] == sum(want["lengths"][pairs])
    finally:
        finish(server)
