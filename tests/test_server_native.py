"""llama-server's native endpoints on `llogos serve`: /completion (whole and streamed, ids and mixed
prompts, several prompts in one request, n_probs, return_tokens, stop words, timings), /tokenize with pieces, /detokenize,
/apply-template, /slots, /v1/health and /props, each checked against the model's own tokenizer and the
OpenAI endpoints' answers, and bad bodies as 400s with the error object."""

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import lazy_import
from tests.test_cli import env  # noqa: F401  (env is a fixture)
from tests.test_server import WAIT_S, Server, smol, wait_until  # noqa: F401  (smol is a fixture: smollm2, 8 slots of 512)

lazy_import("fastapi")

COMPILE_S = 900   # the first compile of the CPU kernels, which a busy machine may stretch past minutes

GREEDY = {"temperature": 0, "ignore_eos": True}


def compile_kernels(env, model: str) -> None:
    """The CPU kernels a server runs (those of a batch of several slots) compiled into env's cache by a
    command with no start-up deadline, which a server's first start on a fresh cache may outrun on a
    busy machine."""
    r = subprocess.run([sys.executable, "-m", "llogos_cli", "batch", "-m", model, "-np", "2", "-n", "1"],
                       input="x\ny\n", env=env, capture_output=True, text=True, timeout=COMPILE_S)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module", autouse=True)
def compiled(env):  # noqa: F811
    """Before test_server's smol starts on env."""
    compile_kernels(env, "smollm2-135m")
    return env


def post(server, path, body) -> dict:
    r = server.post(path, body)
    assert r.status_code == 200, r.text
    return r.json()


def tokens(server, text, **kw) -> list[int]:
    return post(server, "/tokenize", {"content": text, **kw})["tokens"]


def test_completion_matches_v1_completions_with_native_fields(smol):
    prompts = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "def fib(n):"]
    with ThreadPoolExecutor(len(prompts)) as pool:   # concurrent, distinct: each reply is its own prompt's
        native = list(pool.map(lambda p: post(smol, "/completion", {"prompt": p, "n_predict": 6, "return_tokens": True,
                                                                    **GREEDY}), prompts))
    for prompt, reply in zip(prompts, native):
        oai = post(smol, "/v1/completions", {"prompt": prompt, "max_tokens": 6, "return_tokens": True, **GREEDY})
        assert reply["content"] == oai["choices"][0]["text"]
        assert reply["tokens"] == oai["choices"][0]["tokens"] and len(reply["tokens"]) == 6
        assert reply["stop"] is True and reply["stop_type"] == "limit" and reply["stopped_limit"] is True
        assert reply["tokens_predicted"] == 6
        assert reply["tokens_evaluated"] == len(tokens(smol, prompt, add_special=True))
        assert reply["timings"]["predicted_n"] == 6 and reply["timings"]["prompt_n"] >= 0
    assert len({r["content"] for r in native}) == len(prompts)


def test_prompt_as_ids_and_mixed_list_is_the_same_prompt(smol):
    ids = tokens(smol, "The sky is blue and")
    whole = post(smol, "/completion", {"prompt": "The sky is blue and", "n_predict": 5, **GREEDY})
    by_ids = post(smol, "/completion", {"prompt": ids, "n_predict": 5, **GREEDY})
    head = tokens(smol, "The sky is")
    mixed = post(smol, "/completion", {"prompt": [*head, " blue and"], "n_predict": 5, **GREEDY})
    assert by_ids["content"] == whole["content"]
    assert mixed["tokens_evaluated"] == len(head) + len(tokens(smol, " blue and"))
    assert not by_ids["tokens"]   # only with return_tokens


def test_n_probs_and_stop_word(smol):
    reply = post(smol, "/completion", {"prompt": "Count: 1, 2, 3,", "n_predict": 4, "n_probs": 3, **GREEDY})
    probs = reply["completion_probabilities"]
    assert len(probs) == 4
    for p in probs:
        assert len(p["top_logprobs"]) == 3
        assert p["id"] == p["top_logprobs"][0]["id"]   # greedy: the likeliest
        assert p["logprob"] == p["top_logprobs"][0]["logprob"] <= 0
        assert bytes(p["bytes"]).decode() == p["token"]
    assert "".join(p["token"] for p in probs) == reply["content"]
    free = post(smol, "/completion", {"prompt": "Count: 1, 2, 3,", "n_predict": 8, **GREEDY})["content"]
    word = free.strip()[:1]
    stopped = post(smol, "/completion", {"prompt": "Count: 1, 2, 3,", "n_predict": 8, "stop": [word, "zzz"],
                                         **GREEDY})
    assert stopped["stop_type"] == "word" and stopped["stopped_word"] and stopped["stopping_word"] == word
    assert stopped["content"] == free[:free.index(word)]


def test_streamed_completion_joins_to_the_whole(smol):
    body = {"prompt": "Paris is a city in", "n_predict": 7, **GREEDY}
    whole = post(smol, "/completion", body)
    with httpx.stream("POST", smol.url + "/completion", content=json.dumps({**body, "stream": True}),
                      timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and "data: [DONE]" not in lines
    chunks = [json.loads(line[6:]) for line in lines]
    assert [c["stop"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert all(len(c["tokens"]) == 1 for c in chunks[:-1])
    assert chunks[-1]["tokens_predicted"] == 7 and chunks[-1]["timings"]["predicted_n"] == 7


def test_tokenize_pieces_and_detokenize_round_trip(smol):
    text = "héllo wörld 🎉 <|im_start|>"
    ids = tokens(smol, text)
    assert tokens(smol, text, add_special=True) == ids   # smollm2 adds no BOS
    assert len(tokens(smol, text, parse_special=False)) > len(ids)   # the marker as plain text
    pieces = tokens(smol, text, with_pieces=True)
    assert [p["id"] for p in pieces] == ids
    raw = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces)
    assert raw.decode() == text
    assert any(isinstance(p["piece"], list) for p in pieces)   # the emoji's bytes span tokens
    assert post(smol, "/detokenize", {"tokens": ids})["content"] == text
    assert post(smol, "/detokenize", {"tokens": []})["content"] == ""


def test_apply_template_is_the_chat_prompt(smol):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]
    prompt = post(smol, "/apply-template", {"messages": messages})["prompt"]
    assert prompt.rstrip().endswith("<|im_start|>assistant") and "Name a color." in prompt
    chat = post(smol, "/v1/chat/completions", {"messages": messages, "max_tokens": 5, "temperature": 0})
    native = post(smol, "/completion", {"prompt": prompt, "n_predict": 5, "temperature": 0})
    assert chat["usage"]["prompt_tokens"] == native["tokens_evaluated"]
    assert chat["choices"][0]["message"]["content"] == native["content"]


def test_slots_health_and_props(smol):
    states = httpx.get(smol.url + "/slots", timeout=10).json()
    assert [s["id"] for s in states] == list(range(8))
    assert all(s["n_ctx"] == 512 and s["is_processing"] is False and "temperature" in s["params"] for s in states)
    # Asked for again and again while a request of hundreds of tokens runs (/slots is answered
    # between two steps of the engine): it finds the request running however fast it runs.
    body = {"prompt": "Tell me a long story about", "n_predict": 400, **GREEDY}
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(smol.post, "/completion", body)
        busy = []
        while not busy and not running.done():
            busy = [s for s in httpx.get(smol.url + "/slots", timeout=WAIT_S).json() if s["is_processing"]]
        assert running.result().status_code == 200
    wait_until(lambda: smol.metrics()["llogos_slots_busy"] == 0, "the request's slot was not freed")
    assert len(busy) == 1 and busy[0]["n_prompt_tokens"] == len(tokens(smol, body["prompt"]))
    assert busy[0]["params"]["n_predict"] == 400 and busy[0]["next_token"][0]["n_decoded"] < 400
    assert httpx.get(smol.url + "/v1/health", timeout=10).json() == {"status": "ok"}
    props = httpx.get(smol.url + "/props", timeout=10).json()
    assert props["total_slots"] == 8 and props["model_path"].endswith(".gguf")
    assert props["default_generation_settings"]["n_ctx"] == 512 and "<|im_start|>" in props["chat_template"]
    assert props["modalities"] == {"vision": False, "audio": False} and props["model_alias"] == "smollm2-135m"


@pytest.mark.parametrize("path, body, fragment", [
    ("/completion", {"prompt": "a", "n_predict": "5"}, "n_predict"),
    ("/completion", {"prompt": [1, 999999], "n_predict": 1}, "out of range"),
    ("/completion", {"prompt": [], "n_predict": 1}, "prompt"),
    ("/completion", {"prompt": "a", "bogus": 1}, "unknown field 'bogus'"),
    ("/completion", {"prompt": [1, [2, 3]]}, "not both"),
    ("/completion", {"prompt": ["one", []]}, "prompt"),
    ("/tokenize", {"text": "a"}, "content"),
    ("/detokenize", {"tokens": [999999]}, "outside the vocabulary"),
    ("/detokenize", {"tokens": "1 2"}, "tokens"),
    ("/apply-template", {"messages": []}, "messages"),
    ("/apply-template", {"messages": [{"role": "robot", "content": "x"}]}, "role"),
])
def test_bad_bodies_are_400_error_objects(smol, path, body, fragment):
    r = smol.post(path, body)
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]["message"]
    assert smol.post(path, b"{not json").status_code == 400
    assert "Traceback" not in smol.log.read_text()


def test_no_slots_flag(compiled, tmp_path):
    server = Server(compiled, tmp_path / "log", "-m", "smollm2-135m", "-np", "1", "-c", "128", "--no-slots")
    try:
        r = httpx.get(server.url + "/slots", timeout=10)
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
    finally:
        server.stop()


def test_several_prompts_are_a_reply_each_whole_and_streamed(smol):
    prompts = ["The capital of France is", tokens(smol, "Once upon a time"), ["1, 2,", *tokens(smol, " 3,")]]
    body = {"prompt": prompts, "n_predict": 5, "return_tokens": True, **GREEDY}
    alone = [post(smol, "/completion", {**body, "prompt": p}) for p in prompts]
    replies = post(smol, "/completion", body)
    assert [r["index"] for r in replies] == [0, 1, 2]
    for one, reply in zip(alone, replies):
        assert (reply["content"], reply["tokens"], reply["tokens_evaluated"]) == \
            (one["content"], one["tokens"], one["tokens_evaluated"])
    assert len({r["tokens_evaluated"] for r in replies}) == 3
    with httpx.stream("POST", smol.url + "/completion", content=json.dumps({**body, "stream": True}),
                      timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line]
    for i, one in enumerate(alone):
        mine = [c for c in chunks if c["index"] == i]
        assert "".join(c["content"] for c in mine) == one["content"] and mine[-1]["stop"] is True
        assert all(c["tokens_evaluated"] == one["tokens_evaluated"] for c in mine)
    assert post(smol, "/completion", {**body, "prompt": ["Paris"]})["content"] == \
        post(smol, "/completion", {**body, "prompt": "Paris"})["content"]   # a list of one is one reply


def test_model_load_and_unload_need_router_mode(smol):
    for path in ("/models/load", "/models/unload"):
        r = smol.post(path, {"model": "smollm2-135m"})
        assert r.status_code == 404 and "router mode" in r.json()["error"]["message"]
