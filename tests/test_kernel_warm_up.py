"""The CPU kernels are compiled (or loaded from numba's cache) while the model loads, never inside a
prompt's time, and a first run on a machine says that it is compiling."""

import json
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from llogos_cli.backends.cpu import (cpu_attention, cpu_compile, cpu_glu, cpu_norm, cpu_quant_dequant, cpu_quant_dot,
                                    cpu_quant_int8, cpu_rope, cpu_rows)
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.model.batch import Batch
from llogos_cli.model.loader import load
from tests.test_cli import env, llogos  # noqa: F401  (env is a fixture)

COMPILING = "compiling CPU kernels"


def _compiled() -> dict[str, int]:
    """How many specialisations each kernel of the CPU backend holds."""
    kernels = {}
    for module in (cpu_quant_dot, cpu_quant_dequant, cpu_quant_int8, cpu_rows, cpu_attention, cpu_glu, cpu_norm, cpu_rope):
        for name, f in vars(module).items():
            if isinstance(f, numba.core.registry.CPUDispatcher):
                kernels[f"{module.__name__}.{name}"] = len(f.signatures)
    return kernels


@pytest.mark.parametrize("cpu_weights, n_slots", [("quantized", 1), ("quantized", 3), ("f32", 3)])
def test_no_prompt_or_step_compiles_a_kernel_after_loading(cpu_weights, n_slots):
    loaded = load("smollm2-135m", "cpu", cpu_weights, n_ctx=128, n_slots=n_slots)
    ready = _compiled()
    model = loaded.model
    cache = model.new_cache(n_slots, 128)
    rng = np.random.default_rng(0)
    for n in (1, 3, 5, 40, 70):   # one token, the few-token products, tiles, BLAS-sized prompts
        tokens = rng.integers(0, model.cfg.n_vocab, n)
        model.forward(cache, Batch.run(tokens, 0, 0, [n - 1]))
    rows = np.arange(n_slots, dtype=np.int32)
    model.forward_rows(cache, rows + 7, rows, np.full(n_slots, 70, np.int32))
    assert _compiled() == ready


@pytest.mark.parametrize("cache_types", [("f16", "f16"), ("q4_0", "iq4_nl"), ("q8_0", "f16")])
def test_no_step_over_a_kv_cache_of_another_type_compiles_after_loading(cache_types):
    """The attention loop compiles once for each pair of the caches' element types: loading with
    -ctk/-ctv compiles the run's pair too (in the warm-up's children, so that a first run computes
    what later ones do)."""
    loaded = load("smollm2-135m", "cpu", "quantized", n_ctx=128, cache_types=cache_types)
    ready = _compiled()
    model = loaded.model
    cache = model.new_cache(1, 128, *cache_types)
    for n in (40, 1):   # a prompt's tiles, then a decode row
        model.forward(cache, Batch.run(np.arange(3, 3 + n), 0, 40 if n == 1 else 0, [n - 1]))
    assert _compiled() == ready


def test_a_first_run_says_it_compiles_and_computes_what_later_runs_do(env, tmp_path):
    """The first run on a machine (numba's cache empty) says it compiles, step by step, and times
    the compile apart from loading; the next says nothing of compiling, however long loading takes.
    Both give the same log-probabilities bit for bit, a prompt's (tile kernels) and decode steps'
    (numba's fresh code and its cached code for one kernel can round a vectorized sum differently,
    so the first run's kernels are compiled in children and loaded from the cache)."""
    # a cache of its own: neither this process's kernels nor those of other tests' runs
    env = {k: v for k, v in env.items() if k != "NUMBA_CACHE_DIR"} | {"LLOGOS_CACHE": str(tmp_path)}
    prompt = " ".join(f"item {i}," for i in range(20))   # ~40 tokens: a prompt's tiles
    args = ("generate", "-m", "smollm2-135m", "-p", prompt, "-n", "3", "--temp", "0", "--json", "--logprobs", "8",
            "--cpu-weights", "quantized", "--stats")
    first = llogos(env, *args)
    assert first.returncode == 0, first.stderr
    steps = [name for name, _ in NumpyBackend("quantized").warm_up_steps({GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0})]
    said = first.stderr.splitlines()
    assert said[0] == COMPILING + " (once on this machine; later runs load them from the cache)"
    assert sorted(said[1:1 + len(steps)]) == sorted(f"{COMPILING}: {name} (step {i + 1} of {len(steps)})"
                                                      for i, name in enumerate(steps))
    compile_ms = float(next(line for line in said if "compile time =" in line).split()[3])
    load_ms = float(next(line for line in said if "load time =" in line).split()[3])
    assert compile_ms > 0 and load_ms > 0
    second = llogos(env, *args)
    assert second.returncode == 0 and COMPILING not in second.stderr and "compile time" not in second.stderr
    steps = [json.loads(line) for line in first.stdout.splitlines()]
    assert steps[-1]["done"] and all(len(s["logprobs"]) == 8 for s in steps[:-1])
    assert first.stdout.splitlines()[:-1] == second.stdout.splitlines()[:-1]   # the summary's timings aside
    assert list((Path(env["LLOGOS_CACHE"]) / "numba").glob("*/compiled-*"))


def test_compiling_is_said_when_numba_compiles_and_never_when_it_loads_from_the_cache():
    """Whether a warm-up step compiles is numba's word, not a timer's: kernels already loaded (or
    in the cache) are silent whatever the time, a kernel numba has not compiled is heard once."""
    heard = []
    loaded = NumpyBackend("quantized").warm_up_steps({GGMLQuantizationType.Q8_0})
    cpu_compile.run_steps(loaded, heard.append)   # compiled or loaded here first
    heard.clear()
    assert cpu_compile.run_steps(loaded, heard.append) == 0.0 and heard == []

    @numba.njit
    def fresh(n):
        return n + 1
    spent = cpu_compile.run_steps([("fresh", lambda: fresh(1)), ("again", lambda: fresh(2))], heard.append)
    assert heard == [cpu_compile.CompileProgress(2, 0, ("fresh",), "fresh", 1)] and spent > 0


@pytest.mark.parametrize("fixture", ["tiny-qwen3moe-q8_0", "tiny-gpt-oss-mxfp4"])
def test_no_step_of_a_mixture_of_experts_compiles_a_kernel_after_loading(fixture):
    """A one-token step's experts go through their own kernel (cpu_quant_int8.matvec8_experts):
    loading compiles it too, for the family of the experts' type."""
    loaded = load(str(Path(__file__).parent / "fixtures" / f"{fixture}.gguf"), "cpu", "quantized", n_ctx=64)
    ready = _compiled()
    model = loaded.model
    cache = model.new_cache(1, 64)
    model.forward(cache, Batch.run(np.arange(3, 9), 0, 0, [5]))
    model.forward_rows(cache, np.array([7], np.int32), np.array([0], np.int32), np.array([6], np.int32))   # one token
    assert _compiled() == ready


def _llvm_resident_kib(fields_counted=("Rss:",)) -> int:
    """This process's resident pages of LLVM's library (/proc/self/smaps), those of fields_counted."""
    total, ours = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:   # a mapping's first line
                ours = len(fields) >= 6 and "libllvmlite" in fields[5]
            elif ours and fields[0] in fields_counted:
                total += int(fields[1])
    return total


def test_llvm_s_pages_are_handed_back_after_warm_up_and_come_back_when_needed():
    """Once the kernels are loaded, LLVM's ~70 MB are handed back (memory the weights can use); a
    kernel compiled later reads them back from the library's file and runs. Counted: the pages
    this process alone holds (another process mapping the library, as a second test worker,
    keeps the pages they share, which handing back could not free)."""
    NumpyBackend("quantized").warm_up(product_types={GGMLQuantizationType.Q4_K})
    assert _llvm_resident_kib(("Private_Clean:", "Private_Dirty:")) < 8 << 10

    @numba.njit
    def triangle(n):
        return sum(range(n + 1))
    assert triangle(100) == 5050 and _llvm_resident_kib() > 8 << 10


_PEAK_OF_LOADING = """
from llogos_cli.model.loader import load
loaded = load("smollm2-135m", "cpu", "quantized", n_ctx=64)   # held while measured
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(int(status["VmHWM"].split()[0]), int(status["VmRSS"].split()[0]))
"""


def test_loading_peaks_at_what_the_loaded_model_holds(env):
    """The kernels are loaded before the weights, so LLVM's pages (~50-70 MB while it loads them)
    are handed back before the weights take memory: the load's peak RSS is the loaded model's
    resident size, not that plus the compiler's. (The second run: a first one also parses the
    file's header into llogos' cache.)"""
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", _PEAK_OF_LOADING], env=env, capture_output=True,
                             text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    peak_kib, resident_kib = map(int, run.stdout.split())
    assert peak_kib - resident_kib < 20 << 10, (peak_kib, resident_kib)
