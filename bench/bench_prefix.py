"""Prefix caching through an OpenAI-compatible server on loopback: many chat requests sharing a long
system prompt, as an agent or a chat client sends them.

Phase 1 (one client): a cold request (a system prompt the server has not seen: a fresh nonce opens
it), then --warm requests with the same system prompt and other questions; time to first token of
each. Phase 2: --clients clients stream --requests requests that share another fresh system prompt;
requests/s and generated tokens/s. Run it against the same server with the cache on and off:

    llogos serve -m smollm2-135m -np 4 -c 2048 --port 8080 &
    python bench/bench_prefix.py --url http://127.0.0.1:8080 --label cache
    llogos serve -m smollm2-135m -np 4 -c 2048 --port 8081 --no-cache-prompt &
    python bench/bench_prefix.py --url http://127.0.0.1:8081 --label no-cache
"""

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid

import httpx

from bench_serve import loopback

QUESTIONS = ["When do you open on Sundays?", "Do you sell rye bread?", "Can I order a cake for Friday?",
             "Is the croissant made with butter?", "Do you deliver?", "Which breads are vegan?",
             "How long does sourdough keep?", "Can I pay by card?", "Do you have gluten-free cakes?",
             "What is in the seeded loaf?", "Are you open on holidays?", "Can I reserve a baguette?"]


def system_prompt(nonce: str, words: int) -> str:
    """About 1.3 tokens a word in SmolLM2's vocabulary: 760 words are ~1,000 tokens."""
    rules = [f"Rule {i}: answer questions about item {i} of the menu politely, briefly and only from the "
             f"price list, and say so when you do not know." for i in range(words // 25 + 1)]
    return f"[{nonce}] You are the assistant of a bakery. " + " ".join(rules)


async def one(client: httpx.AsyncClient, url: str, system: str, question: str, max_tokens: int) -> dict:
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, tokens, usage = None, 0, None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            if event.get("choices") and event["choices"][0]["delta"].get("content"):
                first = first or time.perf_counter()
                tokens += 1
    return {"ttft_ms": (first - t0) * 1e3 if first else None, "pieces": tokens, "usage": usage}


async def run(a) -> dict:
    # A connection per request: llama-server closes idle keep-alive connections that httpx would reuse.
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        system = system_prompt(uuid.uuid4().hex[:8], a.words)
        cold = await one(client, a.url, system, QUESTIONS[0], a.max_tokens)
        warm = [await one(client, a.url, system, q, a.max_tokens) for q in QUESTIONS[1:a.warm + 1]]
        shared = system_prompt(uuid.uuid4().hex[:8], a.words)
        queue = list(range(a.requests))
        done: list[dict] = []

        async def worker():
            while queue:
                i = queue.pop()
                done.append(await one(client, a.url, shared, QUESTIONS[i % len(QUESTIONS)], a.max_tokens))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(a.clients)))
        elapsed = time.perf_counter() - t0
    warm_ttft = statistics.median(w["ttft_ms"] for w in warm)
    return {"server": a.label, "prompt_tokens": cold["usage"]["prompt_tokens"],
            "cold_ttft_ms": round(cold["ttft_ms"], 1), "warm_ttft_ms": round(warm_ttft, 1),
            "warm_over_cold": round(warm_ttft / cold["ttft_ms"], 3),
            "warm_cached_tokens": warm[-1]["usage"]["prompt_tokens_details"]["cached_tokens"],
            "clients": a.clients, "requests": a.requests, "elapsed_s": round(elapsed, 2),
            "requests_per_s": round(a.requests / elapsed, 3),
            "generated_tok_per_s": round(sum(d["usage"]["completion_tokens"] for d in done) / elapsed, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="the server, on loopback")
    ap.add_argument("--words", type=int, default=760, help="words of system prompt (~1.3 tokens each)")
    ap.add_argument("--warm", type=int, default=11, help="warm requests after the cold one")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=24, help="requests of the throughput phase")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    if not loopback(a.url):
        sys.exit("bench_prefix only loads servers on loopback")
    httpx.get(a.url + "/health", timeout=10).raise_for_status()
    print(json.dumps(asyncio.run(run(a))), flush=True)


if __name__ == "__main__":
    main()
