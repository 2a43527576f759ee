"""bench/bench_cuda.py's record and tables, from made-up figures: a GPU session must not lose its
measurements to a misspelt key after minutes of device time."""

import dataclasses
import importlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.forward import Model

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def bench_cuda():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("bench_cuda")
    finally:
        sys.path.remove(str(BENCH))


def measured(name: str, theirs: bool) -> dict:
    batched = [{"B": n, "prefill_tok_s": 1000.0 * n, "decode_tok_s": 100.0 * n} for n in (1, 4)]
    return {
        "model": name, "weights_GB": 4.6, "load_s": 3.0, "prefill_tok_s": 9000.0, "ttft_ms": 8.5, "ttft_ms_eager": 12.5,
        "decode_tok_s": 210.0, "decode_tok_s_eager": 150.0, "decode_tok_s_graph": 210.0, "decode_GB_s": 966.0,
        "bandwidth_fraction": 0.322,
        "decode_step_ms": {"kernels_gpu": 4.1, "matvec_gpu": 3.0, "graph_replay_gpu": 4.3, "graph_wall": 4.76, "eager_wall": 6.67},
        "decode_kernels": [["matvec_q4_K", 160, 3.0], ["(rest of the wall time)", 0, 0.5]],
        "prefill_kernels": [["gemm_f16 (cuBLAS)", 224, 40.0], ["(rest of the wall time)", 0, 5.0]],
        "prefill_step_ms": {"wall": 45.0, "experts_gpu": 12.5, "gemm_gpu": 40.0},
        "batched": batched, "device": "NVIDIA H100 80GB HBM3",
        "llama_cpp": None if not theirs else {
            "single": {"prefill_tok_s": 11000.0, "decode_tok_s": 180.0, "ttft_ms": 9.0, "build": "0c1e570"},
            "batched": [{"B": 1, "prefill_tok_s": 900.0, "decode_tok_s": 90.0}]},
    }


PRODUCTS = [{"type": t, "rows": 14336, "cols": 4096, "tokens": n, "rows_per_warp": 1, "activations": "int8", "chosen": True, "us": 30.0 * n,
             "GB_s": 1100.0 / n, "bandwidth_fraction": 0.37 / n} for t in ("Q4_K", "Q6_K") for n in (1, 4)]


def test_record_has_what_the_gpu_issue_asks_for_per_model(bench_cuda):
    results = [measured("llama-8b", True), measured("qwen35-0.8b", False)]
    record = json.loads(json.dumps(bench_cuda.record(results, PRODUCTS, 3000.0, "abc123")))  # JSON all through
    assert (record["gpu"], record["commit"], record["ttft_prompt_tokens"]) == ("NVIDIA H100 80GB HBM3", "abc123", 5)
    assert len(record["date"]) == 10
    ours, theirs = record["models"]["llama-8b"]["llogos"], record["models"]["llama-8b"]["llamacpp"]
    for key in ("decode_tok_s", "prefill_tok_s", "ttft_ms", "bandwidth_fraction"):
        assert isinstance(ours[key], float) and isinstance(theirs[key], float), key
    assert ours["ttft_ms_eager"] == 12.5
    assert theirs["bandwidth_fraction"] == pytest.approx(4.6 * 180 / 3000)
    assert record["models"]["qwen35-0.8b"]["llamacpp"] is None   # llama.cpp failed on it: ours still count
    rows = record["models"]["llama-8b"]["batched"]
    assert rows[0]["llamacpp"]["decode_tok_s"] == 90.0 and rows[1]["llamacpp"] is None
    assert record["products"] == PRODUCTS


def test_report_prints_both_sides(bench_cuda, capsys):
    bench_cuda.report([measured("llama-8b", True), measured("qwen35-0.8b", False)], PRODUCTS, 3000.0)
    out = capsys.readouterr().out
    assert "| llama-8b | 4.60 | 9000 (11000) | 8.5 (9.0) | 150 / 210 (180) | 32% (28%) |" in out
    assert "| qwen35-0.8b | 4.60 | 9000 (-) | 8.5 (-) |" in out
    assert "by the eager prompt pass: llama-8b 12.5, qwen35-0.8b 12.5" in out
    assert "| llama-8b | 4.100 | 3.000 (1533 GB/s) | 4.300 | 4.760 | 6.670 |" in out
    assert "| model | wall | expert kernels | GEMMs |\n|---|---|---|---|\n| llama-8b | 45.0 | 12.5 | 40.0 |" in out
    assert ("| type | rows x cols | 1 token, int8, 1 row a warp | 4 tokens |\n|---|---|---|---|\n"
            "| Q4_K | 14336 x 4096 | 30.0 us, 1100 GB/s (37%)* | 120.0 us, 275 GB/s (9%) |") in out
    bench_cuda.report([measured("llama-8b", True)], [], 3000.0)   # a run without --products
    assert "product kernels alone" not in capsys.readouterr().out


class _Event:
    def record(self):
        pass

    def synchronize(self):
        pass


def fake_cupy() -> SimpleNamespace:
    """The few CuPy calls the benchmark makes besides the backend's, on the host: events that time
    nothing (0.5 ms each), NumPy arrays."""
    return SimpleNamespace(
        asarray=np.asarray, empty=np.empty,
        get_default_memory_pool=lambda: SimpleNamespace(free_all_blocks=lambda: None),
        cuda=SimpleNamespace(Event=_Event, get_elapsed_time=lambda start, end: 0.5,
                             get_current_stream=lambda: SimpleNamespace(synchronize=lambda: None),
                             runtime=SimpleNamespace(getDeviceProperties=lambda i: {"name": b"emulated"})))


def test_the_benchmark_runs_through_under_the_emulator(bench_cuda, monkeypatch, tmp_path):
    """Every step of a model's benchmark and of the product table, with the CUDA kernels run by the
    CPU emulator on a small hybrid model: what a GPU session would run, minus the GPU."""
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    from tests.emu.emulator import EmuKernels

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy())
    for name, value in (("PROMPT_TOKENS", 40), ("DECODE_TOKENS", 4), ("BATCH_PROMPT", 6), ("BATCH_DECODE", 2)):
        monkeypatch.setattr(bench_cuda, name, value)
    backend = CudaBackend(EmuKernels())
    hybrid = importlib.import_module("synthetic").Hybrid(2, 4, 64, 64)
    spec = dataclasses.replace(bench_cuda.SPECS["qwen35-0.8b"], n_vocab=300, n_embd=256, n_layer=4, n_head=4,
                               n_ff=512, head_dim=64, rope_dims=16, hybrid=hybrid)
    path = bench_cuda.model_file(spec, tmp_path)
    result = {**bench_cuda.bench_model(spec, path, 3000.0, [1, 3], backend), "llama_cpp": None}
    products = bench_cuda.bench_products(3000.0, (1, 4), shapes=((64, 512), (40, 256)), reps=1, backend=backend,
                                         rotation_bytes=0)
    record = bench_cuda.record([result], products, 3000.0, None)
    ours = record["models"][spec.name]["llogos"]
    assert ours["decode_tok_s"] > 0 and ours["ttft_ms"] > 0 and 0 < ours["bandwidth_fraction"]
    assert [row["B"] for row in record["models"][spec.name]["batched"]] == [1, 3]
    kernels = {name for name, count, _ in record["models"][spec.name]["decode_kernels"] if count}
    # Matrices this small stay on float32 activations (cuda_matmul.INT8_MIN_BYTES).
    assert {"delta_net_f32", "ssm_conv_f32", "matvec_q4_K", "matvec_q6_K", "attention_f16_f16"} <= kernels, kernels
    assert record["models"][spec.name]["llogos"]["decode_step_ms"]["matvec_gpu"] > 0
    # The prompt's products with the int8 types on tensor cores (the emulator has them), not f16 GEMMs.
    prefill = {name.replace("_rows64", "") for name, count, _ in record["models"][spec.name]["prefill_kernels"] if count}
    assert {"matmul_q8_mma_q4_K", "matmul_q8_mma_q6_K"} <= prefill and "dequantize_q4_K" not in prefill, prefill
    prefill = record["models"][spec.name]["llogos"]["prefill_step_ms"]   # no experts in this model: none of their kernels
    assert prefill["experts_gpu"] == 0 and prefill["gemm_gpu"] > 0 and prefill["wall"] > 0
    assert {p["type"] for p in products} == {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16"}
    # One token with 1 and 2 rows a warp on both shapes, 4 tokens on the first: 5 a type; the 5
    # types with integer products the same 4 one-token variants on 8-bit activations. One chosen a shape.
    assert len(products) == 9 * 5 + 5 * 4 and sum(p["chosen"] for p in products if p["tokens"] == 1) == 9 * 2
    assert {p["type"] for p in products if p["activations"] == "int8" and p["chosen"]} == {"Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"}
    bench_cuda.report([result], products, 3000.0)


def test_time_to_first_token_is_the_engine_s_replay_of_prompt_rows(bench_cuda):
    """The TTFT figure times a short prompt as the engine runs it: one replay of the decode step's
    graph (after its capture), its argmax the only kernel launched on its own; a model whose
    prompts stay on the prompt pass (recurrent layers) has no such figure."""
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    from tests.emu.emulator import EmuKernels

    backend = CudaBackend(EmuKernels())
    fixtures = Path(__file__).resolve().parent / "fixtures"
    gpu = Model(GGUFFile(fixtures / "tiny-gemma2-q8_0.gguf"), backend)
    launched = len(backend.kernels.launched)
    assert bench_cuda.rows_first_token_s(gpu, np.arange(1, 6, dtype=np.int32), 32, 2) > 0
    after_capture = backend.kernels.launched[launched:]
    assert after_capture[-2:] == ["argmax_rows_f32"] * 2 and "argmax_rows_f32" not in after_capture[:-2]
    hybrid = Model(GGUFFile(fixtures / "tiny-lfm2-q8_0.gguf"), backend)
    assert bench_cuda.rows_first_token_s(hybrid, np.arange(1, 6, dtype=np.int32), 32, 2) is None


def test_prompt_products_benchmark_runs_both_paths_under_the_emulator(monkeypatch):
    """bench/bench_prefill.py: every int8 type through matmul_q8_mma and through dequantize + GEMM,
    one row each, and its table."""
    from llogos_cli.backends.cuda.cuda_backend import CudaBackend
    from tests.emu.emulator import EmuKernels

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy())
    monkeypatch.syspath_prepend(str(BENCH))
    bench_prefill = importlib.import_module("bench_prefill")
    backend = CudaBackend(EmuKernels())
    rows = bench_prefill.bench_prompt_products((40,), shapes=((64, 512),), reps=1, backend=backend)
    assert sorted((r["type"], r["path"]) for r in rows) == sorted((t, p) for t in ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K")
                                                                for p in ("int8", "f16"))
    assert all(r["us"] == 500.0 and r["TOPS"] == 2 * 40 * 64 * 512 / 0.5 / 1e9 for r in rows)
    launched = {name.replace("_rows64", "") for name in backend.kernels.launched}  # either tile size
    assert {"matmul_q8_mma_q4_K", "dequantize_q4_K", "quantize_q8"} <= launched
    bench_prefill.report(rows)
