"""llama.cpp's context shift: a generation that reaches the context size keeps its first n_keep
tokens, drops the older half of the rest and goes on, the kept keys turned back by RoPE.

The reference: in a one-layer model a token's KV depends on the token and its position alone, so
after a shift the cache must hold what encoding the kept tokens afresh at their new positions gives.
Each family's first layer is cut out of its fixture for that, one per kind of RoPE: adjacent pairs
(llama), half-split (qwen2), Gemma 3's local and global bases, Phi-3's long-context factors,
gpt-oss's YaRN.
"""

import json

import numpy as np
import pytest

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.context_shift import plan
from llogos_cli.engine.sampling import SamplingParams, log_softmax
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.batch import Batch
from llogos_cli.model.forward import Model
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.conftest import EXACT_KV, FIXTURES, copy_gguf, need
from tests.test_cli import env, llogos  # noqa: F401  (env is a fixture)
from tests.test_prefix_reuse import OWN_FIXTURES
from tests.test_server import Server, openai

N_CTX = 24
PROMPT = [5, 17, 99, 230, 41, 7, 301, 12, 64]
TOP = 5


def fixture(name: str):
    path = FIXTURES / f"{name}-f32.gguf"
    return need(path if path.exists() else OWN_FIXTURES / f"{name}-f32.gguf")


def one_layer(name: str, tmp_path, meta: dict | None = None):
    src = fixture(name)
    arch = GGUFFile(src).meta["general.architecture"]
    return copy_gguf(src, tmp_path / f"{name}-1.gguf", {f"{arch}.block_count": 1, **(meta or {})},
                     keep=lambda t: not t.startswith("blk.") or t.startswith("blk.0."))


def load(path, **backend):
    f = GGUFFile(path)
    return Model(f, NumpyBackend(**backend)), Tokenizer.from_gguf(f)


def run(model, tok, n_predict: int, n_keep: int, shift: bool = True, prefix_cache: int = 0, n_slots: int = 1):
    engine = BatchEngine(model, tok, n_slots, N_CTX, EXACT_KV, prefix_cache_bytes=prefix_cache, context_shift=shift)
    request = Request(0, PROMPT, SamplingParams(temp=0.0), StopCriteria(n_predict, ignore_eos=True), TOP,
                      n_keep=n_keep)
    return next(iter(engine.generate([request])))


def reference(model, tok, n_predict: int, n_keep: int):
    """Greedy tokens and each step's top log-probabilities, every step's logits from the kept
    tokens encoded afresh at positions 0.. in a new cache, shifted by llama.cpp's rule."""
    held, tokens, tops = list(PROMPT), [], []
    while len(tokens) < n_predict:
        if len(held) > N_CTX:
            keep, drop = plan(n_keep, PROMPT, tok.bos_id, len(held) - 1, N_CTX)
            del held[keep:keep + drop]
        ctx = model.new_context(N_CTX, *EXACT_KV)   # the shift's turn on float32 keys: rounding alone
        logits = model.forward(ctx.cache, Batch.run(held, 0, 0, [len(held) - 1]))[0]
        lp = log_softmax(np.asarray(logits, np.float64))
        best = int(np.argmax(logits))
        tokens.append(best)
        tops.append({int(i): lp[i] for i in np.argsort(-lp)[:TOP]})
        held.append(best)
    return tokens, tops


KINDS = {   # name: (fixture, metadata changed)
    "llama": ("tiny-llama", {}),
    "qwen2": ("tiny-qwen2", {}),
    "gemma3-local": ("tiny-gemma3", {"gemma3.attention.sliding_window_pattern": 0}),
    "gemma3-global": ("tiny-gemma3", {"gemma3.attention.sliding_window_pattern": 1}),
    "phi3-longrope": ("tiny-phi3-longrope", {}),
    "gpt-oss-yarn": ("tiny-gpt-oss", {}),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_keep", [0, 3, -1])
def test_a_shifted_cache_gives_the_logits_of_the_kept_tokens_encoded_afresh(kind, n_keep, tmp_path):
    name, meta = KINDS[kind]
    model, tok = load(one_layer(name, tmp_path, meta))
    n_predict = 3 * N_CTX   # several shifts
    got = run(model, tok, n_predict, n_keep)
    want_tokens, want_tops = reference(model, tok, n_predict, n_keep)
    assert got.tokens == want_tokens and got.stop == "limit" and not got.context_full
    for step, (top, want) in enumerate(zip(got.logprobs, want_tops)):
        for token_id, logprob in top:
            assert abs(logprob - want[token_id]) < 1e-4, (kind, step, token_id)


def test_the_shift_turns_keys_back_by_the_positions_they_move():
    """The backend op alone: keys stored at positions p, shifted down by d, equal the same
    vectors turned at p - d; values move unturned; positions before the moved ones stay."""
    b = NumpyBackend()
    rng = np.random.default_rng(0)
    n_kv, dk, n, delta, src = 2, 8, 10, 3, 7
    raw_k, raw_v = rng.standard_normal((src + n, n_kv, dk), np.float32), rng.standard_normal((src + n, n_kv, dk), np.float32)
    for neox in (False, True):
        rope = (6, 500.0, 0.5, neox, np.array([1.0, 2.0, 4.0], np.float32))   # partial rotary, scaled, factors
        pos = np.arange(src + n, dtype=np.int32)
        tables = b.block_tables(2, 8)
        b.write_block_table(tables, 0, [5, 1, 3, 0, 2])
        cache = b.paged_kv_cache(tables, 8, 4, n_kv, dk, dk, "f32", "f32")
        b.kv_store(cache, b.rope(raw_k, pos, *rope), raw_v, b.batch_layout(np.zeros(src + n, np.int32), pos))
        b.kv_shift(cache, 0, src, n, delta, rope)
        keys, values = cache.gather(np.zeros(1, np.int32), src + n)
        moved = b.rope(raw_k[src:], pos[src:] - delta, *rope)
        assert np.allclose(keys[0, :, src - delta:src - delta + n].transpose(1, 0, 2), moved, atol=1e-5)
        assert np.array_equal(values[0, :, src - delta:src - delta + n].transpose(1, 0, 2), raw_v[src:])
        assert np.allclose(keys[0, :, :src - delta].transpose(1, 0, 2), b.rope(raw_k[:src - delta], pos[:src - delta], *rope))


def test_the_shift_of_an_f16_cache_adds_one_rounding_of_the_turned_keys():
    """The default cache: a stored key is within 2^-11 of each element of rope(k, p); turning the
    pair back by d keeps the error vector's length (a rotation), then the turned key is rounded
    again, so each element of the result is within 2^-11 (|pair| + |element|) of rope(k, p - d)."""
    b = NumpyBackend()
    rng = np.random.default_rng(1)
    n_kv, dk, n, delta, src = 2, 8, 10, 3, 7
    raw_k, raw_v = rng.standard_normal((src + n, n_kv, dk), np.float32), rng.standard_normal((src + n, n_kv, dk), np.float32)
    rope = (dk, 500.0, 1.0, True, None)
    pos = np.arange(src + n, dtype=np.int32)
    cache = b.kv_cache(1, src + n, n_kv, dk, dk, "f16", "f16")
    b.kv_store(cache, b.rope(raw_k, pos, *rope), raw_v, b.batch_layout(np.zeros(src + n, np.int32), pos))
    b.kv_shift(cache, 0, src, n, delta, rope)
    keys, values = cache.gather(np.zeros(1, np.int32), src + n)
    moved = b.rope(raw_k[src:], pos[src:] - delta, *rope)                                     # (n, n_kv, dk)
    got = keys[0, :, src - delta:src - delta + n].transpose(1, 0, 2)
    pairs = np.hypot(moved[..., :dk // 2], moved[..., dk // 2:])                             # neox: i and i + dk/2
    bound = 2 ** -11 * (np.concatenate([pairs, pairs], axis=-1) + np.abs(moved)) + 1e-6
    assert np.all(np.abs(got - moved) <= bound) and np.abs(got - moved).max() > 0
    assert np.array_equal(values[0, :, src - delta:src - delta + n].transpose(1, 0, 2),
                          raw_v[src:].astype(np.float16).astype(np.float32))


def test_without_the_shift_it_stops_at_the_context_as_before(tmp_path):
    model, tok = load(fixture("tiny-llama"))
    result = run(model, tok, 3 * N_CTX, 0, shift=False)
    assert result.stop == "limit" and result.context_full and len(result.tokens) == N_CTX - len(PROMPT)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_a_deep_model_goes_on_past_its_context_through_the_prefix_cache(name):
    """Full depth (no exact reference: the kept KV keeps what the dropped tokens gave), with
    blocks named for the prefix cache that a shift must not write: a second request with the same
    prompt still gets the first one's tokens, the shared prompt blocks untouched."""
    model, tok = load(fixture(name), batched=True)
    engine = BatchEngine(model, tok, 2, N_CTX, context_shift=True)
    requests = [Request(i, PROMPT + [3] * 8, SamplingParams(temp=0.0), StopCriteria(2 * N_CTX, ignore_eos=True))
                for i in range(2)]
    first, second = sorted(engine.generate(requests), key=lambda r: r.id)
    assert len(first.tokens) == 2 * N_CTX and first.stop == "limit" and not first.context_full
    assert second.tokens == first.tokens
    again = next(iter(engine.generate([Request(2, requests[0].prompt, requests[0].params, requests[0].criteria)])))
    assert again.tokens == first.tokens


def test_a_recurrent_model_says_it_cannot_shift_and_stops_at_the_context(capsys):
    model, tok = load(fixture("tiny-lfm2"))
    result = run(model, tok, 3 * N_CTX, 0)
    assert result.stop == "limit" and result.context_full and len(result.tokens) == N_CTX - len(PROMPT) + 1
    assert "recurrent layers cannot be shifted" in capsys.readouterr().err


# ---------------------------------------------------------------- the commands
TINY = FIXTURES / "tiny-llama-f32.gguf"
CLI_CTX, CLI_PREDICT = 32, 80


def test_generate_goes_on_past_the_context_and_stops_there_with_no_context_shift(env):
    args = ["generate", "-m", str(need(TINY)), "-c", str(CLI_CTX), "-n", str(CLI_PREDICT), "--temp", "0",
            "--ignore-eos", "--tokens", ",".join(map(str, PROMPT)), "--json"]
    on, off = llogos(env, *args), llogos(env, *args, "--no-context-shift")
    assert on.returncode == 0 == off.returncode, on.stderr + off.stderr
    shifted, stopped = ([json.loads(line) for line in r.stdout.splitlines()] for r in (on, off))
    assert len(shifted) == CLI_PREDICT + 1 and shifted[-1]["stop"] == "limit"
    assert len(stopped) == CLI_CTX - len(PROMPT) + 1 and stopped[-1]["stop"] == "limit"
    assert shifted[:len(stopped) - 1] == stopped[:-1]   # the same tokens until the context fills
    text = [a for a in args if a != "--json"]
    assert f"the context of {CLI_CTX} tokens is full" in llogos(env, *text, "--no-context-shift").stderr
    assert "is full" not in llogos(env, *text).stderr


def test_a_server_slot_shifts_only_with_context_shift(env, tmp_path):
    """llama-server's default: no shift, a reply ends at the context (and a max_tokens past it is a
    400); with --context-shift the slot goes on, max_tokens past the context allowed."""
    replies = {}
    for shift in (True, False):
        server = Server(env, tmp_path / f"log-{shift}", "-m", str(need(TINY)), "-np", "1", "-c", str(CLI_CTX),
                        *(["--context-shift"] if shift else []))
        client = server.client()
        try:
            replies[shift] = client.completions.create(
                model="x", prompt=PROMPT, temperature=0, extra_body={"ignore_eos": True, "n_keep": 2},
                **({"max_tokens": CLI_PREDICT} if shift else {}))
            if not shift:
                with pytest.raises(openai.BadRequestError):
                    client.completions.create(model="x", prompt=PROMPT, max_tokens=CLI_PREDICT)
        finally:
            server.stop()
        assert "Traceback" not in (tmp_path / f"log-{shift}").read_text()
    assert all(reply.choices[0].finish_reason == "length" for reply in replies.values())
    assert replies[True].usage.completion_tokens == CLI_PREDICT
    assert replies[False].usage.completion_tokens == CLI_CTX - len(PROMPT)
