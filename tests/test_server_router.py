"""`llogos serve` in router mode (llama-server's): -m given several times and --models-dir, each
request served by the model its `model` field names, loaded on its first request (once, however many
requests wait for it), the least recently used unloaded beyond --models-max or --models-memory (by
each model's footprint), /models/load and /models/unload, an unload never cutting a running stream,
/metrics per model, /v1/models listing every model with its status, a request's ?autoload=true|false
over --models-autoload, a -md draft model counted in each model's footprint, and an unknown model as
a 404 naming the available ones."""

import asyncio
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import pytest

from tests.conftest import FIXTURES as SHARED_FIXTURES
from tests.conftest import lazy_import, need
from tests.vocab_fixtures import FIXTURES
from tests.test_cli import assert_one_line_error, env, llogos  # noqa: F401  (env is a fixture)
from tests.test_server import Server
from tests.test_server_native import compile_kernels
from llogos_cli.engine.draft_model import draft_footprint
from llogos_cli.engine.prefix_cache import BLOCK_SIZE
from llogos_cli.engine.speculation import SpecParams
from llogos_cli.model.loader import LoadOptions
from llogos_cli.server.errors import ApiError
from llogos_cli.server.router import HoldModels, Limits, Router

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
                    "--models-max", "2", "-np", "2", "-c", "128", "--context-shift")
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


class Models:
    """open/load/unload for a Router without models: each a footprint in bytes; what happened, in order,
    and the most ever loaded at once."""

    def __init__(self, sizes: dict[str, int]):
        self.sizes, self.events, self.most = sizes, [], 0
        self._lock, self._loaded = threading.Lock(), set()

    def open(self, name, source):
        return name, self.sizes[name]

    def load(self, name, opened):
        time.sleep(0.05)   # a load takes time: the requests that come meanwhile wait on it
        with self._lock:
            self.events.append(f"load {name}")
            self._loaded.add(name)
            self.most = max(self.most, len(self._loaded))
        return SimpleNamespace(name=name, footprint=self.sizes[name])

    def unload(self, loaded):
        with self._lock:
            self.events.append(f"unload {loaded.name}")
            self._loaded.discard(loaded.name)

    def router(self, **limits) -> Router:
        return Router({name: name for name in self.sizes}, self.open, self.load, self.unload, Limits(**limits))


async def use(router: Router, name: str, until: asyncio.Event | None = None, got_it: asyncio.Event | None = None):
    """A request to `name` through HoldModels, holding it until `until` is set (`got_it` set once it
    has it): the model it got."""
    got = []

    async def app(scope, receive, send):
        got.append(await router.get(name))
        if got_it is not None:
            got_it.set()
        if until is not None:
            await until.wait()

    await HoldModels(app)({"type": "http"}, None, None)
    return got[0].name


def test_router_loads_once_for_concurrent_requests_and_never_passes_models_max():
    models = Models({"a": 1, "b": 1, "c": 1})

    async def main():
        router = models.router(models_max=1)
        names = ["a", "b", "a", "c", "b", "a"]   # cold, all at once
        # without holds the loads would take each other's models away before their requests resume
        assert await asyncio.wait_for(asyncio.gather(*(use(router, n) for n in names)), 60) == names
        return router

    router = asyncio.run(main())
    assert models.most == 1 and sorted(e for e in models.events if e.startswith("load")) == ["load a", "load b",
                                                                                            "load c"]
    assert [router.status(n)["value"] for n in "abc"].count("loaded") == 1


def test_router_never_unloads_a_model_a_request_holds():
    models = Models({"a": 1, "b": 1})

    async def main():
        router = models.router(models_max=1)
        done = asyncio.Event()
        holding = asyncio.ensure_future(use(router, "a", until=done))
        while router.status("a")["value"] != "loaded":
            await asyncio.sleep(0.01)
        other = asyncio.ensure_future(use(router, "b"))
        await asyncio.sleep(0.3)   # b waits for room: a is held
        assert models.events == ["load a"] and router.status("b")["value"] == "loading"
        assert router.status("a")["value"] == "loaded"   # not marked for unloading: it serves on
        assert await asyncio.wait_for(use(router, "a"), 60) == "a"   # at once; the limit only ends a hang
        done.set()
        assert await asyncio.gather(holding, other) == ["a", "b"]

    asyncio.run(main())
    assert models.events == ["load a", "unload a", "load b"] and models.most == 1


def test_router_memory_budget_counts_footprints():
    models = Models({"small": 3, "mid": 5, "other": 4, "big": 11})

    async def main():
        router = models.router(memory=10)
        await use(router, "small")
        await use(router, "mid")   # 3 + 5 fit in 10
        await use(router, "small")   # mid is now the least recently used
        await use(router, "other")   # 3 + 5 + 4 do not: mid goes
        with pytest.raises(ApiError, match="more than --models-memory"):
            await use(router, "big")
        assert router.status("big") == {"value": "unloaded", "failed": True}
        assert [router.status(n)["value"] for n in ("small", "mid", "other")] == ["loaded", "unloaded", "loaded"]

    asyncio.run(main())
    assert models.events == ["load small", "load mid", "unload mid", "load other"]


def test_router_unload_during_use_waits_and_a_new_request_loads_again():
    models = Models({"a": 1})

    async def main():
        router = models.router()
        done, got_it = asyncio.Event(), asyncio.Event()
        # once the request has the model: an unload between the load and its resuming would take it away
        holding = asyncio.ensure_future(use(router, "a", until=done, got_it=got_it))
        await got_it.wait()
        router.unload("a")
        later = asyncio.ensure_future(use(router, "a"))
        await asyncio.sleep(0.2)
        assert router.status("a")["value"] == "unloading" and models.events == ["load a"]
        done.set()
        assert await asyncio.gather(holding, later) == ["a", "a"]
        with pytest.raises(ApiError, match="already loaded"):
            await router.load("a")

    asyncio.run(main())
    assert models.events == ["load a", "unload a", "load a"]


def test_router_autoload_of_a_request_overrides_the_servers():
    models = Models({"a": 1, "b": 1})

    async def main():
        router = models.router(autoload=False)
        with pytest.raises(ApiError, match="not loaded"):
            await router.get("a")
        assert await router.get("a", autoload=True) is not None   # ?autoload=true loads it all the same
        assert (await router.get("a", autoload=False)).name == "a"   # a loaded model serves either way
        open_router = models.router(autoload=True)
        with pytest.raises(ApiError, match="not loaded"):
            await open_router.get("b", autoload=False)
        assert open_router.status("b") == {"value": "unloaded"}

    asyncio.run(main())
    assert models.events == ["load a"]


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


def wait_for_status(server, model, value):
    deadline = time.monotonic() + LOAD_S
    while statuses(server)[model] != value:
        assert time.monotonic() < deadline, server.log.read_text()
        time.sleep(0.05)


def test_unload_waits_for_a_running_stream_and_a_new_request_loads_it_again(router):
    # with context shift the stream outlasts the 128-token context: seconds, long enough to unload during it
    model, body = TINY[1], {"prompt": "Once upon a time", "n_predict": 600, **GREEDY}
    whole = complete(router, model, body["prompt"], n_predict=600)
    loads = router.log.read_text().count(f"loaded {model} on")
    with httpx.stream("POST", router.url + "/completion", json={"model": model, "stream": True, **body},
                      timeout=LOAD_S) as stream, ThreadPoolExecutor(1) as pool:
        lines = stream.iter_lines()
        first = next(line for line in lines if line)
        assert post(router, "/models/unload", {"model": model}).json() == {"success": True}
        assert statuses(router)[model] == "unloading"   # held by the stream: it stays until that ends
        later = pool.submit(complete, router, model, "the cat sat")   # waits for the unload, then loads it
        chunks = [json.loads(line[6:]) for line in [first, *lines] if line]
        assert later.result()["model"] == model
    assert chunks[-1]["stop"] is True and chunks[-1]["tokens_predicted"] == 600   # not cut
    assert "".join(c["content"] for c in chunks) == whole["content"]
    log = router.log.read_text()
    assert log.count(f"loaded {model} on") == loads + 1 and re.search(rf"unloaded {model}$", log, re.M)
    assert statuses(router)[model] == "loaded"


def test_autoload_query_decides_per_request(router):
    model = TINY[2]
    if statuses(router)[model] != "unloaded":
        assert post(router, "/models/unload", {"model": model}).json() == {"success": True}
        wait_for_status(router, model, "unloaded")
    body = {"model": model, "prompt": "x", "n_predict": 1}
    for path in ("/completion?autoload=false", "/v1/completions?autoload=0"):
        r = post(router, path, body)
        assert r.status_code == 400 and "POST /models/load" in r.json()["error"]["message"], r.text
    r = httpx.get(router.url + "/props", params={"model": model, "autoload": "false"}, timeout=10)
    assert r.status_code == 400 and statuses(router)[model] == "unloaded"
    r = post(router, "/completion?autoload=maybe", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "autoload", r.text
    assert post(router, "/completion?autoload=true", body).json()["model"] == model
    assert post(router, "/completion?autoload=false", body).status_code == 200   # loaded now: served either way


def test_models_load_and_unload_endpoints(router):
    model = TINY[2]
    if statuses(router)[model] != "unloaded":
        assert post(router, "/models/unload", {"model": model}).json() == {"success": True}
        wait_for_status(router, model, "unloaded")
    r = post(router, "/models/unload", {"model": model})
    assert r.status_code == 400 and "not loaded" in r.json()["error"]["message"]
    assert post(router, "/models/load", {"model": model}).json() == {"success": True}
    assert statuses(router)[model] == "loaded"   # answered once loaded
    r = post(router, "/models/load", {"model": model})
    assert r.status_code == 400 and "already loaded" in r.json()["error"]["message"]
    for path in ("/models/load", "/models/unload"):
        assert post(router, path, {"model": "no-such-model"}).status_code == 404
        r = post(router, path, {})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("model")
    assert list(statuses(router).values()).count("loaded") <= 2   # --models-max 2 held throughout


def footprint_mib(name: str, cache_mib: int) -> float:
    options = LoadOptions(model_name=str(FIXTURES / f"{name}.gguf"), ctx_size=128, backend="cpu")
    return options.footprint(options.open(), 128, 2, BLOCK_SIZE, cache_mib << 20) / 2 ** 20


def test_memory_budget_unloads_by_footprint_and_metrics_are_per_model(compiled, tmp_path):
    sizes = [footprint_mib(name, 8) for name in TINY[:2]]
    budget = 12   # MiB: either model alone (an 8 MiB prefix pool and its weights and contexts), not both
    assert max(sizes) <= budget < sum(sizes)
    server = Server(compiled, tmp_path / "log", *[a for name in TINY[:2] for a in ("-m", str(FIXTURES / f"{name}.gguf"))],
                    "--models-memory", str(budget), "--cache-ram", "8", "-np", "2", "-c", "128")
    try:
        first = complete(server, TINY[0], "hello world")
        assert statuses(server) == {TINY[0]: "loaded", TINY[1]: "unloaded"}
        text = httpx.get(server.url + "/metrics", timeout=10).text
        assert f'llogos_generated_tokens_total{{model="{TINY[0]}"}} 4' in text
        assert f'llogos_requests_total{{model="{TINY[0]}",outcome="ok"}} 1' in text
        complete(server, TINY[1], "the cat sat", n_predict=3)
        assert statuses(server) == {TINY[0]: "unloaded", TINY[1]: "loaded"}   # --models-max 4 left room
        log = server.log.read_text()
        for name, size in zip(TINY, sizes):
            assert f"loaded {name} on cpu ({size:.0f} MiB)" in log
        one = httpx.get(server.url + "/metrics", params={"model": TINY[1]}, timeout=10).text
        assert f'llogos_generated_tokens_total{{model="{TINY[1]}"}} 3' in one and TINY[0] not in one
        assert complete(server, TINY[0], "hello world")["content"] == first["content"]
    finally:
        server.stop()
    assert server.proc.returncode == 0 and "Traceback" not in server.log.read_text()


def test_model_larger_than_the_budget_is_refused_and_no_autoload_waits_for_a_load(compiled, tmp_path):
    server = Server(compiled, tmp_path / "log", "-m", str(FIXTURES / f"{TINY[0]}.gguf"), "-m",
                    str(FIXTURES / f"{TINY[1]}.gguf"), "--models-memory", "4", "--cache-ram", "8", "-c", "128",
                    "--no-models-autoload")
    try:
        r = post(server, "/completion", {"model": TINY[0], "prompt": "x", "n_predict": 1})
        assert r.status_code == 400 and "POST /models/load" in r.json()["error"]["message"]
        r = post(server, "/models/load", {"model": TINY[0]})
        assert r.status_code == 503 and "--models-memory 4" in r.json()["error"]["message"]
        assert statuses(server) == dict.fromkeys(TINY[:2], "unloaded")
        models = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
        assert models[0]["status"] == {"value": "unloaded", "failed": True} and "failed" not in models[1]["status"]
    finally:
        server.stop()
    assert server.proc.returncode == 0 and "Traceback" not in server.log.read_text()


def test_draft_model_counts_in_each_routed_models_footprint(compiled, tmp_path):
    """-md loads a draft model beside each routed model: the budget holds both models without their
    drafts, not with them, so loading the second unloads the first."""
    draft = need(SHARED_FIXTURES / "tiny-llama-f32.gguf")
    options = LoadOptions(model_name=str(FIXTURES / f"{TINY[0]}.gguf"), ctx_size=128, backend="cpu")
    draft_mib = draft_footprint(SpecParams(spec_draft_model=str(draft)), options, 128, 2) / 2 ** 20
    sizes = [footprint_mib(name, 8) for name in TINY[:2]]
    budget = int(sum(sizes)) + 1
    assert draft_mib > 0.5 and sum(sizes) <= budget < sum(sizes) + 2 * draft_mib
    server = Server(compiled, tmp_path / "log", *[a for name in TINY[:2] for a in ("-m", str(FIXTURES / f"{name}.gguf"))],
                    "-md", str(draft), "--draft-p-min", "0", "--models-memory", str(budget), "--cache-ram", "8",
                    "-np", "2", "-c", "128")
    try:
        complete(server, TINY[0], "hello world", n_predict=8)
        text = httpx.get(server.url + "/metrics", timeout=10).text
        drafted = re.search(rf'llogos_draft_tokens_total{{model="{TINY[0]}"}} (\S+)', text)
        assert drafted and float(drafted.group(1)) > 0, text   # its draft model drafts
        complete(server, TINY[1], "the cat sat")
        assert statuses(server) == {TINY[0]: "unloaded", TINY[1]: "loaded"}
        log = server.log.read_text()
        for name, size in zip(TINY, sizes):
            assert f"loaded {name} on cpu ({size + draft_mib:.0f} MiB)" in log
    finally:
        server.stop()
    assert server.proc.returncode == 0 and "Traceback" not in server.log.read_text()
