"""`llogos serve` with prefix caching: cached_tokens in the usage (whole and streamed), the hit rate
in /metrics, --no-cache-prompt, and the same responses with the cache as without it."""

import json

import httpx
import pytest

from llogos_cli.engine.prefix_cache import BLOCK_SIZE
from tests.test_cli import env  # noqa: F401  (a fixture)
from tests.conftest import FIXTURES, lazy_import, need
from tests.test_server import Server, sse_events

lazy_import("fastapi")

SYSTEM = ("You are a careful assistant for a small bakery. Answer questions about opening hours, bread, "
          "cakes, allergies and orders in two sentences at most. ") * 6


def start(env, tmp_path_factory, *flags) -> Server:
    return Server(env, tmp_path_factory.mktemp("prefix") / "log", "-m", "smollm2-135m", "-np", "2", "-c", "1024",
                  *flags)


@pytest.fixture(scope="module")
def cached(env, tmp_path_factory):
    server = start(env, tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def uncached(env, tmp_path_factory):
    server = start(env, tmp_path_factory, "--no-cache-prompt")
    yield server
    server.stop()


def chat(question: str, system: str = SYSTEM, **extra) -> dict:
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 8, "temperature": 0, **extra}


def usage(server: Server, body: dict) -> dict:
    r = server.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def test_the_second_of_two_requests_sharing_a_long_prefix_reports_cached_tokens(cached):
    system = "Bakery A. " + SYSTEM   # a beginning no other test sends
    first = usage(cached, chat("When do you open?", system))
    second = usage(cached, chat("Do you sell rye bread?", system))
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    hit = second["prompt_tokens_details"]["cached_tokens"]
    # The slot the first request left continues to the token: the whole system prompt and the
    # template's tokens up to the question (whole blocks only, from the other slot).
    assert 0 < hit < second["prompt_tokens"]
    assert hit >= first["prompt_tokens"] - 2 * BLOCK_SIZE
    metrics = cached.metrics()
    assert metrics["llogos_prompt_tokens_cached_total"] >= hit
    assert 0 < metrics["llogos_prefix_cache_hit_rate"] <= 1


def test_the_streamed_usage_chunk_reports_cached_tokens(cached):
    system = "Bakery B. " + SYSTEM
    usage(cached, chat("When do you open?", system))
    body = chat("Is there gluten-free cake?", system, stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", cached.url + "/v1/chat/completions", timeout=60, content=json.dumps(body)) as r:
        chunks = [json.loads(e) for e in sse_events(r.read().decode())[:-1]]
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_responses_are_the_same_with_and_without_the_cache(cached, uncached):
    """A conversation's turns and requests sharing a system prompt; text completions too."""
    questions = ["When do you open?", "Do you sell rye bread?", "Can I order a birthday cake?"]
    bodies = [chat(q, "Bakery C. " + SYSTEM, logprobs=True, top_logprobs=2) for q in questions]
    turn = chat("When do you open?", "Bakery C. " + SYSTEM)
    turn["messages"] += [{"role": "assistant", "content": "We open at seven."},
                         {"role": "user", "content": "And on Sundays?"}]
    bodies.append(turn)
    for body in bodies:
        with_cache, without = (s.post("/v1/chat/completions", body).json() for s in (cached, uncached))
        assert with_cache["choices"][0]["message"] == without["choices"][0]["message"]
        assert with_cache["usage"]["prompt_tokens"] == without["usage"]["prompt_tokens"]
        assert without["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        if body.get("logprobs"):
            for a, b in zip(with_cache["choices"][0]["logprobs"]["content"],
                            without["choices"][0]["logprobs"]["content"]):
                assert a["token"] == b["token"] and abs(a["logprob"] - b["logprob"]) < 1e-3
    assert with_cache["usage"]["prompt_tokens_details"]["cached_tokens"] > 0   # the last turn hit
    prompt = {"prompt": "Bakery C. " + SYSTEM + "Our best bread is", "max_tokens": 8, "temperature": 0}
    texts = [s.post("/v1/completions", prompt).json()["choices"][0]["text"] for s in (cached, uncached)]
    assert texts[0] == texts[1]
    assert uncached.metrics()["llogos_prompt_tokens_cached_total"] == 0


def test_a_recurrent_model_continues_the_slot_its_last_request_left(env, tmp_path_factory):
    """Qwen3.5's hybrid layers: no shared blocks, but the slot's state, marked before the prompt's
    last token, serves a next prompt that begins with that one; the same text as without it."""
    path = str(need(FIXTURES / "tiny-qwen35-f32.gguf"))
    servers = [Server(env, tmp_path_factory.mktemp("recurrent") / "log", "-m", path, "-np", "1", "-c", "128", *flags)
               for flags in ((), ("--no-cache-prompt",))]
    try:
        prompt = list(range(5, 45))
        answers = []
        for body in ({"prompt": prompt, "max_tokens": 6, "temperature": 0},
                     {"prompt": prompt + [50, 51, 52], "max_tokens": 6, "temperature": 0, "logprobs": 2}):
            answers.append([s.post("/v1/completions", body).json() for s in servers])
        for cached, uncached in answers:
            assert cached["choices"][0]["text"] == uncached["choices"][0]["text"]
            assert uncached["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert answers[0][0]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert answers[1][0]["usage"]["prompt_tokens_details"]["cached_tokens"] == len(prompt) - 1
        ours, theirs = (a["choices"][0]["logprobs"]["top_logprobs"] for a in answers[1])
        for a, b in zip(ours, theirs):
            assert a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-4 for k in a)
    finally:
        for s in servers:
            s.stop()
