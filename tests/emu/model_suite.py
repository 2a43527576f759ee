"""Whole-model checks of the CUDA backend against the NumPy backend, on the tiny fixture models,
run under the CPU emulator (test_cuda_emulated.py) and on a GPU (test_cuda_gpu.py), which import
these tests and supply the `backend` fixture."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from llogos_cli.backends.cuda import cuda_attention, cuda_matmul
from llogos_cli.engine import decode_graph
from llogos_cli.engine.decode_graph import GraphDecoder, prompt_rows
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.batch import Batch
from llogos_cli.model.forward import Model
from tests.conftest import FIXTURES, assert_decisive_choices_kept, need

MODELS = ["tiny-llama-f32", "tiny-llama-q8_0", "tiny-qwen2-q8_0", "tiny-qwen3-f32", "tiny-gemma3-q8_0",
          "tiny-qwen35-f32"]
# The families whose fixtures the repository carries (tests/fixtures, see tests/test_model_families.py).
FAMILY_MODELS = ["tiny-gemma2-f32", "tiny-gemma2-q8_0", "tiny-phi3-q8_0", "tiny-phi3-longrope-q8_0", "tiny-granite-q8_0",
                 "tiny-olmo2-q8_0", "tiny-smollm3-q8_0", "tiny-lfm2-q8_0", "tiny-qwen3moe-f32", "tiny-qwen3moe-q8_0",
                 "tiny-gpt-oss-f32", "tiny-gpt-oss-q8_0", "tiny-gpt-oss-mxfp4",
                 "tiny-qwen2moe-f32", "tiny-qwen2moe-q8_0"]
REPO_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# Both backends round cache entries identically, but activations an f32 rounding apart can round
# to neighbouring f16 values: with f16 caches the two agree to about an f16 step.
CACHE_TOLERANCE = {"f32": 2e-5, "f16": 5e-4}


def model_pair(name: str, backend) -> tuple[Model, Model]:
    f = GGUFFile(REPO_FIXTURES / f"{name}.gguf" if name in FAMILY_MODELS else need(FIXTURES / f"{name}.gguf"))
    return Model(f, NumpyBackend()), Model(f, backend)


def load_bench():
    """bench/synthetic.py as a module, for its synthetic models of real shapes."""
    spec = importlib.util.spec_from_file_location("synthetic", Path(__file__).resolve().parents[2] / "bench" / "synthetic.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def relative(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("name", MODELS + FAMILY_MODELS)
@pytest.mark.parametrize("cache", CACHE_TOLERANCE)
def test_model_logits_match_the_cpu_backend(backend, name, cache):
    cpu, gpu = model_pair(name, backend)
    ids = np.random.default_rng(2).integers(0, cpu.cfg.n_vocab, 24)
    c_ctx, g_ctx = cpu.new_context(32, cache, cache), gpu.new_context(32, cache, cache)
    for chunk in (ids[:19], ids[19:20], ids[20:24]):  # prompt (GEMM attention), decode, short batch
        want = cpu.forward_seq(c_ctx, chunk, all_logits=True)
        got = backend.to_host(gpu.forward_seq(g_ctx, chunk, all_logits=True))
        assert relative(got, want) < CACHE_TOLERANCE[cache], len(chunk)


def batched_steps(n_vocab: int) -> list[Batch]:
    """Three forward passes over slots 0..2 of a cache: prompt runs of two slots (one long enough for
    GEMM attention); decode rows of both with a third slot's prompt between them; decode rows of all
    three, out of slot order."""
    ids = np.random.default_rng(7).integers(0, n_vocab, 40).astype(np.int32)
    return [Batch.join([Batch.run(ids[:19], 1, 0, np.arange(19)), Batch.run(ids[19:24], 0, 0, np.arange(5))]),
            Batch.join([Batch.run(ids[24:25], 0, 5, [0]), Batch.run(ids[25:29], 2, 0, np.arange(4)),
                        Batch.run(ids[29:30], 1, 19, [0])]),
            Batch.join([Batch.run(ids[30:31], 2, 4, [0]), Batch.run(ids[31:32], 1, 20, [0]),
                        Batch.run(ids[32:33], 0, 6, [0])])]


@pytest.mark.parametrize("name", MODELS + FAMILY_MODELS)
def test_batched_steps_match_the_cpu_backend(backend, name):
    cpu, gpu = model_pair(name, backend)
    c_cache, g_cache = cpu.new_cache(3, 32, "f32", "f32"), gpu.new_cache(3, 32, "f32", "f32")
    for step, batch in enumerate(batched_steps(cpu.cfg.n_vocab)):
        want = cpu.forward(c_cache, batch)
        got = backend.to_host(gpu.forward(g_cache, batch))
        assert got.shape == want.shape and relative(got, want) < CACHE_TOLERANCE["f32"], step


@pytest.mark.parametrize("name", ["tiny-llama-q8_0", "tiny-gemma3-q8_0", "tiny-lfm2-q8_0", "tiny-qwen3moe-q8_0"])
def test_decoding_with_8_bit_activations(backend, name, monkeypatch):
    """Few-token products on 8-bit activations (the default): each product is off by up to half a
    step of its runs' max / 127 (op_suite's int8_product_bound), and through the layers of these
    random-weight models the logits land 1-5% of their range from float32's (measured); a wrong
    scale or sum would be off by the whole range. (These tiny matrices would stay float32 under
    INT8_MIN_BYTES: the threshold goes to 0.)"""
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    monkeypatch.setattr(cuda_matmul, "INT8_MIN_BYTES", 0)
    f = GGUFFile(REPO_FIXTURES / f"{name}.gguf" if name in FAMILY_MODELS else need(FIXTURES / f"{name}.gguf"))
    cpu, gpu = Model(f, NumpyBackend()), Model(f, CudaBackend(backend.kernels, "int8"))
    ids = np.random.default_rng(4).integers(0, cpu.cfg.n_vocab, 22)
    c_ctx, g_ctx = cpu.new_context(32, "f32", "f32"), gpu.new_context(32, "f32", "f32")
    for chunk in (ids[:19], ids[19:20], ids[20:21], ids[21:22]):
        want = cpu.forward_seq(c_ctx, chunk, all_logits=True)
        got = gpu.backend.to_host(gpu.forward_seq(g_ctx, chunk, all_logits=True))
        assert relative(got, want) < 8e-2, len(chunk)


@pytest.mark.parametrize("name", ["tiny-llama-q8_0", "tiny-gemma3-q8_0"])
def test_long_prompts_with_8_bit_activations(backend, name):
    """Past GEMM_MIN_TOKENS, int8 products take the prompt's 8-bit activations on int8 tensor
    cores (matmul_q8_mma) instead of dequantizing the weights for f16 GEMMs: the logits within the
    few-token 8-bit products' 8e-2 of float32's range (test_decoding_with_8_bit_activations)."""
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    f = GGUFFile(need(FIXTURES / f"{name}.gguf"))
    int8 = CudaBackend(backend.kernels, "int8")
    cpu, gpu = Model(f, NumpyBackend()), Model(f, int8)
    ids = np.random.default_rng(6).integers(0, cpu.cfg.n_vocab, cuda_matmul.GEMM_MIN_TOKENS + 8)
    launched = len(getattr(int8.kernels, "launched", ()))
    got = int8.to_host(gpu.forward_seq(gpu.new_context(64, "f32", "f32"), ids, all_logits=True))
    if hasattr(int8.kernels, "launched"):
        assert "matmul_q8_mma_q8_0" in int8.kernels.launched[launched:]
        assert "dequantize_q8_0" not in int8.kernels.launched[launched:]
    want = cpu.forward_seq(cpu.new_context(64, "f32", "f32"), ids, all_logits=True)
    assert relative(got, want) < 8e-2


@pytest.mark.parametrize("cache", ["f32", "q8_0"])
def test_long_prompt(backend, cache):
    """Past GEMM_MIN_TOKENS the products go through f16 GEMMs: agreement to ~1e-3, and q8_0 caches
    then round some entries to the neighbouring step."""
    cpu, gpu = model_pair("tiny-gemma3-q8_0", backend)  # head size 32 (q8_0 cache), sliding window
    ids = np.random.default_rng(3).integers(0, cpu.cfg.n_vocab, cuda_matmul.GEMM_MIN_TOKENS + 8)
    got = backend.to_host(gpu.forward_seq(gpu.new_context(64, cache, cache), ids, all_logits=True))
    want = cpu.forward_seq(cpu.new_context(64, cache, cache), ids, all_logits=True)
    assert relative(got, want) < {"f32": 3e-3, "q8_0": 2e-2}[cache]
    assert np.mean(got.argmax(1) == want.argmax(1)) > 0.9


@pytest.mark.parametrize("name, cache", [("tiny-gemma3-q8_0", "f16"), ("tiny-gemma3-q8_0", "q8_0"),
                                         ("tiny-gpt-oss-mxfp4", "f16")])
def test_long_prompt_attention_in_f16(backend, name, cache, monkeypatch):
    """A prompt's attention in f16 on tensor cores (cuda_attention._products_f16, here from 17
    tokens on, in chunks of 8 queries; gemma3's sliding window, gpt-oss's sinks): the logits
    within 3e-3 of their range of the float32 attention's (the attention's f16 rounding, ~1e-3 of
    its outputs, through the layers; measured 1.2e-3 and 1.6e-3), 1e-2 from q8_0 caches, where
    that moves later layers' keys and values a rounding step (measured 4.9e-3); test_long_prompt
    holds the float32 attention to the CPU backend's."""
    cpu, gpu = model_pair(name, backend)
    ids = np.random.default_rng(3).integers(0, cpu.cfg.n_vocab, cuda_matmul.GEMM_MIN_TOKENS + 8)
    want = backend.to_host(gpu.forward_seq(gpu.new_context(64, cache, cache), ids, all_logits=True))
    monkeypatch.setattr(cuda_attention, "F16_MIN_TOKENS", cuda_attention.FUSED_MAX_TOKENS + 1)
    monkeypatch.setattr(cuda_attention, "QUERY_CHUNK", 8)
    calls, products = [], cuda_attention._products_f16
    monkeypatch.setattr(cuda_attention, "_products_f16", lambda *args: (calls.append(1), products(*args))[1])
    got = backend.to_host(gpu.forward_seq(gpu.new_context(64, cache, cache), ids, all_logits=True))
    assert len(calls) == cpu.cfg.n_layer * -(-len(ids) // 8)
    assert 0 < relative(got, want) < {"f16": 3e-3, "q8_0": 1e-2}[cache]
    assert np.mean(got.argmax(1) == want.argmax(1)) > 0.9


@pytest.mark.parametrize("name", ["tiny-qwen3moe-q8_0", "tiny-gpt-oss-mxfp4", "tiny-qwen2moe-f32"])
def test_moe_prompt_groups_its_experts_products(backend, name):
    """A prompt of GEMM_MIN_TOKENS + 8 tokens takes the grouped expert products (the pairs sorted
    by expert, each chosen expert's matrix multiplied once by its rows), the token after it the
    pair-by-pair product: logits as the CPU backend's, to the f16 GEMMs' ~1e-3."""
    cpu, gpu = model_pair(name, backend)
    ids = np.random.default_rng(9).integers(0, cpu.cfg.n_vocab, cuda_matmul.GEMM_MIN_TOKENS + 9)
    c_ctx, g_ctx = cpu.new_context(64, "f32", "f32"), gpu.new_context(64, "f32", "f32")
    for chunk in (ids[:-1], ids[-1:]):
        launched = getattr(backend.kernels, "launched", None)   # the emulator's record of kernel names
        if launched is not None:
            launched.clear()
        want = cpu.forward_seq(c_ctx, chunk, all_logits=True)
        got = backend.to_host(gpu.forward_seq(g_ctx, chunk, all_logits=True))
        assert relative(got, want) < 3e-3, len(chunk)
        if launched is not None:
            grouped = {"moe_sort_i32", "moe_gather_f32", "moe_scatter_f32"} & set(launched)
            paired = [name for name in launched if name.startswith("matvec_experts_")]
            assert (grouped, bool(paired)) == (({"moe_sort_i32", "moe_gather_f32", "moe_scatter_f32"}, False)
                                               if len(chunk) > 1 else (set(), True))
            assert launched.count("moe_sort_i32") in (0, cpu.cfg.n_layer)   # one grouping a layer, shared by its products


@pytest.mark.parametrize("name", ["tiny-qwen3moe-q8_0", "tiny-gpt-oss-mxfp4"])
def test_moe_prompt_on_int8_tensor_cores(backend, name, monkeypatch):
    """With int8 products on a GPU with int8 tensor cores, a prompt's grouped expert products take
    moe_matmul_q8_mma (Q8_0, MXFP4 experts) instead of dequantizing each expert for an f16 GEMM.
    The 8-bit activations can flip a router's near tie (tiny-qwen3moe: a 3e-4 gap in layer 1),
    which moves that token's logits by far more than rounding; up to the first token routed apart
    from the CPU backend in any layer, the logits are within the 8-bit products' 8e-2 of
    float32's range (test_long_prompts_with_8_bit_activations), and the next tokens chosen by a
    clear lead are the CPU's throughout."""
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    f = GGUFFile(REPO_FIXTURES / f"{name}.gguf" if name in FAMILY_MODELS else need(FIXTURES / f"{name}.gguf"))
    int8 = CudaBackend(backend.kernels, "int8")
    if not int8.kernels.int8_mma:
        pytest.skip("the GPU has no int8 tensor cores")
    cpu, gpu = Model(f, NumpyBackend()), Model(f, int8)
    routes = {"cpu": [], "gpu": []}
    for side, model in (("cpu", cpu), ("gpu", gpu)):
        def route(logits, k, normalize=True, side=side, route=model.backend.route):
            experts, weights = route(logits, k, normalize)
            routes[side].append(np.sort(model.backend.to_host(experts) if side == "gpu" else experts, axis=1))
            return experts, weights
        monkeypatch.setattr(model.backend, "route", route)
    ids = np.random.default_rng(9).integers(0, cpu.cfg.n_vocab, cuda_matmul.GEMM_MIN_TOKENS + 8)
    launched = len(getattr(int8.kernels, "launched", ()))
    got = int8.to_host(gpu.forward_seq(gpu.new_context(64, "f32", "f32"), ids, all_logits=True))
    if hasattr(int8.kernels, "launched"):
        names, experts_type = int8.kernels.launched[launched:], name.rsplit("-", 1)[1]
        assert f"moe_matmul_q8_mma_{experts_type}" in names or f"moe_matmul_q8_mma_rows64_{experts_type}" in names
        assert f"dequantize_{experts_type}" not in names and not any(n.startswith("matvec_experts_") for n in names)
    want = cpu.forward_seq(cpu.new_context(64, "f32", "f32"), ids, all_logits=True)
    apart = [t for c, g in zip(routes["cpu"], routes["gpu"]) for t in np.flatnonzero((c != g).any(axis=1))]
    same = min(apart, default=len(ids))
    assert same >= len(ids) // 2 and relative(got[:same], want[:same]) < 8e-2
    assert_decisive_choices_kept(got, want)


@pytest.mark.parametrize("name", ["tiny-llama-q8_0", "tiny-qwen2-f32", "tiny-gemma3-f32", "tiny-qwen35-f32"])
def test_greedy_generation_matches_the_oracle(backend, name):
    family, quant = name.rsplit("-", 1)
    oracle = np.load(need(FIXTURES / (f"{family}.oracle.npz" if quant == "f32" else f"{name}.oracle.npz")))
    _, gpu = model_pair(name, backend)
    ctx = gpu.new_context(64)
    logits = gpu.forward_seq(ctx, oracle["greedy_prefix"].astype(np.int32))
    out = []
    for _ in range(len(oracle["greedy"])):
        out.append(int(backend.argmax_rows(logits)[0]))
        logits = gpu.forward_seq(ctx, np.array(out[-1:], np.int32))
    assert out == oracle["greedy"].tolist()


def prefilled_caches(gpu, n: int, prompts: list[np.ndarray]) -> list:
    """n caches of len(prompts) slots, slot i holding prompt i (f16, as decoding runs)."""
    caches = [gpu.new_cache(len(prompts), 32, "f16", "f16") for _ in range(n)]
    batch = Batch.join([Batch.run(p, slot, 0, [len(p) - 1]) for slot, p in enumerate(prompts)])
    for cache in caches:
        gpu.forward(cache, batch)
    return caches


@pytest.mark.parametrize("name", ["tiny-llama-f32", "tiny-qwen3-f32", "tiny-gemma3-q8_0", "tiny-qwen35-f32",
                                  "tiny-gemma2-q8_0", "tiny-phi3-longrope-q8_0", "tiny-lfm2-q8_0", "tiny-qwen3moe-q8_0",
                                  "tiny-gpt-oss-q8_0", "tiny-qwen2moe-q8_0"])
def test_decoder_replays_eager_decoding(backend, name):
    """Steps of 3 rows (bucket 4: a padding row), then 2 (bucket 2), replayed at later positions with
    the slots in other orders, equal to the same rows run eagerly."""
    _, gpu = model_pair(name, backend)
    rng = np.random.default_rng(4)
    lengths = [5, 2, 7]
    eager, graphed = prefilled_caches(gpu, 2, [rng.integers(0, gpu.cfg.n_vocab, n).astype(np.int32) for n in lengths])
    step = GraphDecoder(gpu, graphed).step
    # Past position 8 the window of gemma3's local layers starts sliding.
    for slots in ([2, 0, 1], [1, 2], [0, 1, 2], [2, 1], [1, 0, 2], [0, 2, 1], [2, 0]):
        tokens = rng.integers(0, gpu.cfg.n_vocab, len(slots)).astype(np.int32)
        pos = np.array([lengths[s] for s in slots], np.int32)
        want = backend.to_host(gpu.forward_rows(eager, tokens, slots, pos))
        got = backend.to_host(step(tokens, slots, pos))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())
        for s in slots:
            lengths[s] += 1


def test_decoder_runs_rows_past_its_largest_bucket_in_chunks(backend):
    _, gpu = model_pair("tiny-llama-q8_0", backend)
    prompts = [np.arange(n, dtype=np.int32) + 3 for n in (3, 1, 4)]
    eager, graphed = prefilled_caches(gpu, 2, prompts)
    decoder = GraphDecoder(gpu, graphed, buckets=(1, 2))
    tokens, slots, pos = np.array([5, 6, 7], np.int32), np.array([1, 2, 0], np.int32), np.array([1, 4, 3], np.int32)
    got = backend.to_host(decoder.step(tokens, slots, pos))
    want = backend.to_host(gpu.forward_rows(eager, tokens, slots, pos))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("name, products", [("tiny-qwen3-f32", "float"), ("tiny-llama-q8_0", "int8")])
def test_decoder_replays_gemm_buckets(backend, name, products):
    """From GEMM_MIN_TOKENS rows the products are f16 GEMMs (with int8 products, int8 tensor-core
    ones where the GPU has them): a step padded to such a bucket, replayed with other slots, equals
    the same padded rows run eagerly."""
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    backend = CudaBackend(backend.kernels, products)
    _, gpu = model_pair(name, backend)
    size, rows = cuda_matmul.GEMM_MIN_TOKENS, cuda_matmul.GEMM_MIN_TOKENS - 5
    rng = np.random.default_rng(8)
    eager, graphed = prefilled_caches(gpu, 2, [rng.integers(0, gpu.cfg.n_vocab, 2).astype(np.int32)] * rows)
    decoder = GraphDecoder(gpu, graphed, buckets=(size,))
    for step in range(2):
        slots = rng.permutation(rows).astype(np.int32)
        tokens, pos = rng.integers(0, gpu.cfg.n_vocab, rows).astype(np.int32), np.full(rows, 2 + step, np.int32)
        padded = (np.pad(tokens, (0, size - rows)), np.pad(slots, (0, size - rows), constant_values=eager.pad_slot),
                  np.pad(pos, (0, size - rows)))
        launched = len(getattr(backend.kernels, "launched", ()))
        want = backend.to_host(gpu.forward_rows(eager, *padded))[:rows]
        if hasattr(backend.kernels, "launched"):
            mma = any(n.startswith("matmul_q8_mma") for n in backend.kernels.launched[launched:])
            assert mma == (products == "int8")
        got = backend.to_host(decoder.step(tokens, slots, pos))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())


def test_decoder_rejects_bad_rows(backend):
    _, gpu = model_pair("tiny-llama-q8_0", backend)
    step = GraphDecoder(gpu, gpu.new_cache(2, 8)).step
    for tokens, slots, pos, message in (([1, 2], [0, 0], [0, 0], "distinct positions"),
                                        ([1], [2], [0], "slots in"),   # the pad slot is not a row's
                                        ([1], [0], [8], "context is full"),
                                        ([gpu.cfg.n_vocab], [0], [0], "outside the vocabulary")):
        with pytest.raises(LlogosError, match=message):
            step(np.array(tokens), np.array(slots), np.array(pos))


@pytest.mark.parametrize("name", ["tiny-llama-q8_0", "tiny-qwen3-f32", "tiny-gemma3-q8_0", "tiny-gemma2-q8_0",
                                  "tiny-gpt-oss-q8_0", "tiny-phi3-longrope-q8_0", "tiny-qwen3moe-q8_0"])
def test_short_prompt_as_rows_of_one_slot(backend, name):
    """A 5-token prompt, then a 7-token chunk after it (past position 8, where gemma3's local
    windows slide), as rows of slot 1 of the decode step (bucket 8: padding rows in it): every
    row's logits those of the eager prompt pass and of the NumPy backend's rows (softcaps: gemma2;
    sinks and windows: gpt-oss; experts: qwen3moe)."""
    cpu, gpu = model_pair(name, backend)
    assert prompt_rows(gpu) == decode_graph.PROMPT_ROWS
    ids = np.random.default_rng(5).integers(0, gpu.cfg.n_vocab, 12).astype(np.int32)
    c_cache, eager, graphed = (m.new_cache(2, 32, "f32", "f32") for m in (cpu, gpu, gpu))
    step = GraphDecoder(gpu, graphed).step
    for start, n in ((0, 5), (5, 7)):
        rows = ids[start:start + n], np.ones(n, np.int32), np.arange(start, start + n, dtype=np.int32)
        want = backend.to_host(gpu.forward(eager, Batch.run(rows[0], 1, start, np.arange(n))))
        got = backend.to_host(step(*rows))
        assert relative(got, want) < CACHE_TOLERANCE["f32"], start
        assert relative(got, cpu.forward_rows(c_cache, *rows)) < CACHE_TOLERANCE["f32"], start


@pytest.mark.parametrize("name", ["tiny-qwen35-f32", "tiny-lfm2-q8_0"])
def test_recurrent_models_take_rows_of_distinct_slots_only(backend, name):
    """Recurrent layers step each row from its slot's state before the step: rows of one slot
    would each start from the same state, so these models' prompts stay on the eager pass."""
    _, gpu = model_pair(name, backend)
    assert prompt_rows(gpu) == 1
    step = GraphDecoder(gpu, gpu.new_cache(2, 8)).step
    with pytest.raises(LlogosError, match="recurrent layers needs distinct slots"):
        step(np.array([1, 2]), np.array([0, 0]), np.array([0, 1]))


def one_slot_engine(model, tokenizer, speculation=None, prefix_cache_bytes: int = 0):
    """An engine of one slot of 64 positions, f32 caches, no prefix cache unless given its bytes."""
    from llogos_cli.engine.batch import BatchEngine
    from llogos_cli.engine.speculation import SpecParams
    return BatchEngine(model, tokenizer, 1, 64, ("f32", "f32"), prefix_cache_bytes=prefix_cache_bytes,
                       speculation=speculation or SpecParams())


def greedy_tokens(engine, prompt: list[int], n_predict: int, generations: list | None = None) -> list[int]:
    """The greedy tokens of the prompt on the engine; its Generation appended to generations."""
    from llogos_cli.engine.batch import Request
    from llogos_cli.engine.generation import Generation
    from llogos_cli.engine.sampling import SamplingParams
    from llogos_cli.engine.stops import StopCriteria
    request = Request(0, prompt, SamplingParams(temp=0.0), StopCriteria(n_predict=n_predict, ignore_eos=True))
    generation = Generation(engine, request)
    if generations is not None:
        generations.append(generation)
    return [t.id for t in generation]


def engine_tokens(model, tokenizer, prompts: list[list[int]], n_predict: int, speculation=None,
                  prefix_cache_bytes: int = 0, generations: list | None = None) -> list[list[int]]:
    """Greedy tokens of each prompt, one request after another on one engine of one slot."""
    engine = one_slot_engine(model, tokenizer, speculation, prefix_cache_bytes)
    return [greedy_tokens(engine, prompt, n_predict, generations) for prompt in prompts]


@pytest.mark.parametrize("name", ["tiny-llama-q8_0", "tiny-gemma3-q8_0"])
@pytest.mark.parametrize("draft", [False, True])
def test_engine_short_prompts_as_rows_generate_as_the_prompt_path(backend, name, draft, monkeypatch):
    """Greedy generation on the engine with short prompts (and, with a draft, drafted rows) run as
    rows of the decode step, against the eager prompt pass (PROMPT_ROWS 1) and the NumPy backend."""
    from llogos_cli.engine.speculation import SpecParams
    from llogos_cli.tokenizer.tokenizer import Tokenizer
    cpu, gpu = model_pair(name, backend)
    tokenizer = Tokenizer.from_gguf(GGUFFile(need(FIXTURES / f"{name}.gguf")))
    rng = np.random.default_rng(3)
    motif = rng.integers(0, gpu.cfg.n_vocab, 3).tolist()
    prompts = [motif * 3, rng.integers(0, gpu.cfg.n_vocab, 5).tolist()]   # a repeat an n-gram drafts from
    speculation = SpecParams("ngram-simple", spec_ngram_simple_size_n=1, spec_ngram_simple_size_m=8,
                             draft_max=8) if draft else None
    rows = engine_tokens(gpu, tokenizer, prompts, 10, speculation)
    with monkeypatch.context() as eager:
        eager.setattr(decode_graph, "PROMPT_ROWS", 1)
        assert engine_tokens(gpu, tokenizer, prompts, 10, speculation) == rows
    assert engine_tokens(cpu, tokenizer, prompts, 10, speculation) == rows


def test_engine_prefix_hit_s_short_rest_as_rows(backend, monkeypatch):
    """A prompt whose first two blocks (32 tokens) the prefix cache holds from an earlier one: its
    last 6 tokens run as rows at positions 32..37, reading the shared blocks through the slot's
    block table, and generate as on the eager prompt pass and on the NumPy backend."""
    from llogos_cli.model import memory
    from llogos_cli.tokenizer.tokenizer import Tokenizer
    monkeypatch.setattr(memory, "gpu_available", lambda: 1 << 30)   # the emulator has no device to ask
    cpu, gpu = model_pair("tiny-llama-q8_0", backend)
    tokenizer = Tokenizer.from_gguf(GGUFFile(need(FIXTURES / "tiny-llama-q8_0.gguf")))
    rng = np.random.default_rng(12)
    shared = rng.integers(0, gpu.cfg.n_vocab, 32).tolist()
    prompts = [shared + rng.integers(0, gpu.cfg.n_vocab, n).tolist() for n in (4, 6)]
    generations = []
    rows = engine_tokens(gpu, tokenizer, prompts, 6, prefix_cache_bytes=1 << 20, generations=generations)
    assert generations[1].result.prefix_hit == 32
    with monkeypatch.context() as eager:
        eager.setattr(decode_graph, "PROMPT_ROWS", 1)
        assert engine_tokens(gpu, tokenizer, prompts, 6, prefix_cache_bytes=1 << 20) == rows
    assert engine_tokens(cpu, tokenizer, prompts, 6, prefix_cache_bytes=1 << 20) == rows


def test_engine_greedy_generation_matches_the_cpu_backend(backend):
    """The engine's path on this backend: its decode step (a CUDA graph) and the argmax where the
    logits are, so only token ids cross to the host."""
    from llogos_cli.engine.batch import Request
    from llogos_cli.engine.generation import Generation
    from llogos_cli.engine.sampling import SamplingParams
    from llogos_cli.engine.stops import StopCriteria
    from llogos_cli.tokenizer.tokenizer import Tokenizer

    f = GGUFFile(need(FIXTURES / "tiny-llama-q8_0.gguf"))
    oracle = np.load(need(FIXTURES / "tiny-llama-q8_0.oracle.npz"))
    runs = []
    for b in (NumpyBackend(), backend):
        gen = Generation.alone(Model(f, b), Tokenizer.from_gguf(f), 64, Request(
            0, oracle["greedy_prefix"].tolist(), SamplingParams(temp=0.0),
            StopCriteria(n_predict=len(oracle["greedy"]), ignore_eos=True)), ("f32", "f32"))
        runs.append([t.id for t in gen])
    assert runs[0] == runs[1] == oracle["greedy"].tolist()


@pytest.mark.parametrize("name", ["tiny-llama-f32", "tiny-gemma3-q8_0", "tiny-gpt-oss-f32"])
def test_decode_at_depth_splits_attention_along_the_keys(backend, name, monkeypatch):
    """Decode rows at depth 600 of a cache of 1024 positions, where the fused attention splits each
    row's keys into chunks (cuda_attention.split_chunks), replayed from the decode graph at three
    depths, against the same rows run eagerly unsplit (one block per head, attention.cu): Llama,
    Gemma 3 (sliding windows), gpt-oss (sinks, windows). The split itself is checked against the
    NumPy backend op by op (emu/op_suite.py); here its logits agree with the unsplit ones to the
    float32 summation order (4e-8 of the largest measured under the emulator)."""
    from llogos_cli.backends.cuda import cuda_attention
    _, gpu = model_pair(name, backend)
    depth, n_ctx = 600, 1024
    ctx = gpu.new_context(n_ctx, "f32", "f32")
    assert cuda_attention.split_chunks(next(kv for kv in ctx.cache.kv if kv is not None), 1, gpu.cfg.n_head) > 1
    ids = np.random.default_rng(9).integers(0, gpu.cfg.n_vocab, depth + 3).astype(np.int32)
    gpu.forward_seq(ctx, ids[:depth])
    decoder = GraphDecoder(gpu, ctx.cache)
    for t in range(depth, depth + 3):
        rows = ids[t:t + 1], np.zeros(1, np.int32), np.array([t], np.int32)
        captured = len(getattr(backend.kernels, "launched", ()))
        got = backend.to_host(decoder.step(*rows))
        if t == depth and hasattr(backend.kernels, "launched"):   # the step captured
            assert "attention_combine" in backend.kernels.launched[captured:]
        with monkeypatch.context() as unsplit:
            unsplit.setattr(cuda_attention, "SPLIT_BLOCKS", 0)
            launched = len(getattr(backend.kernels, "launched", ()))
            want = backend.to_host(gpu.forward_rows(ctx.cache, *rows))   # the same row stored again
            assert "attention_combine" not in getattr(backend.kernels, "launched", ())[launched:]
        assert relative(got, want) < 1e-6, t
