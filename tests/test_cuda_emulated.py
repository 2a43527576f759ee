"""The CUDA backend with its kernels run by the CPU emulator (tests/emu), against the NumPy backend.

The operation and whole-model checks are shared with the GPU tests (emu/op_suite.py,
emu/model_suite.py); this module adds checks of the emulator itself and of which kernels run.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QType

from llogos_cli.backends.cuda import cuda_attention, cuda_experts, cuda_matmul
from llogos_cli.backends.cuda.cuda_attention import FUSED_MAX_TOKENS
from llogos_cli.backends.cuda.cuda_backend import CudaBackend
from llogos_cli.backends.cuda.cuda_batch import Run
from llogos_cli.engine import decode_graph
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.forward import Model
from tests.emu.emulator import EmuKernels, EmulationError
from tests.conftest import FIXTURES, need
from tests.emu.model_suite import *  # noqa: F401,F403 (the shared whole-model tests)
from tests.emu.model_suite import greedy_tokens, load_bench, model_pair, one_slot_engine, relative
from tests.emu.op_suite import *  # noqa: F401,F403 (the shared operation tests)
from tests.emu.op_suite import CPU, host, random_weights


@pytest.fixture(scope="module")
def kernels():
    return EmuKernels()


@pytest.fixture(scope="module")
def backend(kernels):
    return CudaBackend(kernels, "float")  # float32-exact products; the int8 ones have their own tests


# ------------------------------------------------------------------ the emulator itself
def test_half_conversions_match_numpy_bit_for_bit(backend):
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    halves = halves[~np.isnan(halves.view(np.float16))]
    halves = np.concatenate([halves, np.zeros(-halves.size % 4, np.uint16)])  # whole blocks of 4
    decoded = backend.embed(backend.matrix(halves.view(np.uint8).reshape(1, -1), QType.F16, False), np.zeros(1))
    np.testing.assert_array_equal(decoded[0].view(np.uint32), halves.view(np.float16).astype(np.float32).view(np.uint32))

    rng = np.random.default_rng(0)
    floats = np.concatenate([rng.standard_normal(3998) * 10.0 ** rng.integers(-9, 6, 3998),
                             [65504, 65519.99, 65520, 1e6, -1e6, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 0.0, -0.0,
                              1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, np.inf, -np.inf]]).astype(np.float32)
    floats = floats[:floats.size // 4 * 4]
    out = np.empty((1, floats.size), np.float16)
    cuda_matmul.dequantize(backend.kernels, floats.view(np.uint8).reshape(1, -1), QType.F32, out)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out[0].view(np.uint16), floats.astype(np.float16).view(np.uint16))


def test_emulator_traps_misaligned_loads(kernels):
    raw = np.zeros(144 * 4 + 2, np.uint8)[2:].reshape(2, 288)  # q4_K rows 2 bytes off alignment
    x, y = np.zeros((1, 512), np.float32), np.zeros((1, 2), np.float32)
    with pytest.raises(EmulationError, match="misaligned 16-byte load"):
        kernels.function("matvec", "matvec_q4_K")((1,), (128,), (raw, x, y, np.int32(512), np.int32(2)))


def test_emulator_rejects_untyped_scalars(kernels):
    x = np.zeros(4, np.float32)
    with pytest.raises(EmulationError, match="launcher passed int"):
        kernels.function("scale", "scale_f32")((1,), (32,), (x, x, 4, np.float32(2)))
    with pytest.raises(EmulationError, match="takes 'f'"):
        kernels.function("scale", "scale_f32")((1,), (32,), (x, x, np.int32(4), np.int32(2)))


def test_emulator_rejects_launches_a_gpu_would(kernels):
    x = np.zeros(4, np.float32)
    with pytest.raises(EmulationError, match="invalid launch"):
        kernels.function("scale", "scale_f32")((1,), (2048,), (x, x, np.int32(4), np.float32(2)))
    with pytest.raises(EmulationError, match="no kernel"):
        kernels.function("scale", "add_f32")


def test_barriers_synchronize_threads(kernels):
    # One row per block: the block sum reads the other warps' partial sums from shared memory
    # after __syncthreads, which only adds up if the barrier really waits for all 8 warps.
    x = np.random.default_rng(1).standard_normal((3, 4096)).astype(np.float32)
    w, y = np.ones(4096, np.float32), np.empty_like(x)
    kernels.function("rmsnorm", "rmsnorm_f32")((3,), (256,), (x, w, y, np.int32(4096), np.float32(0)))
    np.testing.assert_allclose(y, x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True)), rtol=1e-5)


# ------------------------------------------------------------------ kernel choice
def test_long_prompts_take_the_gemm_paths(backend):
    cpu, gpu = model_pair("tiny-gemma3-q8_0", backend)
    ids = np.random.default_rng(3).integers(0, cpu.cfg.n_vocab, cuda_matmul.GEMM_MIN_TOKENS)
    backend.kernels.launched.clear()
    gpu.forward_seq(gpu.new_context(64, "f16", "f16"), ids, all_logits=True)  # the LM head too
    assert {"dequantize_q8_0", "softmax_lengths_f32", "get_rows_f16"} <= set(backend.kernels.launched)
    assert not {"matvec_q8_0", "matvec_batch_q8_0", "attention_f16_f16"} & set(backend.kernels.launched)
    backend.kernels.launched.clear()
    gpu.forward_seq(gpu.new_context(64, "f16", "f16"), ids[:FUSED_MAX_TOKENS])
    assert {"matvec_batch_q8_0", "matvec_q8_0", "attention_f16_f16"} <= set(backend.kernels.launched)  # the LM head: one token
    assert not {"dequantize_q8_0", "softmax_lengths_f32"} & set(backend.kernels.launched)


@pytest.mark.parametrize("prompt_rows, replayed", [(decode_graph.PROMPT_ROWS, True), (1, False)])
def test_a_short_prompt_is_one_replay_of_the_decode_step(backend, monkeypatch, prompt_rows, replayed):
    """On an engine whose decode graphs are captured (a first request's 5-token prompt, bucket 8, and
    its decode steps, bucket 1), a second request's 6-token prompt and its decode steps launch no
    kernel of their own, but for each step's argmax: the prompt is one graph replay. On the eager
    prompt pass (PROMPT_ROWS 1) the prompt launches its layers' kernels (33 on this model)."""
    from llogos_cli.tokenizer.tokenizer import Tokenizer
    monkeypatch.setattr(decode_graph, "PROMPT_ROWS", prompt_rows)
    _, gpu = model_pair("tiny-llama-q8_0", backend)
    tokenizer = Tokenizer.from_gguf(GGUFFile(need(FIXTURES / "tiny-llama-q8_0.gguf")))
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, gpu.cfg.n_vocab, n).tolist() for n in (5, 6)]
    engine = one_slot_engine(gpu, tokenizer)
    greedy_tokens(engine, prompts[0], 3)
    launched = len(backend.kernels.launched)
    greedy_tokens(engine, prompts[1], 3)
    kernels = backend.kernels.launched[launched:]
    own = [name for name in kernels if name != "argmax_rows_f32"]
    assert kernels.count("argmax_rows_f32") == 3, kernels
    assert own == [] if replayed else any(name.startswith("attention") for name in own), kernels


@pytest.mark.parametrize("row_tiles, kernel", [(2, "matmul_q8_mma_rows64_q4_0"), (4, "matmul_q8_mma_q4_0")])
def test_prompt_products_take_half_tiles_where_whole_ones_leave_multiprocessors_idle(kernels, row_tiles, kernel):
    """With int8 products, a prompt's product of an int8 type takes tiles of MMQ_ROWS rows where
    they give the GPU (the emulator's: 4 multiprocessors) a block each, else tiles of half."""
    int8 = CudaBackend(kernels, "int8")
    assert kernels.multiprocessors == 4
    rows, cols = row_tiles * cuda_matmul.MMQ_ROWS, 64
    w = int8.matrix(random_weights(np.random.default_rng(row_tiles), QType.Q4_0, rows, cols), QType.Q4_0, matmul=True)
    kernels.launched.clear()
    int8.matmul(int8.xp.asarray(np.ones((cuda_matmul.MMQ_TOKENS, cols), np.float32)), w)
    assert kernels.launched == ["quantize_q8", kernel]


@pytest.mark.parametrize("qtype", sorted(cuda_matmul.MMA_TYPES - cuda_matmul.INT8_TYPES, key=int), ids=lambda t: t.name)
def test_prompt_products_of_the_mma_only_types_take_int8_tensor_cores(kernels, qtype):
    """Types with int8 tensor-core runs (mma_runs.cuh) but no few-token integer products: a prompt's
    product takes 8-bit activations and matmul_q8_mma, not a dequantize and an f16 GEMM."""
    int8 = CudaBackend(kernels, "int8")
    cols = 256
    w = int8.matrix(random_weights(np.random.default_rng(int(qtype)), qtype, 40, cols), qtype, matmul=True)
    kernels.launched.clear()
    int8.matmul(int8.xp.asarray(np.ones((cuda_matmul.GEMM_MIN_TOKENS, cols), np.float32)), w)
    assert kernels.launched == ["quantize_q8", f"matmul_q8_mma_rows64_{cuda_matmul.TYPE_SUFFIX[qtype]}"]


@pytest.mark.parametrize("qtype, rows, kernel", [(QType.Q4_K, 4096, "matvec_rows2_q4_K"), (QType.Q8_0, 4096, "matvec_rows2_q8_0"),
                                                 (QType.Q4_K, 1024, "matvec_q4_K"), (QType.Q6_K, 4096, "matvec_q6_K")])
def test_one_token_products_take_two_rows_a_warp_where_that_measured_faster(backend, qtype, rows, kernel):
    cols = 256
    w = backend.matrix(random_weights(np.random.default_rng(rows), qtype, rows, cols), qtype, matmul=True)
    backend.kernels.launched.clear()
    backend.matmul(backend.xp.asarray(np.ones((1, cols), np.float32)), w)
    assert backend.kernels.launched == [kernel]


def test_captured_steps_keep_expert_products_pair_by_pair(backend):
    """Grouping a prompt's pairs by expert waits for their counts on the host, which a captured
    step could not replay: captured, even GROUP_MIN_TOKENS rows take matvec_experts."""
    rng = np.random.default_rng(6)
    n_tok, n_expert, out, cols = cuda_experts.GROUP_MIN_TOKENS, 4, 8, 64
    w = backend.matrix(random_weights(rng, QType.Q8_0, n_expert * out, cols), QType.Q8_0, matmul=True)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    experts = np.stack([rng.permutation(n_expert)[:2] for _ in range(n_tok)]).astype(np.int32)
    backend.kernels.launched.clear()
    graph, captured = backend.capture(lambda: backend.matmul_experts(x, w, experts, n_expert))
    assert backend.kernels.launched == ["matvec_experts_q8_0"]
    graph.launch()
    eager = backend.matmul_experts(x, w, experts, n_expert)
    assert "moe_sort_i32" in backend.kernels.launched
    np.testing.assert_array_equal(captured, eager)   # the tiles dot their rows in matvec_experts' order


def test_decode_rows_take_one_launch_per_op(backend):
    """However many rows a decode step holds, and whichever slots: one attention launch per attention
    layer and one launch of each recurrent op per Gated DeltaNet layer, which a graph can replay."""
    _, gpu = model_pair("tiny-qwen35-f32", backend)
    rows = FUSED_MAX_TOKENS + 4
    cache = gpu.new_cache(rows, 8, "f16", "f16")
    slots = np.random.default_rng(5).permutation(rows).astype(np.int32)
    backend.kernels.launched.clear()
    gpu.forward_rows(cache, np.arange(rows, dtype=np.int32), slots, np.zeros(rows, np.int32))
    recurrent = sum(gpu.cfg.recurrent)
    count = {name: backend.kernels.launched.count(name) for name in ("attention_f16_f16", "ssm_conv_f32", "delta_net_f32")}
    assert count == {"attention_f16_f16": gpu.cfg.n_layer - recurrent, "ssm_conv_f32": recurrent, "delta_net_f32": recurrent}
    assert "softmax_lengths_f32" not in backend.kernels.launched


def test_rotated_layers_turn_and_store_in_one_launch(backend):
    """RoPE's layers turn q and k and store k and v in one rope_store launch a layer, not rope and kv_store."""
    _, gpu = model_pair("tiny-llama-q8_0", backend)
    backend.kernels.launched.clear()
    gpu.forward_seq(gpu.new_context(16, "f16", "f16"), np.arange(3, dtype=np.int32))
    assert backend.kernels.launched.count("rope_store_norm_f16_f16") == gpu.cfg.n_layer
    assert not {"rope_norm_f32", "kv_store_f16"} & set(backend.kernels.launched)


def test_batch_layout_splits_runs_and_groups_equal_ones(backend):
    # Padding rows repeat the scratch slot (5) at position 0: each is a run of its own.
    slots = np.array([3, 3, 3, 0, 1, 1, 1, 2, 5, 5], np.int32)
    pos = np.array([4, 5, 6, 9, 0, 1, 2, 7, 0, 0], np.int32)
    layout = backend.batch_layout(slots, pos)
    assert layout.runs == (Run(3, 0, 3), Run(0, 3, 4), Run(1, 4, 7), Run(2, 7, 8), Run(5, 8, 9), Run(5, 9, 10))
    assert layout.groups == ((0, 3, 3), (3, 4, 1), (4, 7, 3), (7, 10, 1))
    assert (layout.max_slot, layout.max_pos) == (5, 9)
    np.testing.assert_array_equal(host(backend, layout.slots), slots)
    np.testing.assert_array_equal(host(backend, layout.pos), pos)


def test_attention_launches_short_runs_together(backend):
    long = FUSED_MAX_TOKENS + 1
    runs = (Run(0, 0, 1), Run(1, 1, 3), Run(2, 3, 3 + long), Run(3, 3 + long, 4 + long), Run(4, 4 + long, 5 + long))
    assert cuda_attention._spans(runs) == [(0, 3, None), (3, 3 + long, 2), (3 + long, 5 + long, None)]


def test_split_attention_rule(backend):
    """Which fused launches split the keys: by the cache's positions a slot (paged: its blocks),
    never by a query's depth, so that a captured decode step replays at any depth."""
    split = cuda_attention.split_chunks
    small = backend.kv_cache(2, cuda_attention.SPLIT_MIN_POSITIONS - 1, 8, 64, 64, "f16", "f16")
    large = backend.kv_cache(2, cuda_attention.SPLIT_MIN_POSITIONS, 8, 64, 64, "f16", "f16")
    assert split(small, 1, 32) == 1
    assert split(large, 1, 32) == cuda_attention.SPLIT_MIN_POSITIONS // cuda_attention.SPLIT_MIN_KEYS
    assert split(large, 1, 8 * cuda_attention.SPLIT_MAX_GROUP + 8) == 1         # groups wider than a block holds
    assert split(large, cuda_attention.SPLIT_BLOCKS // 8, 32) == 1              # enough blocks unsplit
    tables = backend.block_tables(2, cuda_attention.SPLIT_MIN_POSITIONS // 16)
    assert split(backend.paged_kv_cache(tables, 8, 16, 8, 64, 64, "f16", "f16"), 1, 32) > 1


def test_flash_attention_rule(backend, kernels):
    """Which prompt runs attention_flash takes, decided by flash_takes alone: causal runs of
    FLASH_MIN_TOKENS or more from caches of FLASH_TYPES with one head size of FLASH_HEAD_DIMS and
    KV groups a block holds; a kernel for each such pair and size, and no other."""
    takes, n = cuda_attention.flash_takes, cuda_attention.FLASH_MIN_TOKENS
    assert sorted(kernels.modules["attention_flash"]) == sorted(
        f"attention_flash_{tk}_{tv}_d{d}" for tk, tv in cuda_attention.FLASH_TYPES for d in cuda_attention.FLASH_HEAD_DIMS)
    for d in cuda_attention.FLASH_HEAD_DIMS:
        for tk, tv in cuda_attention.FLASH_TYPES:
            assert takes(backend.kv_cache(1, 8, 2, d, d, tk, tv), n, 16, True)
    f16 = backend.kv_cache(1, 8, 2, 64, 64, "f16", "f16")
    assert not takes(f16, n - 1, 16, True)                            # shorter runs
    assert not takes(f16, n, 16, False)                               # an encoder's runs
    assert not takes(f16, n, 2 * (cuda_attention.FLASH_ROWS + 1), True)   # a group wider than a block
    for tk, tv, dk, dv in (("f32", "f32", 64, 64), ("f16", "f32", 64, 64), ("q4_0", "f16", 64, 64),
                           ("f16", "f16", 96, 96), ("f16", "f16", 64, 32)):
        assert not takes(backend.kv_cache(1, 8, 2, dk, dv, tk, tv), n, 16, True), (tk, tv, dk, dv)


def test_quantized_weights_stay_quantized(backend):
    raw = random_weights(np.random.default_rng(4), QType.Q4_K, 8, 256)
    w = backend.matrix(raw, QType.Q4_K, matmul=True)
    assert w.nbytes == raw.nbytes and w.raw.dtype == np.uint8 and w.raw.shape == raw.shape
    assert backend.matrix(raw, QType.Q4_K, matmul=False).nbytes == 0  # a lookup table: a row per token


# ------------------------------------------------------------------ the benchmark's models
@pytest.mark.parametrize("mix, hybrid, types", [("q4_k_m", False, {QType.F32, QType.Q4_K, QType.Q6_K}),
                                               ("q4_1", False, {QType.F32, QType.Q4_1, QType.Q8_0}),
                                               ("q4_k_m", True, {QType.F32, QType.Q4_K, QType.Q6_K})])
def test_bench_models_load_and_run(backend, tmp_path, mix, hybrid, types):
    bench = load_bench()
    # The hybrid as Qwen3.5's: DeltaNet layers 0-2, gated attention with partial rotation in 3.
    shape = dict(head_dim=64, rope_dims=16, hybrid=bench.Hybrid(2, 4, 64, 64)) if hybrid else {}
    spec = bench.Spec("tiny", 300, 256, 4 if hybrid else 3, 4, 2, 512, 10000.0, tied=mix == "q4_1" or hybrid,
                      mix=mix, **shape)
    f = GGUFFile(bench.write_model(spec, tmp_path / "tiny.gguf"))
    assert {t.ggml_type for t in f.tensors.values()} == types
    cpu, gpu = Model(f, CPU), Model(f, backend)
    assert gpu.cfg.recurrent == ((True, True, True, False) if hybrid else (False,) * 3)
    ids = np.arange(5, dtype=np.int32) * 7
    want = cpu.forward_seq(cpu.new_context(16, "f32", "f32"), ids, all_logits=True)
    got = backend.to_host(gpu.forward_seq(gpu.new_context(16, "f32", "f32"), ids, all_logits=True))
    assert np.all(np.isfinite(want)) and np.abs(want).max() > 1e-3
    assert relative(got, want) < 2e-5


@pytest.mark.parametrize("cache", ["f16", "q8_0"])
def test_a_model_s_prompt_through_the_flash_kernel(backend, tmp_path, cache, monkeypatch):
    """A prompt of 40 tokens (flash from 17 here) of a model with heads of 64 in groups of 2: every
    layer's attention one attention_flash launch; the logits within the f16 attention's 3e-3 of
    their range of the NumPy backend's (1e-2 from q8_0 caches: test_long_prompt_attention_in_f16's
    bounds; measured 5.9e-4 with f16, as the f16 GEMM path's 5.9e-4)."""
    bench = load_bench()
    spec = bench.Spec("tiny", 300, 256, 2, 4, 2, 512, 10000.0, tied=False, mix="q4_1")
    f = GGUFFile(bench.write_model(spec, tmp_path / "tiny.gguf"))
    cpu, gpu = Model(f, CPU), Model(f, backend)
    ids = np.arange(40, dtype=np.int32) * 7 % spec.n_vocab
    monkeypatch.setattr(cuda_attention, "FLASH_MIN_TOKENS", FUSED_MAX_TOKENS + 1)
    launched = len(backend.kernels.launched)
    got = backend.to_host(gpu.forward_seq(gpu.new_context(64, cache, cache), ids, all_logits=True))
    assert backend.kernels.launched[launched:].count(f"attention_flash_{cache}_{cache}_d64") == spec.n_layer
    want = cpu.forward_seq(cpu.new_context(64, cache, cache), ids, all_logits=True)
    assert relative(got, want) < {"f16": 3e-3, "q8_0": 1e-2}[cache]
    assert np.mean(got.argmax(1) == want.argmax(1)) > 0.9


def test_q_and_k_load_together_where_only_v_s_type_differs(backend, tmp_path):
    """Q4_K_M's layers with a Q6_K v: q and k are one matrix on the device (one launch for both
    in a decode step), v its own; the layers whose three share a type keep one for all three."""
    bench = load_bench()
    spec = bench.Spec("tiny", 300, 256, 3, 4, 2, 512, 10000.0, tied=False, mix="q4_k_m")
    f = GGUFFile(bench.write_model(spec, tmp_path / "tiny.gguf"))
    gpu = Model(f, backend)
    mixed = 0
    for il in range(gpu.cfg.n_layer):
        names = [f"blk.{il}.attn_{x}.weight" for x in "qkv"]
        types = [f.tensors[name].ggml_type for name in names]
        ids = tuple(id(gpu.w[name]) for name in names)
        if types[0] == types[1] != types[2]:
            mixed += 1
            assert ids[:2] in backend._joined and ids not in backend._joined
        else:
            assert ids in backend._joined
    assert mixed
