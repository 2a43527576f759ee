"""The CUDA backend's launch budget (bench/launch_budget.py, docs/PERF.md): the kernel launches of
one decode step's layers, counted under the CPU emulator, may not grow back past the counts
recorded here. Lower them here when a fusion cuts launches."""

import importlib.util
from pathlib import Path

import pytest

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.forward import Model
from tests.conftest import need

# Launches in all the layers of each fixture's decode step (batch 1, default products); before RoPE
# went into the KV store (rope_store.cu) llama's were 42, gemma3's 54, qwen35's 93; before the
# residual adds went into the products' epilogues (matvec_add) llama's were 33, qwen35's 90; before
# the products after a layer's input norms normalized their input themselves (matvec_norm) and the
# gate and up products applied the GLU (matvec_glu) llama's were 27, gemma3's 45, smollm3's 37.
LAYER_LAUNCHES = {"tiny-llama-q8_0": 18, "tiny-qwen2-q8_0": 18, "tiny-qwen3-f32": 24, "tiny-gemma3-q8_0": 36,
                  "tiny-qwen35-f32": 76, "tiny-gemma2-q8_0": 30, "tiny-phi3-q8_0": 14, "tiny-granite-q8_0": 20,
                  "tiny-olmo2-q8_0": 24, "tiny-smollm3-q8_0": 25, "tiny-lfm2-q8_0": 35, "tiny-qwen3moe-q8_0": 30,
                  "tiny-gpt-oss-q8_0": 66, "tiny-qwen2moe-q8_0": 48}


def load_budget():
    spec = importlib.util.spec_from_file_location("launch_budget", Path(__file__).resolve().parents[1] / "bench" / "launch_budget.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return load_budget()


def test_every_family_fixture_has_a_budget(bench):
    assert set(bench.FAMILY_FIXTURES) == set(LAYER_LAUNCHES)


@pytest.mark.parametrize("name", LAYER_LAUNCHES)
def test_layer_launches_stay_within_the_budget(bench, name):
    budget = bench.budget(need(bench.fixture(name)), name)
    assert 0 < budget.layer_launches <= LAYER_LAUNCHES[name], budget.kernels


def test_a_step_reads_every_layer_weight_once(bench):
    """The byte count's weights: a dense model's step reads each layer matrix and norm once, and the
    KV bytes are the cached rows up to the position plus the new one."""
    path = need(bench.fixture("tiny-llama-q8_0"))
    budget = bench.budget(path, "tiny-llama-q8_0", depth=5)
    f = GGUFFile(path)
    assert budget.layer_weights == sum(t.nbytes for name, t in f.tensors.items() if name.startswith("blk."))
    cfg = Model(f, NumpyBackend()).cfg
    f16_rows = 2 * (cfg.head_dim_k + cfg.head_dim_v)
    assert budget.layer_cache == cfg.n_layer * cfg.n_head_kv * (5 + 1 + 1) * f16_rows


def test_a_q4_k_m_llama_step_with_8_bit_activations(bench, tmp_path, monkeypatch):
    """bench/synthetic.py's llama-1b in small (Q4_K_M: a Q6_K v in its last layer of 3), with the
    8-bit products the real shape takes: the attention writes the o-projection's 8-bit input, the
    gate and up product the down product's (matvec_q8_glu: no GLU launched), and the residual adds
    are the products' epilogues (no quantize_q8, no add launched), and where v's type differs q
    and k joined and v are still one launch (matvec_q8_pair). 8 launches a layer (before
    matvec_q8_glu and matvec_q8_pair, 9, and 10 in the layer whose v differs)."""
    from llogos_cli.backends.cuda import cuda_matmul
    monkeypatch.setattr(cuda_matmul, "INT8_MIN_BYTES", 0)
    synthetic = bench._synthetic()
    spec = synthetic.Spec("tiny", 300, 256, 3, 4, 2, 512, 10000.0, tied=False, mix="q4_k_m")
    budget = bench.budget(synthetic.write_model(spec, tmp_path / "tiny.gguf"), "tiny")
    assert not {"quantize_q8", "add_f32", "swiglu_q8", "swiglu_f32"} & set(budget.kernels), budget.kernels
    assert budget.kernels["matvec_q8_glu_q4_K"] == 3 and budget.kernels["matvec_q8_pair_q4_K_q6_K"] == 1, budget.kernels
    assert 0 < budget.layer_launches <= 8 + 8 + 8, budget.kernels


def test_a_small_model_s_layer_norms_and_gates_inside_its_products(bench, tmp_path):
    """bench/synthetic.py's smollm2-135m shape (one layer): its products are launch-bound and take
    float32 activations, so the layer's two input norms run in the products after them and the GLU
    in the gate and up product: 6 launches a layer, no norm but the output norm, no GLU launched."""
    budget, _ = bench.shape_budget("smollm2-135m", tmp_path)
    norms = sum(n for name, n in budget.kernels.items() if name.startswith("rmsnorm"))
    assert norms == 1 and not any(name.startswith(("swiglu", "geglu")) for name in budget.kernels), budget.kernels
    assert 0 < budget.layer_launches <= 6, budget.kernels


def test_a_short_prompt_s_gate_and_up_apply_the_glu(bench, tmp_path):
    """A 5-token prompt on the smollm2-135m shape run eagerly (one layer; as the first request of a
    size, a longer prompt, or a recurrent model's, before the engine's rows through the decode graph
    take it): gate and up in one product with the GLU
    (matvec_glu_batch), 10 launches in the layer, 3 outside (lookup, output norm, LM head)."""
    import dataclasses
    import numpy as np
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    synthetic = bench._synthetic()
    spec = dataclasses.replace(synthetic.SPECS["smollm2-135m"], n_layer=1, n_vocab=bench.BUDGET_VOCAB)
    kernels = bench.CountingKernels()
    model = Model(GGUFFile(synthetic.write_model(spec, tmp_path / "smollm2.gguf")), CudaBackend(kernels))
    model.forward_seq(model.new_context(16), np.arange(1, 6, dtype=np.int32))
    names = [name for name, _ in kernels.calls]
    assert not any(name.startswith(("swiglu", "geglu")) for name in names), names
    assert len(names) <= 10 + 3, names
