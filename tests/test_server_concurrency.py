"""`llogos serve` answering many distinct requests at once from a cold start, each with its own
prompt's answer (plain, and structured with a schema of its own), and cancelling a request whose
client has gone."""

import asyncio
import json

import httpx
import jsonschema
import pytest

from tests.conftest import lazy_import
from tests.test_cli import env, llogos  # noqa: F401  (env is a fixture)
from tests.test_server import Server, wait_until

lazy_import("fastapi")

N_PREDICT = 4
NEAR_TIE = 0.01   # a reference whose top two log-probabilities are closer than this may flip


def _prompts() -> list[dict]:
    """48 distinct requests, chat and plain, mixing digits, accents, CJK and emoji: a tokenizer
    that learns its characters as it goes meets new ones in almost every request."""
    extras = ["", "é à ç", "Straße", "日本語", "😀🎉", "中文 文本", "ñandú", "한국어", "🇯🇵 👍🏽", "Ωμέγα", "naïve", "№ 5"]
    requests = []
    for i in range(48):
        text = f"Fact number {i * 37 + 5}: {extras[i % len(extras)]} the"
        if i % 3 == 2:
            requests.append({"id": str(i), "messages": [{"role": "user", "content": text}]})
        else:
            requests.append({"id": str(i), "prompt": text})
    return requests


def _alone(env, requests) -> dict[str, dict]:
    """What `llogos batch` answers for each request, one at a time."""
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    done = llogos(env, "batch", "-m", "smollm2-135m", "-np", "1", "-c", "256", "-n", str(N_PREDICT), "--temp", "0",
                  "--logprobs", "2", "--cpu-weights", "f32", stdin=lines)   # the servers' weights (--cpu-weights f32)
    assert done.returncode == 0, done.stderr
    return {r["id"]: r for r in map(json.loads, done.stdout.splitlines())}


def _decisive(result: dict) -> bool:
    return all(top[0][1] - top[1][1] >= NEAR_TIE for top in result["logprobs"])


async def _ask(client: httpx.AsyncClient, url: str, request: dict, stream: bool) -> str:
    chat = "messages" in request
    body = {k: v for k, v in request.items() if k != "id"} | {"max_tokens": N_PREDICT, "temperature": 0,
                                                              "stream": stream}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if not stream:
        r = await client.post(url + path, json=body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        return choice["message"]["content"] if chat else choice["text"]
    parts = []
    async with client.stream("POST", url + path, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[len("data: "):])["choices"]
                if choice:
                    parts.append((choice[0]["delta"].get("content") if chat else choice[0]["text"]) or "")
    return "".join(parts)


def test_cold_servers_answer_concurrent_distinct_prompts_with_their_own_answers(env, tmp_path):
    requests = _prompts()
    alone = _alone(env, requests)
    checked = [r for r in requests if _decisive(alone[r["id"]])]
    assert len(checked) >= 40, "too many near-ties to check the answers"

    async def everyone(url):
        async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=64)) as client:
            return await asyncio.gather(*(_ask(client, url, r, stream=k % 2 == 0) for k, r in enumerate(checked)))

    for start in range(2):   # each a fresh process: a cold tokenizer, templates and caches
        server = Server(env, tmp_path / f"log{start}", "-m", "smollm2-135m", "-np", "8", "-c", "256", "--cpu-weights", "f32")
        try:
            answers = asyncio.run(everyone(server.url))
        finally:
            server.stop()
        wrong = [(r["id"], a, alone[r["id"]]["text"]) for r, a in zip(checked, answers) if a != alone[r["id"]]["text"]]
        assert not wrong, f"cold start {start}: {wrong}"


def test_a_non_streaming_request_whose_client_leaves_is_cancelled(env, tmp_path):
    server = Server(env, tmp_path / "log", "-m", "smollm2-135m", "-np", "2", "-c", "512")
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(60, read=1.5))
        # Waited for without a short limit: a request the server did not see leave would run to its
        # end and count as finished, not cancelled.
        wait_until(lambda: server.metrics()["llogos_slots_busy"] == 0, "the slot kept generating for a client that left")
        m = server.metrics()
        assert m['llogos_requests_total{outcome="cancelled"}'] == 1
        assert m["llogos_generated_tokens_total"] < 400
        r = server.post("/v1/completions", {"prompt": "Hello", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    finally:
        server.stop()
    assert server.proc.returncode == 0
    assert "Traceback" not in server.log.read_text()


STRUCTURED = [
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                      "people": {"type": "integer", "minimum": 0, "maximum": 10 ** 7}},
     "required": ["city", "people"], "additionalProperties": False},
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 10}},
     "required": ["ok", "note"], "additionalProperties": False},
    {"anyOf": [{"type": "object", "properties": {"kind": {"const": "cat"},
                                                 "lives": {"type": "integer", "minimum": 1, "maximum": 9}},
                "required": ["kind", "lives"], "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"],
                "additionalProperties": False}]},
]


def test_a_cold_server_constrains_concurrent_requests_each_by_its_own_schema(env, tmp_path):
    """Rows of four schemas side by side, sampled, half streamed, two choices each: every mask is
    computed beside the forward pass on the mask thread, and each answer is valid for its own schema."""
    async def ask(client, url, i):
        schema = STRUCTURED[i % len(STRUCTURED)]
        body = {"messages": [{"role": "user", "content": f"Answer {i} in JSON."}], "max_tokens": 80, "n": 2,
                "temperature": 1.0, "seed": i, "stream": i % 2 == 0,
                "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}}}
        if not body["stream"]:
            r = await client.post(url + "/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            return schema, [c["message"]["content"] for c in r.json()["choices"]]
        texts = ["", ""]
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[len("data: "):])["choices"]:
                        texts[choice["index"]] += choice["delta"].get("content") or ""
        return schema, texts

    async def everyone(url):
        async with httpx.AsyncClient(timeout=300) as client:
            return await asyncio.gather(*(ask(client, url, i) for i in range(8)))

    server = Server(env, tmp_path / "log", "-m", "smollm2-135m", "-np", "8", "-c", "512")
    try:
        answers = asyncio.run(everyone(server.url))
    finally:
        server.stop()
    for schema, texts in answers:
        for text in texts:
            jsonschema.validate(json.loads(text), schema)
    assert "Traceback" not in server.log.read_text()
