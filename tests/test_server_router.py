"""`llogos serve` in router mode (llama-server's): -m given several times and --models-dir, each
request served by the model its `model` field names, loaded on its first request (once, however many
requests wait for it), the least recently used unloaded beyond --models-max, /v1/models listing every
model with its status, and an unknown model as a 404 naming the available ones."""

import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import lazy_import, need
from tests.vocab_fixtures import FIXTURES
from tests.test_cli import assert_one_line_error, env, llogos  # noqa: F401  (env is a fixture)
from tests.test_server import Server
from tests.test_server_native import compile_kernels

lazy_import("fastapi")

TINY = ["tiny-olmo2-f32", "tiny-granite-f32", "tiny-smollm3-f32"]
GREEDY = {"temperature": 0, "ignore_eos": True}
LOAD_S = 300


@pytest.fixture(scope="module")
def compiled(env):  # noqa: F811
    compile_kernels(env, str(need(FIXTURES / f"{TINY[0]}.gguf")))
    return env


@pytest.fixture(scope="module")
def router(compiled, tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    for name in TINY[1:]:
        (folder / f"{name}.gguf").symlink_to(need(FIXTURES / f"{name}.gguf"))
    (folder / "notes.txt").write_text("not a model")
    server = Server(compiled, folder / "log", "-m", str(FIXTURES / f"{TINY[0]}.gguf"), "--models-dir", str(folder),
                    "--models-max", "2", "-np", "2", "-c", "128")
    yield server
    server.stop()
    assert server.proc.returncode == 0, server.log.read_text()
    assert "Traceback" not in server.log.read_text()


def statuses(server) -> dict[str, str]:
    models = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    return {m["id"]: m["status"]["value"] for m in models}


def post(server, path, body) -> httpx.Response:
    # a model's first request waits for it to load, which a busy machine may stretch past a minute
    return httpx.post(server.url + path, json=body, timeout=LOAD_S)


def complete(server, model, prompt, **kw) -> dict:
    r = post(server, "/completion", {"model": model, "prompt": prompt, "n_predict": 4, **GREEDY, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_models_load_on_demand_once_and_route_by_name(router):
    assert statuses(router) == dict.fromkeys(TINY, "unloaded")   # nothing loads before it is asked for
    assert httpx.get(router.url + "/health", timeout=10).json() == {"status": "ok"}
    asks = [(TINY[0], "hello world"), (TINY[1], "the cat sat"), (TINY[0], "a b c d"), (TINY[1], "one two")]
    with ThreadPoolExecutor(len(asks)) as pool:   # cold: both models load while their requests wait
        replies = list(pool.map(lambda a: complete(router, *a, return_tokens=True), asks))
    for (model, prompt), reply in zip(asks, replies):
        assert reply["model"] == model
        ids = post(router, "/tokenize", {"model": model, "content": prompt, "add_special": True}).json()["tokens"]
        assert reply["tokens_evaluated"] == len(ids) and len(reply["tokens"]) == 4
        alone = complete(router, model, prompt, return_tokens=True)   # the same model answers the same
        assert (alone["content"], alone["tokens"]) == (reply["content"], reply["tokens"])
    log = router.log.read_text()
    assert [log.count(f"loaded {m} on") for m in TINY] == [1, 1, 0]
    assert statuses(router) == {TINY[0]: "loaded", TINY[1]: "loaded", TINY[2]: "unloaded"}
    oai = post(router, "/v1/completions", {"model": TINY[1], "prompt": "the cat sat", "max_tokens": 4, **GREEDY})
    assert oai.json()["model"] == TINY[1] and oai.json()["choices"][0]["text"] == replies[1]["content"]


def test_least_recently_used_is_unloaded_beyond_models_max(router):
    before = complete(router, TINY[0], "repeat after me")
    complete(router, TINY[1], "x")   # TINY[0] is now the least recently used
    third = complete(router, TINY[2], "a third model")
    assert third["model"] == TINY[2]
    assert statuses(router) == {TINY[0]: "unloaded", TINY[1]: "loaded", TINY[2]: "loaded"}
    assert re.search(rf"unloaded {TINY[0]}$", router.log.read_text(), re.M)
    again = complete(router, TINY[0], "repeat after me")   # loaded again, answering as before
    assert again["content"] == before["content"]
    assert list(statuses(router).values()).count("loaded") == 2


def test_get_endpoints_take_the_model_as_a_query(router):
    props = httpx.get(router.url + "/props", params={"model": TINY[1]}, timeout=LOAD_S).json()
    assert props["model_alias"] == TINY[1] and props["model_path"].endswith(f"{TINY[1]}.gguf")
    slots = httpx.get(router.url + "/slots", params={"model": TINY[1]}, timeout=LOAD_S).json()
    assert [s["id"] for s in slots] == [0, 1]


@pytest.mark.parametrize("model, status", [("no-such-model", 404), (None, 400)])
def test_unknown_or_missing_model_is_an_error_naming_the_available(router, model, status):
    body = {"prompt": "x", "n_predict": 1} | ({"model": model} if model else {})
    for path in ("/completion", "/v1/completions"):
        r = post(router, path, body)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["param"] == "model" and all(name in error["message"] for name in TINY)
    assert httpx.get(router.url + "/props", timeout=10).status_code == 400


def test_models_dir_that_is_not_there_is_a_one_line_error(compiled, tmp_path):
    r = llogos(compiled, "serve", "--port", "0", "--models-dir", str(tmp_path / "missing"))
    assert_one_line_error(r, "missing")
    r = llogos(compiled, "serve", "--port", "0", "--models-dir", str(tmp_path))
    assert_one_line_error(r, "no .gguf files")
    r = llogos(compiled, "serve", "--port", "0", "-m", "smollm2-135m", "-m", str(tmp_path / "gone.gguf"))
    assert_one_line_error(r, "gone.gguf")
