"""The CUDA backend on a GPU: the operation and whole-model checks shared with the emulated tests
(emu/op_suite.py, emu/model_suite.py), synthetic models of real shapes against the CPU backend,
the command line with --backend cuda, and the real SmolLM2 against the reference outputs where
it is installed. Skipped without CuPy and a GPU."""

import dataclasses
import json

import numpy as np
import pytest

from llogos_cli.backends import cuda_available
from llogos_cli.engine.decode_graph import GraphDecoder
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.batch import Batch
from llogos_cli.model.forward import Model
from tests.conftest import FIXTURES, REFERENCE, assert_teacher_forced, need
from tests.conftest import reference as reference_outputs  # op_suite has a reference() of its own
from tests.emu.encoder_suite import *  # noqa: F401,F403 (the shared encoder and embedding tests)
from tests.emu.model_suite import *  # noqa: F401,F403 (the shared whole-model tests)
from tests.emu.model_suite import load_bench, relative
from tests.emu.op_suite import *  # noqa: F401,F403 (the shared operation tests)
from tests.emu.op_suite import CPU
from tests.test_cli import env, llogos  # noqa: F401 (env is a fixture)
from tests.test_embeddings import FAMILIES as EMBEDDING_FAMILIES
from tests.test_embeddings import HERE, TEXTS
from tests.test_embeddings import assert_close as assert_cosine
from tests.test_embeddings import oracle as embedding_oracle

pytestmark = pytest.mark.skipif(not cuda_available(), reason="needs CuPy and a CUDA GPU")


@pytest.fixture(scope="module")
def backend():
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    return CudaBackend(products="float")  # float32-exact products; the int8 ones have their own tests


@pytest.fixture(scope="module")
def real_shapes(tmp_path_factory) -> dict:
    """SmolLM2-135M as shipped (Q4_1, Q8_0 embeddings), two layers of Llama-3.1-8B in Q4_K_M, and
    the first four layers of the Qwen3.5-0.8B hybrid (three DeltaNet, one attention)."""
    bench, folder = load_bench(), tmp_path_factory.mktemp("models")
    specs = {"smollm2-135m": bench.SPECS["smollm2-135m"],
             "llama-8b-2-layers": dataclasses.replace(bench.SPECS["llama-8b"], n_layer=2),
             "qwen35-0.8b-4-layers": dataclasses.replace(bench.SPECS["qwen35-0.8b"], n_layer=4)}
    return {name: GGUFFile(bench.write_model(spec, folder / f"{name}.gguf")) for name, spec in specs.items()}


@pytest.mark.parametrize("name", ["smollm2-135m", "llama-8b-2-layers", "qwen35-0.8b-4-layers"])
def test_real_shapes_match_the_cpu_backend(backend, real_shapes, name):
    f = real_shapes[name]
    cpu, gpu = Model(f, CPU), Model(f, backend)
    ids = np.random.default_rng(5).integers(2, cpu.cfg.n_vocab, 45).astype(np.int32)
    c_ctx, g_ctx = cpu.new_context(64, "f32", "f32"), gpu.new_context(64, "f32", "f32")  # f32 caches on both
    # A long prompt (f16 GEMMs: activations and weights rounded to half precision, unit roundoff
    # 2^-11, through every product of the layers and the output; such operands land between 1e-3
    # and 1e-2), then single tokens and a short batch (matrix-vector kernels).
    for chunk, tolerance in ((ids[:40], 1e-2), (ids[40:41], 3e-3), (ids[41:45], 3e-3)):
        want = cpu.forward_seq(c_ctx, chunk, all_logits=True)
        got = backend.to_host(gpu.forward_seq(g_ctx, chunk, all_logits=True))
        assert np.all(np.isfinite(got)) and relative(got, want) < tolerance, len(chunk)
    # Decoding over a prompt that went through the matrix-vector path agrees to float32 accuracy.
    c_ctx, g_ctx = cpu.new_context(64, "f32", "f32"), gpu.new_context(64, "f32", "f32")
    for t in range(6):
        want = cpu.forward_seq(c_ctx, ids[t:t + 1])
        got = backend.to_host(gpu.forward_seq(g_ctx, ids[t:t + 1]))
        assert relative(got, want) < 1e-4, t


@pytest.mark.parametrize("rows", [5, 64])  # decode rows through matrix-vector kernels; through f16 GEMMs
def test_batched_decode_of_real_shapes_matches_the_cpu_backend(backend, real_shapes, rows):
    """Rows of sequences of different lengths, prompts run as one batch (f16 GEMMs), then decode
    steps from the CUDA graph of their bucket with the rows in changing order."""
    f = real_shapes["smollm2-135m"]
    cpu, gpu = Model(f, CPU), Model(f, backend)
    rng = np.random.default_rng(9)
    lengths = rng.integers(1, 12, rows)
    prompts = Batch.join([Batch.run(rng.integers(2, cpu.cfg.n_vocab, n), slot, 0, [n - 1])
                          for slot, n in enumerate(lengths)])
    c_cache, g_cache = cpu.new_cache(rows, 32, "f32", "f32"), gpu.new_cache(rows, 32, "f32", "f32")
    want = cpu.forward(c_cache, prompts)
    assert relative(backend.to_host(gpu.forward(g_cache, prompts)), want) < 3e-3
    step = GraphDecoder(gpu, g_cache).step
    for _ in range(3):
        slots = rng.permutation(rows).astype(np.int32)
        tokens = rng.integers(2, cpu.cfg.n_vocab, rows).astype(np.int32)
        pos = lengths[slots].astype(np.int32)
        want = cpu.forward_rows(c_cache, tokens, slots, pos)
        got = backend.to_host(step(tokens, slots, pos))
        assert np.all(np.isfinite(got)) and relative(got, want) < 3e-3
        lengths[slots] += 1


def test_greedy_generation_matches_the_cpu_backend_but_for_near_ties(backend, real_shapes):
    f = real_shapes["smollm2-135m"]
    cpu, gpu = Model(f, CPU), Model(f, backend)
    c_ctx, g_ctx = cpu.new_context(64, "f16", "f16"), gpu.new_context(64, "f16", "f16")
    prompt = np.array([2, 300, 4000, 12345], np.int32)
    c_logits, g_logits = cpu.forward_seq(c_ctx, prompt)[-1], gpu.forward_seq(g_ctx, prompt)
    step, slot = GraphDecoder(gpu, g_ctx.cache).step, np.zeros(1, np.int32)
    for n in range(24):
        want, got = int(np.argmax(c_logits)), int(backend.argmax_rows(g_logits)[0])
        if got != want:  # allowed only where the CPU's best two are within float error
            top2 = np.sort(c_logits)[-2:]
            assert top2[1] - top2[0] < 1e-3 * np.abs(c_logits).max(), n
            break
        c_logits = cpu.forward_seq(c_ctx, np.array([want], np.int32))[-1]
        g_logits = step(np.array([got], np.int32), slot, np.array([len(prompt) + n], np.int32))


# ------------------------------------------------------------------ the command line on the GPU
def greedy_ids(env, backend: str, *args) -> list[list]:
    """[id, top-2 logprobs] per token of a greedy `generate --json` on the backend."""
    r = llogos(env, "generate", "--backend", backend, "--temp", "0", "--ignore-eos", "--json", "--logprobs", "2", *args)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    records = [json.loads(line) for line in r.stdout.splitlines()]
    assert records[-1]["done"]
    return [(rec["id"], rec["logprobs"]) for rec in records[:-1]]


def assert_same_greedy_tokens(cpu: list, gpu: list, near_tie: float) -> None:
    """Equal ids up to the first step where the CPU's best two are within near_tie nats."""
    assert len(cpu) == len(gpu)
    for n, ((want, top), (got, _)) in enumerate(zip(cpu, gpu)):
        if top[0][1] - top[1][1] < near_tie:
            return
        assert got == want, n


@pytest.mark.parametrize("cache", ["f16", "q8_0", "q4_0", "iq4_nl"])
@pytest.mark.parametrize("name", ["tiny-qwen3-f32", "tiny-qwen35-f32"])  # heads of 32: block caches
def test_cli_generate_on_the_gpu_matches_the_cpu(env, name, cache):
    args = ("-m", str(need(FIXTURES / f"{name}.gguf")), "--tokens", "5,17,300,42", "-n", "16",
            "--cache-type-k", cache, "--cache-type-v", cache)
    assert_same_greedy_tokens(greedy_ids(env, "cpu", *args), greedy_ids(env, "cuda", *args), 1e-3)


def test_cli_chat_from_a_pipe_on_the_gpu(env):
    args = ("chat", "-m", str(need(FIXTURES / "tiny-qwen2-q8_0.gguf")), "--chat-template", "chatml", "--temp", "0",
            "-n", "12")
    cpu, gpu = (llogos(env, *args, "--backend", b, stdin="Hello there\nAnd again\n") for b in ("cpu", "cuda"))
    assert gpu.returncode == 0 and "Traceback" not in gpu.stderr, gpu.stderr
    assert gpu.stdout and gpu.stdout == cpu.stdout   # two replies, nothing else on stdout


def test_cli_perplexity_on_the_gpu_within_one_percent_of_the_cpu(env):
    args = ("perplexity", "-m", str(need(FIXTURES / "tiny-llama-q8_0.gguf")), "-f", str(need(REFERENCE / "ppl.txt")),
            "-c", "64", "--chunks", "6", "--json")
    cpu, gpu = (llogos(env, *args, "--backend", b) for b in ("cpu", "cuda"))
    assert gpu.returncode == 0, gpu.stderr
    assert abs(json.loads(gpu.stdout)["ppl"] / json.loads(cpu.stdout)["ppl"] - 1) < 0.01


@pytest.mark.parametrize("name", list(EMBEDDING_FAMILIES))
def test_cli_embed_on_the_gpu_matches_transformers(env, name):
    """`llogos embed --backend cuda` of the embedding fixtures (an encoder, a decoder), pooled as
    their GGUFs say, against transformers' vectors as test_embeddings holds the CPU's."""
    args = [arg for text in TEXTS for arg in ("-p", text)]
    r = llogos(env, "embed", "--backend", "cuda", "-m", str(HERE / f"{name}-f32.gguf"), *args, "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert_cosine([json.loads(line)["embedding"] for line in r.stdout.splitlines()],
                  embedding_oracle(name)[0][EMBEDDING_FAMILIES[name]])


def test_serve_embeddings_on_the_gpu_match_transformers(env, tmp_path):
    """`serve --backend cuda`'s /v1/embeddings of the encoder fixture, as the CPU server's."""
    from tests.test_server import Server   # skips where the server's extras are not installed
    server = Server(env, tmp_path / "log", "-m", str(HERE / "tiny-bert-embed-f32.gguf"), "--backend", "cuda",
                    "-np", "2", "-c", "32")
    try:
        r = server.post("/v1/embeddings", {"input": TEXTS, "encoding_format": "float"})
    finally:
        server.stop()
    assert r.status_code == 200, r.text
    assert_cosine([d["embedding"] for d in r.json()["data"]], embedding_oracle("tiny-bert-embed")[0]["mean"])
    assert "Traceback" not in server.log.read_text()


# ------------------------------------------------------------------ the real SmolLM2 on the GPU
@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M, where installed (bench/gpu_session.sh assembles it on the GPU machine from
    the parts it carries)."""
    from llogos_cli.model.loader import load
    from llogos_cli.model.registry import find_entry, is_installed
    if not is_installed(find_entry("smollm2-135m")):
        pytest.skip("smollm2-135m is not installed here")
    return load("smollm2-135m", "cuda"), reference_outputs("smollm2-135m")


def test_smollm2_generate_follows_llama_cpp_where_it_is_decisive(env, smollm2):
    _, ref = smollm2
    for case in ref["generation"]:
        steps = case["llamacpp"]["steps"]
        tokens = greedy_ids(env, "cuda", "-m", "smollm2-135m", "--tokens", ",".join(map(str, case["prompt_ids"])),
                            "-n", str(len(steps)))
        for i, (step, (got, _)) in enumerate(zip(steps, tokens)):
            (top1, lp1), (_, lp2) = step["top5"][:2]
            if lp1 - lp2 < 0.5:
                break   # from a near-tie on the continuations may differ
            assert got == top1, (case["id"], i)


@pytest.fixture(scope="module")
def smollm2_float(smollm2):
    """The same model with float32 activations in every product (a prompt's: f16 GEMMs)."""
    from llogos_cli.model.loader import load
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLOGOS_CUDA_PRODUCTS", "float")
        return load("smollm2-135m", "cuda")


# A whole prompt's logprobs with 8-bit activations (the default: int8 tensor cores, as llama.cpp's
# MMQ) against transformers' float32 ones: the CPU's integer products, which quantize the same way,
# came within 0.53 on these cases (2026-12-07); float32 activations within 2e-3.
INT8_PREFILL_LOGPROB = 1.0


def test_smollm2_logprobs_match_transformers(smollm2, smollm2_float):
    """Decode steps (matrix-vector kernels) within 2e-3 of transformers' float32 logprobs, as on
    the CPU; a whole prompt at once within 5e-2 with float32 activations (f16 tensor-core products)
    and within INT8_PREFILL_LOGPROB with 8-bit ones, both with llama.cpp's decisive top-1."""
    m, ref = smollm2
    b = m.model.backend
    for case in ref["generation"]:
        prompt, generated = case["prompt_ids"], case["llamacpp"]["generated_ids"]
        ids = np.asarray(prompt + generated, np.int32)
        ctx = m.model.new_context(256, "f32", "f32")
        stepped = np.stack([b.to_host(m.model.forward_seq(ctx, ids[i:i + 1]))[-1] for i in range(len(ids))])
        assert_teacher_forced(stepped, case, 2e-3, "decode steps")
        for loaded, tolerance, label in ((smollm2_float, 5e-2, "one prefill, float32 activations"),
                                         (m, INT8_PREFILL_LOGPROB, "one prefill, 8-bit activations")):
            model = loaded.model
            at_once = model.backend.to_host(model.forward_seq(model.new_context(256, "f32", "f32"), ids, all_logits=True))
            assert_teacher_forced(at_once, case, tolerance, label)


def test_smollm2_perplexity_within_one_percent_of_the_cpu(env, smollm2):
    from llogos_cli.engine.perplexity import perplexity
    from llogos_cli.model.loader import load
    text = need(REFERENCE / "ppl.txt")
    cpu = load("smollm2-135m", "cpu")
    want = perplexity(cpu.model, cpu.tokenizer, text.read_text(encoding="utf-8"), 128).ppl
    r = llogos(env, "perplexity", "-m", "smollm2-135m", "--backend", "cuda", "-f", str(text), "-c", "128", "--json")
    assert r.returncode == 0, r.stderr
    assert abs(json.loads(r.stdout)["ppl"] / want - 1) < 0.01
