"""The CPU kernels are compiled (or loaded from numba's cache) while the model loads, never inside a
prompt's time, and a first run on a machine says that it is compiling."""

import json

import numba
import numpy as np
import pytest

from llogos_cli.backends import cpu_quant_dequant, cpu_quant_dot, cpu_quant_int8, cpu_rows
from llogos_cli.model.forward import Batch
from llogos_cli.model.loader import load
from tests.test_cli import env, llogos  # noqa: F401  (env is a fixture)

COMPILING = "compiling CPU kernels"


def _compiled() -> dict[str, int]:
    """How many specialisations each kernel of the CPU backend holds."""
    kernels = {}
    for module in (cpu_quant_dot, cpu_quant_dequant, cpu_quant_int8, cpu_rows):
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


def test_a_first_run_says_it_compiles_and_a_second_does_not(env):
    env = {k: v for k, v in env.items() if k != "NUMBA_CACHE_DIR"}   # this process's kernels are not the new cache's
    args = ("generate", "-m", "smollm2-135m", "-p", "Hi", "-n", "2", "--temp", "0", "--json",
            "--cpu-weights", "quantized")
    first = llogos(env, *args)
    assert first.returncode == 0, first.stderr
    assert COMPILING in first.stderr
    second = llogos(env, *args)
    assert second.returncode == 0 and COMPILING not in second.stderr
    assert json.loads(first.stdout.splitlines()[-1])["done"]
