"""Constrained decoding's cost: schema compile time, mask time per token, and decode tok/s with a
JSON Schema against the same model unconstrained, at 1 row (generate's path) and N rows (batch's).

Each constrained run (until its schema is complete, at most -n tokens a row) is followed at once by
an unconstrained run of as many tokens a row (--ignore-eos), and the ratio of each pair's rates is
reported (median of --repeat pairs), so load from other processes touches both sides alike. Greedy
throughout: the unconstrained row takes the on-device argmax, the constrained one the host mask.

    python bench/bench_structured.py [-m smollm2-135m] [--rows 16] [--repeat 3] [--masks inline]

--masks inline computes each constrained row's mask when it samples, after the forward pass (what
the engine did before masks were started beside it), for a before/after comparison in one build.
"""

import argparse
import statistics
import time

import numpy as np

from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.generation import Generation
from llogos_cli.engine.grammar import Grammar, Matcher
from llogos_cli.engine.sampling import Sampler, SamplingParams
from llogos_cli.engine.completion import Completion
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.model.loader import load
from llogos_cli.server.tool_calls import call_schema

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"}}, "required": ["name", "age", "email"],
        "additionalProperties": False},
    "invoice": {"type": "object", "$defs": {"line": {"type": "object", "properties": {
        "description": {"type": "string", "maxLength": 60}, "quantity": {"type": "integer", "minimum": 1},
        "unit_price": {"type": "number", "minimum": 0}}, "required": ["description", "quantity", "unit_price"],
        "additionalProperties": False}},
        "properties": {"number": {"type": "string", "pattern": "^INV-[0-9]{6}$"},
                       "date": {"type": "string", "format": "date"},
                       "currency": {"enum": ["EUR", "USD", "GBP"]},
                       "customer": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                                                     "vat": {"type": ["string", "null"]}},
                                    "required": ["name", "vat"], "additionalProperties": False},
                       "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}, "minItems": 1, "maxItems": 5},
                       "paid": {"type": "boolean"}},
        "required": ["number", "date", "currency", "customer", "lines", "paid"], "additionalProperties": False},
    "tool_call": call_schema([
        {"name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}},
        {"name": "search_web", "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1, "maximum": 20}},
            "required": ["query"]}}]),
}
PROMPT = ("Write the record as JSON. Alice Smith (alice@example.com, 34) bought 3 notebooks at 2.50 EUR "
          "on invoice INV-004211, 2024-03-05, paid.\nJSON:")


def compile_times(tokenizer, repeat: int) -> dict:
    """Per schema: checking it (no tokenizer) and its first matcher against the vocabulary, in ms."""
    out = {}
    for name, schema in SCHEMAS.items():
        check, first = [], []
        for i in range(repeat):
            variant = {**schema, "description": f"run {i}"}   # a new text each time, so nothing is cached
            t0 = time.perf_counter()
            grammar = Grammar.json_schema(variant)
            t1 = time.perf_counter()
            Matcher(grammar, tokenizer)
            t2 = time.perf_counter()
            check.append((t1 - t0) * 1e3)
            first.append((t2 - t1) * 1e3)
        out[name] = (statistics.median(check), statistics.median(first))
    return out


def step_overhead_us(tokenizer, grammar, n: int) -> float:
    """What a constrained step adds on the host, in us (median over a replayed output): the mask, the
    masked greedy pick and the matcher's advance, less the plain argmax the unconstrained row takes."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(tokenizer.n_vocab).astype(np.float32)
    matcher, sampler = Matcher(grammar, tokenizer), Sampler(SamplingParams(temp=0.0), 1024)
    constrained, plain = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        token_id = sampler.sample(logits, matcher.allowed(len(logits)))
        matcher.consume(token_id)
        t1 = time.perf_counter()
        int(np.argmax(logits))
        plain.append(time.perf_counter() - t1)
        constrained.append(t1 - t0)
        if matcher.done:
            matcher = Matcher(grammar, tokenizer)
    return (statistics.median(constrained) - statistics.median(plain)) * 1e6


def one_row(model, tokenizer, grammar, n: int) -> tuple[int, float]:
    """Tokens made and the ms they took (decode only: the prompt's evaluation is timed apart)."""
    prompt = tokenizer.encode(PROMPT)
    gen = Generation.alone(model, tokenizer, 1024, Request(0, prompt, SamplingParams(temp=0.0),
                                                           StopCriteria(n, ignore_eos=grammar is None), grammar=grammar))
    for _ in gen:
        pass
    return gen.timings.predicted_n, gen.timings.predicted_ms


def rows(model, tokenizer, grammar, n_rows: int, n: int) -> tuple[int, float]:
    """Tokens made by n_rows rows of the same prompt, and the ms the engine took (prefill included)."""
    engine = BatchEngine(model, tokenizer, n_rows, 1024)
    prompt = tokenizer.encode(PROMPT)
    requests = [Request(i, prompt, SamplingParams(temp=0.0), StopCriteria(n, ignore_eos=grammar is None),
                        grammar=grammar) for i in range(n_rows)]
    t0 = time.perf_counter()
    made = sum(len(r.tokens) for r in engine.generate(requests))
    return made, (time.perf_counter() - t0) * 1e3


MASK_WAIT = [0.0]   # seconds the sampling thread spent in Matcher.allowed (waiting for or computing masks)


def timing_mask_collection() -> None:
    allowed = Matcher.allowed

    def timed(self, n):
        t0 = time.perf_counter()
        mask = allowed(self, n)
        MASK_WAIT[0] += time.perf_counter() - t0
        return mask

    Matcher.allowed = timed


def paired(run, grammar, n_rows: int, n: int, repeat: int) -> tuple[int, float, float, float, float]:
    """The constrained run, then an unconstrained one of as many tokens a row, `repeat` times back to
    back: tokens, both rates (median), the median of the pairs' ratios, which a machine's other load
    disturbs least, and the median ms a step's thread spent on the rows' masks."""
    constrained, plain, ratios, waits = [], [], [], []
    for _ in range(repeat):
        MASK_WAIT[0] = 0.0
        made, ms = run(grammar, n)
        waits.append(MASK_WAIT[0] * 1e3 / (made / n_rows))
        base_made, base_ms = run(None, made // n_rows)
        constrained.append(made / ms * 1e3)
        plain.append(base_made / base_ms * 1e3)
        ratios.append(constrained[-1] / plain[-1])
    return (made, statistics.median(constrained), statistics.median(plain), statistics.median(ratios),
            statistics.median(waits))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("-n", type=int, default=96, help="unconstrained tokens per row")
    ap.add_argument("--masks", choices=["ahead", "inline"], default="ahead",
                    help="ahead: beside the forward pass (the engine's way); inline: when the row samples")
    ap.add_argument("--only-rows", action="store_true", help="skip compile times, host overhead and the 1-row runs")
    a = ap.parse_args()
    if a.masks == "inline":
        Completion.start_mask = lambda self: None
    loaded = load(a.model, "cpu", n_ctx=1024, n_slots=a.rows)
    model, tok = loaded.model, loaded.tokenizer
    Matcher(Grammar.json_object(), tok)   # the vocabulary view, built once per tokenizer
    if not a.only_rows:
        print("| schema | check (ms) | first matcher (ms) |\n|---|---|---|")
        times = compile_times(tok, a.repeat)
        for name, (check, first) in times.items():
            print(f"| {name} | {check:.2f} | {first:.2f} |")
        totals = [c + f for c, f in times.values()]
        print(f"compile, check + first matcher: median {statistics.median(totals):.2f} ms, "
              f"worst {max(totals):.2f} ms\n")
        print("| schema | host time a constrained step adds (us) |\n|---|---|")
        for name, schema in SCHEMAS.items():
            print(f"| {name} | {step_overhead_us(tok, Grammar.json_schema(schema), 200):.0f} |")
        print()
    timing_mask_collection()
    print("| rows | schema | tokens a row | constrained tok/s | unconstrained tok/s | ratio (median of pairs) "
          "| masks on the step's thread (ms/step) |")
    print("|---|---|---|---|---|---|---|")
    runs = [] if a.only_rows else [(1, lambda g, n: one_row(model, tok, g, n))]
    for n_rows, run in runs + [(a.rows, lambda g, n: rows(model, tok, g, a.rows, n))]:
        for name, schema in SCHEMAS.items():
            made, constrained, plain, ratio, wait = paired(run, Grammar.json_schema(schema), n_rows, a.n, a.repeat)
            print(f"| {n_rows} | {name} | {made // n_rows} | {constrained:.1f} | {plain:.1f} | {ratio:.0%} "
                  f"| {wait:.2f} |")


if __name__ == "__main__":
    main()
