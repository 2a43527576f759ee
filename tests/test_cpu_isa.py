"""The integer products' instruction set (cpu_simd_int8.host_isas, cpu_quant.choose_isa): chosen from
the CPU's flags, best first, a set the CPU lacks refused before anything is compiled for it; and the
AVX-VNNI kernels, which this host may not run, compiled for a CPU that has them (Alder Lake) and
read in their assembly: 256-bit `vpdpbusd` in its VEX encoding, nothing of AVX-512."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from llogos_cli.backends.cpu import cpu_quant
from llogos_cli.backends.cpu.cpu_simd_int8 import host_isa, host_isas
from llogos_cli.errors import LlogosError

ZEN3 = {"avx": True, "avx2": True, "fma": True, "avxvnni": False, "avx512vnni": False}
ALDER_LAKE = dict(ZEN3, avxvnni=True)
SAPPHIRE_RAPIDS = dict(ALDER_LAKE, avx512f=True, avx512vl=True, avx512vnni=True)
CASCADE_LAKE = dict(ZEN3, avx512f=True, avx512vl=True, avx512vnni=True)


@pytest.mark.parametrize("flags, best, runs", [
    (ZEN3, "avx2", ["avx2"]),
    (ALDER_LAKE, "avxvnni", ["avxvnni", "avx2"]),
    (CASCADE_LAKE, "vnni", ["vnni", "avx2"]),
    (SAPPHIRE_RAPIDS, "vnni", ["vnni", "avxvnni", "avx2"]),
    ({"avx": True, "avxvnni": True}, None, []),            # no AVX2: none of them
    ({"avx2": True, "avx512vnni": True}, "avx2", ["avx2"]),  # 512-bit VNNI needs AVX512VL's encodings
], ids=["zen3", "alder-lake", "cascade-lake", "sapphire-rapids", "avx-only", "no-vl"])
def test_the_instruction_set_follows_the_cpu_flags(flags, best, runs):
    assert host_isas(flags) == runs
    assert host_isa(flags) == best


@pytest.mark.parametrize("flags, chosen", [(ALDER_LAKE, "avxvnni"), (ZEN3, "avx2"), (SAPPHIRE_RAPIDS, "vnni")])
def test_the_default_is_the_best_set_and_a_missing_one_is_refused(monkeypatch, flags, chosen):
    monkeypatch.setattr(cpu_quant, "host_isa", lambda: host_isa(flags))
    monkeypatch.setattr(cpu_quant, "host_isas", lambda: host_isas(flags))
    assert cpu_quant.choose_isa(None) == chosen
    for isa in ("vnni", "avxvnni", "avx2"):
        if isa in host_isas(flags):
            assert cpu_quant.choose_isa(isa) == isa
        else:
            with pytest.raises(LlogosError, match=f"LLOGOS_CPU_ISA={isa}: this CPU does not have it"):
                cpu_quant.choose_isa(isa)


def test_this_host_never_runs_a_set_it_lacks():
    for isa in {"vnni", "avxvnni", "avx2"} - set(host_isas()):
        with pytest.raises(LlogosError, match="does not have it"):
            cpu_quant.QuantMatmul(isa)


_COMPILE = textwrap.dedent("""
    import llogos_cli  # first, as every entry point does: it may choose the CPU numba compiles for
    import numba, numpy as np
    import sys
    from llogos_cli.backends.cpu.cpu_simd_int8 import ISA_ARG, K_TILED, k_tile_dot8, tile_dot8

    def array(dtype, dims, readonly=False):
        return numba.types.Array(numba.from_dtype(np.dtype(dtype)), dims, "C", readonly=readonly)

    ISA, NAMES = sys.argv[1], sys.argv[2].split(",")
    for name in NAMES:
        dot = (k_tile_dot8 if name in K_TILED else tile_dot8)(name, 4 if name == "q8_0" else 1)
        def product(rows, c, xq, dx, xs, t, isa, sums):
            dot(rows, c, xq, dx, xs, t, isa, sums)
        kernel = numba.njit(product)
        sig = (array("u1", 2, True), numba.int64, array("i1", 2), array("f4", 2), array("i4", 2), numba.int64,
               numba.typeof(ISA_ARG[ISA]), array("f4", 1))
        kernel.compile(sig)   # compiled, never called
        print("KERNEL", name)
        print(kernel.inspect_asm(sig))
""")


def test_the_avx_vnni_kernels_compile_to_256_bit_vpdpbusd(tmp_path):
    env = dict(os.environ, NUMBA_CPU_NAME="alderlake", NUMBA_CPU_FEATURES="+avx2,+avxvnni,+fma,+f16c,+bmi2",
               NUMBA_CACHE_DIR=str(tmp_path))
    kernels = _compiled(env, "avxvnni", ["q4_1", "q8_0", "q4_k", "iq4_xs"])
    for name, asm in kernels.items():
        products = [line.split() for line in asm.splitlines() if "vpdpbusd" in line]
        assert products, name
        assert all(line[0] == "{vex}" and line[-1].startswith("%ymm") for line in products), name   # into a ymm register
        assert "zmm" not in asm and "vpmaddubsw" not in asm, name


def _compiled(env: dict, isa: str, names: list[str]) -> dict:
    """Each named kernel of `isa` compiled (never run) in a process of env: {name: its assembly}."""
    done = subprocess.run([sys.executable, "-c", _COMPILE, isa, ",".join(names)], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    kernels = dict(part.split("\n", 1) for part in done.stdout.split("KERNEL ")[1:])
    assert set(kernels) == set(names)
    return kernels


def test_asking_for_avx2_compiles_everything_for_an_avx2_cpu(tmp_path):
    """LLOGOS_CPU_ISA=avx2 on a CPU with AVX-512 makes numba compile for a CPU without it, so the
    AVX2 kernels' own vector code (Q5_0's fifth-bit masks, the two 256-bit halves) is an AVX2 CPU's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    env.update(LLOGOS_CPU_ISA="avx2", NUMBA_CACHE_DIR=str(tmp_path))
    kernels = _compiled(env, "avx2", ["q4_1", "q5_0"])
    for name, asm in kernels.items():
        assert "vpmaddubsw" in asm, name
        assert "zmm" not in asm and not re.search(r"%k[0-7]\b", asm), name   # nor AVX-512's mask registers
    done = subprocess.run([sys.executable, "-c", "import llogos_cli, numba.core.config as c; print(c.CPU_NAME)"],
                          env=dict(env, LLOGOS_CPU_ISA="vnni"), capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["None"]   # the host's CPU, whatever it has
