"""Load test for an OpenAI-compatible server on loopback: `llogos serve` or `llama-server`, measured
by the same client.

At each concurrency, that many clients stream /v1/completions requests (fixed prompts, greedy,
ignore_eos, so every request generates exactly --max-tokens) until --requests have been sent or the
time limit passes. Reports requests/s, generated tokens/s, time to first token and inter-token
latency (p50/p99), and how many requests failed.

    llogos serve -m smollm2-135m -np 32 --port 8080 &
    python bench/bench_serve.py --url http://127.0.0.1:8080 --concurrency 1,8,32
"""

import argparse
import asyncio
import ipaddress
import json
import sys
import time
from urllib.parse import urlparse

import httpx

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three laws of thermodynamics are", "1, 2, 3, 4,", "A good recipe for pancakes needs",
           "In 1969, the first humans", "The quick brown fox"]


def loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def one(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    stamps = []
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return {"ok": False, "why": f"HTTP {r.status_code}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return {"ok": False, "why": event["error"].get("message", "error")}
            if event.get("choices") and event["choices"][0].get("text"):
                stamps.append(time.perf_counter())
    if not stamps:
        return {"ok": False, "why": "no tokens"}
    return {"ok": True, "ttft": stamps[0] - t0, "gaps": [b - a for a, b in zip(stamps, stamps[1:])],
            "tokens": len(stamps)}


async def level(url: str, clients: int, n_requests: int, max_tokens: int, limit_s: float) -> dict:
    queue = list(range(n_requests))
    results: list[dict] = []
    deadline = time.perf_counter() + limit_s

    async def worker(client):
        while queue and time.perf_counter() < deadline:
            i = queue.pop(0)
            try:
                results.append(await one(client, url, PROMPTS[i % len(PROMPTS)], max_tokens))
            except httpx.HTTPError as e:
                results.append({"ok": False, "why": type(e).__name__})

    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=limit_s, limits=httpx.Limits(max_connections=clients)) as client:
        await asyncio.gather(*(worker(client) for _ in range(clients)))
    elapsed = time.perf_counter() - t0
    good = [r for r in results if r["ok"]]
    ttft = sorted(r["ttft"] for r in good)
    gaps = sorted(g for r in good for g in r["gaps"])
    return {"clients": clients, "sent": len(results), "failed": len(results) - len(good),
            "unsent": n_requests - len(results), "elapsed_s": round(elapsed, 2),
            "requests_per_s": round(len(good) / elapsed, 3),
            "tokens_per_s": round(sum(r["tokens"] for r in good) / elapsed, 2),
            "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
            "itl_p50_ms": pct(gaps, 50), "itl_p99_ms": pct(gaps, 99)}


def pct(sorted_values: list[float], p: float) -> float | None:
    if not sorted_values:
        return None
    return round(sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * p / 100))] * 1e3, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="the server, on loopback")
    ap.add_argument("--concurrency", default="1,8,32", help="comma-separated client counts")
    ap.add_argument("--requests", type=int, default=0, help="requests per level [default: 4 per client, at least 8]")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--time-limit", type=float, default=180.0, help="seconds per level")
    ap.add_argument("--label", default="", help="a name for the server in the output")
    a = ap.parse_args()
    if not loopback(a.url):
        sys.exit("bench_serve only loads servers on loopback")
    httpx.get(a.url + "/health", timeout=10).raise_for_status()
    for clients in (int(c) for c in a.concurrency.split(",")):
        n = a.requests or max(8, 4 * clients)
        row = asyncio.run(level(a.url, clients, n, a.max_tokens, a.time_limit))
        print(json.dumps({"server": a.label, "max_tokens": a.max_tokens, **row}), flush=True)


if __name__ == "__main__":
    main()
