"""KV cache types (--cache-type-k/-v, -ctk/-ctv): the 4-bit q4_0 and iq4_nl beside f32, f16 and q8_0.

Each type's round trip within its block format's bound (gguf as the oracle of the layout); attention
over a quantized cache against the same attention over its decoded values and over the float ones;
a fixture's logits with a q4_0 cache near float32's, and the option through generate, batch and
serve; the memory each type saves in the estimate and in --stats. The CUDA kernels' store and read
of these types are checked against the NumPy backend in tests/emu/op_suite.py.
"""

import json
import re

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from llogos_cli.backends import CACHE_TYPES, check_cache_type
from llogos_cli.backends.cpu import kv_quant
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model import memory
from llogos_cli.model.config import ModelConfig
from llogos_cli.model.forward import Model
from tests.conftest import FIXTURES, need, relative_error
from tests.test_cli import assert_one_line_error, env, llogos  # noqa: F401  (env is a fixture)
from tests.test_server import Server

TINY = FIXTURES / "tiny-qwen3-f32.gguf"   # heads of 32: one block per row
PACKED = {"q4_0": QType.Q4_0, "iq4_nl": QType.IQ4_NL}
PROMPT = "The capital of France is"


def _rows(seed: int, shape=(64, 4, 64)) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    x[0, 0, :32] = 0                       # an all-zero block
    x[1, 0, 5] = 40.0                      # an outlier that sets its block's scale
    return x


def _block_max(x: np.ndarray) -> np.ndarray:
    """Each element's block's largest magnitude."""
    blocks = np.abs(x).reshape(*x.shape[:-1], -1, 32).max(axis=-1, keepdims=True)
    return np.broadcast_to(blocks, (*blocks.shape[:-1], 32)).reshape(x.shape)


# ------------------------------------------------------------------ the block formats
def test_q4_0_is_ggml_reference_quantization_byte_for_byte():
    x = _rows(0)
    packed = kv_quant.quantize(x, "q4_0")
    assert packed.shape == (*x.shape[:-1], kv_quant.row_bytes(x.shape[-1])) == (64, 4, 36)
    np.testing.assert_array_equal(packed.reshape(-1, 36), gguf_quantize(x.reshape(-1, 64), QType.Q4_0))


@pytest.mark.parametrize("cache_type", PACKED)
def test_packed_rows_decode_as_gguf_decodes_them(cache_type):
    packed = kv_quant.quantize(_rows(1), cache_type)
    want = gguf_dequantize(packed.reshape(-1, 36), PACKED[cache_type]).reshape(64, 4, 64)
    np.testing.assert_array_equal(kv_quant.dequantize(packed, cache_type), want)


@pytest.mark.parametrize("cache_type, step", [("q4_0", 1 / 8), ("iq4_nl", 24 / 127)])
def test_round_trip_error_within_the_block_format_bound(cache_type, step):
    """q4_0's levels are amax/8 apart, the far end clamped one level short: at most one step off.
    iq4_nl's widest gap is 24/127 of the block's largest magnitude (between levels 89 and 113), and
    its refitted scale moves levels by at most that much again at the block's edge; half a gap to
    the nearest level and that, within one gap. Zero blocks come back exactly."""
    x = _rows(2)
    y = kv_quant.dequantize(kv_quant.quantize(x, cache_type), cache_type)
    bound = step * _block_max(x) * (1 + 2 ** -9)   # and the f16 scale's rounding
    assert np.all(np.abs(y - x) <= bound)
    assert np.all(y[0, 0, :32] == 0)
    assert np.abs(y[1, 0, 5] - 40.0) <= 40.0 * 2 ** -10   # the block's largest is its extreme level


def test_iq4_nl_fits_gaussian_rows_closer_than_q4_0():
    """What the non-linear table is for: levels dense near zero, where most values of a row are."""
    x = _rows(3)
    err = {t: np.sqrt(np.mean((kv_quant.dequantize(kv_quant.quantize(x, t), t) - x) ** 2)) for t in PACKED}
    assert err["iq4_nl"] < err["q4_0"]


def test_q8_0_round_trip_within_half_a_step():
    backend = NumpyBackend()
    cache = backend.kv_cache(1, 8, 4, 64, 64, "q8_0", "q8_0")
    x = _rows(4, (8, 4, 64))
    backend.kv_store(cache, x, x, backend.batch_layout(np.zeros(8), np.arange(8)))
    stored = cache.k[0].transpose(1, 0, 2)
    assert np.all(np.abs(stored - x) <= _block_max(x) * (0.5 / 127 + 2 ** -10))


# ------------------------------------------------------------------ attention over quantized caches
def _attend(backend, type_k, type_v, keys, values, q, paged=False):
    n, n_kv, dk = keys.shape
    if paged:   # 8-position blocks, reversed in the pool
        tables = backend.block_tables(1, n // 8)
        backend.write_block_table(tables, 0, list(range(n // 8))[::-1])
        cache = backend.paged_kv_cache(tables, n // 8, 8, n_kv, dk, values.shape[2], type_k, type_v)
    else:
        cache = backend.kv_cache(1, n, n_kv, dk, values.shape[2], type_k, type_v)
    backend.kv_store(cache, keys, values, backend.batch_layout(np.zeros(n), np.arange(n)))
    layout = backend.batch_layout(np.zeros(len(q)), np.arange(n - len(q), n))
    return backend.attention(q, cache, layout, 0.125, 0)


@pytest.mark.parametrize("type_k, type_v", [("q4_0", "q4_0"), ("iq4_nl", "iq4_nl"), ("q4_0", "f16"), ("f32", "iq4_nl")])
@pytest.mark.parametrize("paged", [False, True], ids=["unpaged", "paged"])
def test_attention_reads_exactly_the_decoded_cache(type_k, type_v, paged):
    """The quantized cache's attention is float attention over its decoded keys and values, for
    decode rows and a prompt chunk, unpaged and through block tables."""
    backend = NumpyBackend()
    rng = np.random.default_rng(5)
    keys, values = rng.standard_normal((2, 48, 2, 64)).astype(np.float32)
    q = rng.standard_normal((9, 6, 64)).astype(np.float32)
    decoded = [kv_quant.dequantize(kv_quant.quantize(x, t), t) if t in PACKED else x for x, t in
               ((keys, type_k), (values, type_v))]
    want = _attend(backend, "f32", "f32", *decoded, q)
    if "f16" in (type_k, type_v):
        want = _attend(backend, "f32", "f32", decoded[0], decoded[1].astype(np.float16).astype(np.float32), q)
    assert relative_error(_attend(backend, type_k, type_v, keys, values, q, paged), want) < 1e-5


@pytest.mark.parametrize("cache_type", [*PACKED, "f16"])
def test_attention_over_a_rounded_cache_stays_within_the_rounding_bound(cache_type):
    """out = sum p_j v_j moves by at most the largest value error plus (as the weights move by at
    most 2 max|ds| in sum, and sum to 1 still) 2 max|ds| max|v|, ds the scores' errors q.(k' - k)
    scale; well inside it on random data, where the errors average out. f16 (the default) is the
    finest: each element within 2^-11 of itself (2^-25 of the subnormals')."""
    backend = NumpyBackend()
    rng = np.random.default_rng(6)
    keys, values = rng.standard_normal((2, 64, 2, 64)).astype(np.float32)
    q = rng.standard_normal((4, 6, 64)).astype(np.float32)
    k2, v2 = (_decoded(x, cache_type) for x in (keys, values))
    if cache_type == "f16":
        assert np.all(np.abs(v2 - values) <= 2 ** -11 * np.abs(values) + 2 ** -25)   # half a subnormal step below 2^-14
    group = q.reshape(4, 2, 3, 64)                                                   # (t, kv, g, dk)
    ds = 0.125 * np.abs(np.einsum("tkgd,nkd->tkgn", group, k2 - keys)).max()
    bound = np.abs(v2 - values).max() + 2 * ds * np.abs(v2).max()
    error = np.abs(_attend(backend, cache_type, cache_type, keys, values, q) - _attend(backend, "f32", "f32", keys, values, q))
    assert error.max() <= bound / 2


# ------------------------------------------------------------------ the compiled attention over each type
def _decoded(x: np.ndarray, cache_type: str) -> np.ndarray:
    """What a cache of cache_type holds of rows x, as float32."""
    if cache_type == "f16":
        return x.astype(np.float16).astype(np.float32)
    if cache_type in PACKED:
        return kv_quant.dequantize(kv_quant.quantize(x, cache_type), cache_type)
    if cache_type == "q8_0":   # held as float32 after its round trip: read back what a cache holds
        backend, n = NumpyBackend(), x.shape[0]
        cache = backend.kv_cache(1, n, x.shape[1], x.shape[2], x.shape[2], "q8_0", "q8_0")
        backend.kv_store(cache, x, x, backend.batch_layout(np.zeros(n), np.arange(n)))
        return cache.k[0].transpose(1, 0, 2).copy()
    return x


def _attend_decode_and_prompt(backend, type_k, type_v, keys, values, q, paged):
    """A prompt chunk of len(q) tokens after the rest, then the last token alone as a decode row."""
    return [_attend(backend, type_k, type_v, keys, values, q[-T:], paged) for T in (len(q), 1)]


@pytest.mark.parametrize("type_k, type_v, dk, dv", [("f16", "f16", 64, 64), ("f16", "f16", 40, 24),
                                                    ("q8_0", "q8_0", 64, 64), ("q4_0", "q4_0", 64, 64),
                                                    ("iq4_nl", "iq4_nl", 32, 96), ("iq4_nl", "f16", 64, 64),
                                                    ("f32", "q4_0", 64, 64)])
@pytest.mark.parametrize("paged", [False, True], ids=["unpaged", "paged"])
def test_compiled_attention_reads_each_type_as_float32_over_its_decoded_rows(type_k, type_v, dk, dv, paged):
    """The compiled loop (numba) reads f16, q8_0 and the 4-bit rows where they lie: what it gives
    over a float32 cache holding the decoded values, head sizes on the vector path (multiples of
    16) and off it (40, 24), to a rounding or two (the loop compiles apart for each pair of element
    types, and LLVM may split a softmax's sums across lanes differently in each: fresh code and
    numba's cached code do); and the NumPy path's result within float32 rounding."""
    compiled, plain = NumpyBackend("f32", batched=True), NumpyBackend("f32")
    assert compiled.compiled_attention is not None and plain.compiled_attention is None
    rng = np.random.default_rng(7)
    keys = rng.standard_normal((136, 2, dk)).astype(np.float32)    # two chunks of 64 positions and a part
    values = rng.standard_normal((136, 2, dv)).astype(np.float32)
    q = rng.standard_normal((40, 6, dk)).astype(np.float32)
    got = _attend_decode_and_prompt(compiled, type_k, type_v, keys, values, q, paged)
    want = _attend_decode_and_prompt(compiled, "f32", "f32", _decoded(keys, type_k), _decoded(values, type_v), q, paged)
    numpy = _attend_decode_and_prompt(plain, type_k, type_v, keys, values, q, paged)
    for g, w, n in zip(got, want, numpy):
        assert relative_error(g, w) < 1e-6
        assert relative_error(g, n) < 1e-5


def test_the_compiled_f16_store_rounds_as_numpy_does():
    """To nearest, ties to even, past 65504 to infinity, small values to subnormals."""
    backend = NumpyBackend("f32", batched=True)
    x = np.random.default_rng(8).standard_normal((8, 2, 32)).astype(np.float32)
    x[0, 0, :6] = [1 + 2 ** -11, 1 + 3 * 2 ** -11, 65504.0, 70000.0, -3e-6, 2 ** -24]
    x[1, 1] *= 1e-5
    cache = backend.kv_cache(1, 8, 2, 32, 32, "f16", "f16")
    backend.kv_store(cache, x, -x, backend.batch_layout(np.zeros(8), np.arange(8)))
    with np.errstate(over="ignore"):
        halves = [rows.astype(np.float16).view(np.uint16) for rows in (x, -x)]
    for stored, want in zip((cache.k, cache.v), halves):
        np.testing.assert_array_equal(stored[0].transpose(1, 0, 2).view(np.uint16), want)


# ------------------------------------------------------------------ a model with 4-bit caches
def test_fixture_logits_with_a_q4_0_cache_near_float32():
    """The q4_0 cache's logits stray from float32's by about as much more than q8_0's as its step
    is coarser (16x: 8 levels a side against 127), and keep every clearly decided next token."""
    model = Model(GGUFFile(need(TINY)), NumpyBackend())
    ids = np.load(need(FIXTURES / "tiny-qwen3.oracle.npz"))["ids"].astype(np.int32)
    logits = {t: model.forward_seq(model.new_context(64, t, t), ids, all_logits=True) for t in ("f32", "q8_0", "q4_0")}
    q8, q4 = (relative_error(logits[t], logits["f32"]) for t in ("q8_0", "q4_0"))
    assert 0 < q4 < min(0.3, 2 * 127 / 8 * q8)
    top2 = np.sort(logits["f32"], axis=-1)[:, -2:]
    decided = top2[:, 1] - top2[:, 0] > 2 * np.abs(logits["q4_0"] - logits["f32"]).max()
    assert np.array_equal(logits["q4_0"].argmax(-1)[decided], logits["f32"].argmax(-1)[decided])


def _generate(env, *args) -> str:
    r = llogos(env, "generate", "-m", str(need(TINY)), "-p", PROMPT, "-n", "12", "--temp", "0", "--ignore-eos", *args)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_generate_batch_and_serve_run_with_q4_0_caches(env, tmp_path):
    """The option reaches the engine on every surface: batch and the server continue the prompt
    as generate does with the same cache, which the default f16 continues otherwise (-fa off too:
    llogos' one fused attention reads quantized values, where llama.cpp needs flash attention for them)."""
    flags = ("-ctk", "q4_0", "-ctv", "q4_0")
    text = _generate(env, *flags, "-fa", "off")
    assert text != _generate(env)   # f16 chooses differently somewhere in 12 random-weight steps

    r = llogos(env, "batch", "-m", str(TINY), "-n", "12", "--temp", "0", "--ignore-eos", *flags, stdin=PROMPT + "\n")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"] == text

    server = Server(env, tmp_path / "log", "-m", str(TINY), "-np", "2", *flags)
    try:
        reply = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"] == text
    finally:
        server.stop()


def test_stats_report_the_kv_cache_and_what_it_saves(env):
    r = llogos(env, "generate", "-m", str(need(TINY)), "-p", PROMPT, "-n", "2", "-c", "256", "--stats",
               "-ctk", "q4_0", "-ctv", "iq4_nl")
    assert r.returncode == 0, r.stderr
    cfg = ModelConfig.from_gguf(GGUFFile(TINY))
    size, f16 = (256 * memory.kv_bytes_per_position(cfg, "cpu", *types) / memory.MiB
                 for types in (("q4_0", "iq4_nl"), ("f16", "f16")))
    m = re.search(r"KV cache ([\d.]+) MiB for -c 256 \(q4_0/iq4_nl, ([\d.]+) MiB less than f16/f16\)", r.stderr)
    assert m, r.stderr
    assert float(m.group(1)) == pytest.approx(size, abs=0.01)
    assert float(m.group(2)) == pytest.approx(f16 - size, abs=0.01) and size < f16 / 3


def test_the_default_cache_is_f16_and_f32_stays_on_offer(env):
    """As llama.cpp's: keys and values are held in f16 unless -ctk/-ctv say otherwise, and --stats
    gives its size, as `info` counts it; -ctk f32 -ctv f32 holds float32, twice as much."""
    model = Model(GGUFFile(need(TINY)), NumpyBackend())
    assert {(kv.type_k, kv.type_v) for kv in model.new_context(8).cache.kv if kv is not None} == {("f16", "f16")}
    cfg = ModelConfig.from_gguf(GGUFFile(TINY))
    f16 = 256 * memory.kv_bytes_per_position(cfg, "cpu", "f16", "f16") / memory.MiB
    default, f32 = (llogos(env, "generate", "-m", str(need(TINY)), "-p", PROMPT, "-n", "2", "-c", "256", "--stats", *flags)
                    for flags in ((), ("-ctk", "f32", "-ctv", "f32")))
    assert default.returncode == 0 and f32.returncode == 0, default.stderr + f32.stderr
    m = re.search(r"KV cache ([\d.]+) MiB for -c 256 \(f16/f16\)", default.stderr)
    assert m and float(m.group(1)) == pytest.approx(f16, abs=0.01), default.stderr
    m = re.search(r"KV cache ([\d.]+) MiB for -c 256 \(f32/f32, ([\d.]+) MiB more than f16/f16\)", f32.stderr)
    assert m and float(m.group(1)) == pytest.approx(2 * f16, abs=0.01), f32.stderr
    assert float(m.group(2)) == pytest.approx(f16, abs=0.01)
    info = json.loads(llogos(env, "info", str(need(TINY)), "--json").stdout)["cpu_weights"]
    assert info["bytes_needed"] == memory.need(GGUFFile(TINY), cfg, info["held"], info["ctx"], "f16", "f16").total


# ------------------------------------------------------------------ memory and errors
def test_a_4_bit_cache_takes_18_bytes_a_block_and_its_estimate_is_what_the_cpu_allocates():
    model = Model(GGUFFile(need(TINY)), NumpyBackend())
    cfg = model.cfg
    for type_k, type_v in (("q4_0", "q4_0"), ("iq4_nl", "f16"), ("f32", "q4_0")):
        ctx = model.new_context(96, type_k, type_v)
        allocated = sum(a.nbytes for kv in ctx.cache.kv if kv is not None for a in (kv.k, kv.v))
        per_context = memory.need(GGUFFile(TINY), cfg, "quantized", 96, type_k, type_v).kv_cache
        assert per_context * (ctx.cache.n_slots + 1) == allocated   # and the cache's padding slot
    for device in ("cpu", "cuda"):
        q4 = memory.kv_bytes_per_position(cfg, device, "q4_0", "iq4_nl")
        assert q4 == memory.kv_bytes_per_position(cfg, device, "f16", "f16") * 18 / 64


def test_every_type_is_offered_and_an_unknown_one_is_refused_in_one_line(env):
    assert CACHE_TYPES == ("f32", "f16", "q8_0", "q4_0", "iq4_nl")
    r = llogos(env, "generate", "-m", str(need(TINY)), "-p", "x", "-ctv", "q5_0")
    assert_one_line_error(r, "q5_0", *CACHE_TYPES, code=2)
    with pytest.raises(LlogosError, match="unknown KV cache type 'bf16' .*f32, f16, q8_0, q4_0, iq4_nl"):
        check_cache_type("bf16", 64)
    with pytest.raises(LlogosError, match="the iq4_nl KV cache type needs head sizes that are multiples of 32, not 48"):
        check_cache_type("iq4_nl", 48)
