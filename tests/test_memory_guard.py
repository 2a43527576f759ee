"""Models that do not fit are refused before loading, with one line; auto holds weights as fits."""

import subprocess
import sys

import pytest
from gguf import GGMLQuantizationType

from llogos_cli.backends import CPU_DOT_TYPES
from llogos_cli.backends.cpu import cpu_quant
from llogos_cli.backends.cpu.cpu_quant_int8 import packed_bytes
from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model import forward, loader, memory
from llogos_cli.model.config import ModelConfig
from tests.conftest import FIXTURES, need

TINY = FIXTURES / "tiny-llama-q8_0.gguf"
MiB = 1 << 20


@pytest.fixture
def tiny():
    f = GGUFFile(need(TINY))
    return f, ModelConfig.from_gguf(f)


def test_kv_cache_estimate_is_what_the_cpu_allocates(tiny):
    f, cfg = tiny
    model = loader.load(str(TINY), "cpu", "f32").model
    for type_k, type_v in (("f32", "f32"), ("f16", "f32")):
        ctx = model.new_context(96, type_k, type_v)
        allocated = sum(a.nbytes for kv in ctx.cache.kv if kv is not None for a in (kv.k, kv.v))
        slots = ctx.cache.n_slots + 1   # the cache's padding slot comes on top of the one sequence
        assert memory.need(f, cfg, "quantized", 96, type_k, type_v).kv_cache * slots == allocated


def test_estimate_holds_one_context_whatever_the_slots_and_grows_with_float32_weights(tiny):
    f, cfg = tiny
    one = memory.need(f, cfg, "quantized", 512, "f32", "f32")
    # the paged pool needs one full context, whatever -np
    assert memory.need(f, cfg, "quantized", 512, "f32", "f32", n_slots=16).kv_cache == one.kv_cache
    assert memory.need(f, cfg, "cuda", 512, "f16", "f16", n_slots=16).kv_cache == memory.need(
        f, cfg, "cuda", 512, "f16", "f16").kv_cache
    f32 = memory.need(f, cfg, "f32", 512, "f32", "f32")
    # matrices in products take 4 bytes a weight instead of q8_0's tiles; token_embd, only looked up, stays
    expanded = [t for name, t in f.tensors.items() if len(t.shape) == 2 and name != "token_embd.weight"]
    assert f32.weights - one.weights == sum(4 * t.shape[0] * t.shape[1] - packed_bytes(t.ggml_type, t.nbytes) for t in expanded)


def test_quantized_estimate_is_what_the_cpu_holds(tiny):
    """The matrices in products as their integer products tile them (more bytes than the file's for
    some types), the rest as the file has them: the estimate is within the last tiles' padding."""
    f, cfg = tiny
    model = loader.load(str(TINY), "cpu", "quantized").model
    held = sum(w.nbytes for w in model.w.values())   # the products' blocks, the vectors as float32
    lookups = sum(f.tensors[name].nbytes for name, w in model.w.items() if hasattr(w, "in_products") and not w.in_products)
    estimate = memory.need(f, cfg, "quantized", 64, "f32", "f32").weights
    assert held + lookups <= estimate <= (held + lookups) * 1.01
    # Q3_K's sixteen six-bit scales take a byte each once tiled: 114 bytes a block for 110
    assert packed_bytes(GGMLQuantizationType.Q3_K, 110 * 1000) == 114 * 1000
    assert packed_bytes(GGMLQuantizationType.MXFP4, 17 * 1000) == 17 * 1000
    assert packed_bytes(GGMLQuantizationType.Q4_K, 144 * 1000) == 148 * 1000
    assert packed_bytes(GGMLQuantizationType.IQ4_XS, 136 * 1000) == 138 * 1000   # eight signed scales a byte each
    assert packed_bytes(GGMLQuantizationType.Q2_K, 84 * 1000) == 84 * 1000       # its scale-and-min bytes kept


def test_estimates_for_float32_and_cuda_weights_leave_numba_unloaded():
    """Only the quantized estimate reads the tile sizes of the integer products, whose module brings
    numba (~0.4 s and ~100 MB): the float32 and CUDA paths never load it."""
    code = ("import sys; from llogos_cli.gguf.file import GGUFFile; from llogos_cli.model import memory; "
            "from llogos_cli.model.config import ModelConfig; "
            f"f = GGUFFile({str(need(TINY))!r}); cfg = ModelConfig.from_gguf(f); "
            "memory.need(f, cfg, 'f32', 64, 'f32', 'f32'); memory.need(f, cfg, 'cuda', 64, 'f16', 'f16'); "
            "assert 'numba' not in sys.modules; memory.need(f, cfg, 'quantized', 64, 'f32', 'f32'); "
            "assert 'numba' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_model_that_does_not_fit_is_refused_before_loading(tiny, monkeypatch):
    f, cfg = tiny
    quantized = memory.need(f, cfg, "quantized", 256, "f16", "f16").total   # with the default KV cache
    monkeypatch.setattr(memory, "host_available", lambda: quantized - 1)
    monkeypatch.setattr(forward.Model, "__init__", lambda *a: pytest.fail("weights were read"))
    with pytest.raises(LlogosError) as e:
        loader.load(str(TINY), "cpu", "quantized", n_ctx=256)
    message = str(e.value)
    assert "\n" not in message
    assert f"{quantized / memory.GiB:.1f} GiB" in message and "available" in message and "-c" in message


def test_f32_that_does_not_fit_suggests_quantized_and_auto_takes_it(tiny, monkeypatch):
    f, cfg = tiny
    f32 = memory.need(f, cfg, "f32", 256, "f16", "f16").total   # with the default KV cache
    monkeypatch.setattr(memory, "host_available", lambda: f32 - 1)
    with pytest.raises(LlogosError, match="--cpu-weights quantized"):
        loader.load(str(TINY), "cpu", "f32", n_ctx=256)
    loaded = loader.load(str(TINY), "cpu", "auto", n_ctx=256)
    assert loaded.model.backend.weights == "quantized" and "quantized" in loaded.memory


def test_auto_reads_blocks_where_every_product_has_a_kernel_and_else_expands_a_small_model(tiny, monkeypatch):
    f, cfg = tiny
    monkeypatch.setattr(memory, "host_available", lambda: 64 << 30)
    assert memory.choose_cpu_weights(f, cfg, "auto", 256, "f32", "f32")[0] == "quantized"   # q8_0 has a block kernel
    assert memory.choose_cpu_weights(f, cfg, "auto", 256, "f32", "f32", n_slots=4)[0] == "quantized"
    monkeypatch.setattr(memory, "CPU_DOT_TYPES", frozenset())    # as for F16 or BF16 matrices
    monkeypatch.setattr(memory, "CPU_INT8_TYPES", frozenset())
    assert memory.choose_cpu_weights(f, cfg, "auto", 256, "f32", "f32")[0] == "f32"
    assert memory.choose_cpu_weights(f, cfg, "auto", 256, "f32", "f32", n_slots=4)[0] == "f32"
    monkeypatch.setattr(memory, "F32_MAX_WEIGHTS", 1000)
    assert memory.choose_cpu_weights(f, cfg, "auto", 256, "f32", "f32", n_slots=4)[0] == "quantized"
    assert memory.choose_cpu_weights(f, cfg, "f32", 256, "f32", "f32")[0] == "f32"


def test_the_types_read_in_their_blocks_are_the_integer_products_where_the_cpu_has_them():
    """auto's rule: a small Q2_K, Q3_K, IQ4_NL, IQ4_XS or MXFP4 model stays in its blocks where
    the integer products run them, and is expanded to float32 where they do not."""
    assert cpu_quant.block_types("float") == CPU_DOT_TYPES
    assert GGMLQuantizationType.Q3_K not in CPU_DOT_TYPES
    if cpu_quant.host_isa() is not None:
        with_int8 = cpu_quant.block_types()
        assert {GGMLQuantizationType.Q2_K, GGMLQuantizationType.Q3_K, GGMLQuantizationType.IQ4_NL,
                GGMLQuantizationType.IQ4_XS, GGMLQuantizationType.MXFP4} <= with_int8
        assert CPU_DOT_TYPES <= with_int8 and GGMLQuantizationType.F16 not in with_int8


def test_host_available_is_a_plausible_number():
    assert 16 * MiB < memory.host_available() < 1 << 50


def test_cli_refuses_an_absurd_context_in_one_line():
    def generate(*extra):
        return subprocess.run([sys.executable, "-m", "llogos_cli", "generate", "-m", str(need(TINY)), "-p", "hi",
                               "-n", "1", "--backend", "cpu", "-c", "2000000000", *extra],
                              capture_output=True, text=True, timeout=60)

    r = generate("--allow-long-ctx")
    assert r.returncode == 1 and r.stdout == ""
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr
    assert "needs" in errors[0] and "available" in errors[0] and "smaller -c" in errors[0]
    r = generate()   # without the override, -c stops at the trained context, which fits
    assert r.returncode == 0, r.stderr
    assert "-c 2000000000 capped at the 256 tokens" in r.stderr
