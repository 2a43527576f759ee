"""Every kernel source compiles with nvcc for Ampere (sm_80) and Hopper (sm_90), warnings as errors.

At run time the kernels are compiled by NVRTC, which has no system headers: the sources must use
only what NVRTC provides, which nvcc (it includes cuda_runtime.h and math.h) would not catch. So
they are also compiled by NVRTC itself, as CudaKernels compiles them, where libnvrtc is found
(CuPy's CUDA libraries, the nvidia-cuda-nvrtc package, or the toolkit).
"""

import ctypes
import ctypes.util
import glob
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from llogos_cli.backends.cuda.cuda_kernels import CUDA_DIR, nvrtc_options, nvrtc_source

SOURCES = sorted(p.name for p in CUDA_DIR.glob("*.cu"))
ARCHS = ("sm_80", "sm_90")
NVCC = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if Path(p).is_file()), None)
# Names NVRTC leaves undefined that nvcc's implicit includes would supply.
_HOST_ONLY = re.compile(r"#\s*include\s*<|\b(INFINITY|NAN|HUGE_VALF?|FLT_MAX|FLT_MIN|M_PI|printf|assert)\b")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict:
    """Compile every source for every arch at once, in parallel: {(source, arch): (status, output)}."""
    if NVCC is None:
        pytest.skip("nvcc not found: install the CUDA toolkit to check that the kernels compile")
    out = tmp_path_factory.mktemp("cubin")

    def compile_one(job):
        source, arch = job
        done = subprocess.run([NVCC, "-std=c++17", f"-arch={arch}", "-I", str(CUDA_DIR), "--cubin",
                               "-Werror", "all-warnings", "-o", str(out / f"{source}.{arch}.cubin"),
                               str(CUDA_DIR / source)], capture_output=True, text=True)
        return job, (done.returncode, done.stdout + done.stderr)

    with ThreadPoolExecutor(max_workers=2 * (os.cpu_count() or 1)) as pool:
        return dict(pool.map(compile_one, [(s, a) for s in SOURCES for a in ARCHS]))


def test_sources_exist():
    assert {"matvec.cu", "dequantize.cu", "attention.cu", "softmax.cu"} <= set(SOURCES)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", SOURCES)
def test_compiles(compiled, source, arch):
    status, output = compiled[(source, arch)]
    assert status == 0, output


@pytest.mark.parametrize("path", sorted(CUDA_DIR.glob("*.cu*")), ids=lambda p: p.name)
def test_uses_only_what_nvrtc_provides(path):
    code = re.sub(r"//[^\n]*", "", path.read_text())  # comments may name anything
    found = _HOST_ONLY.search(code)
    assert found is None, f"{path.name} uses {found.group(0)!r}, which NVRTC does not define"


def _find_nvrtc() -> ctypes.CDLL | None:
    candidates = [os.environ.get("LLOGOS_NVRTC"), ctypes.util.find_library("nvrtc")]
    for root in [*sys.path, "/usr/local/cuda"]:
        candidates += sorted(glob.glob(f"{root}/nvidia/cu*/lib/libnvrtc.so*") + glob.glob(f"{root}/lib64/libnvrtc.so*"))
    for path in filter(None, candidates):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def nvrtc_compile(lib: ctypes.CDLL, module: str, arch: str) -> tuple[int, str]:
    """Compile cuda/<module>.cu to a cubin as CudaKernels does; -> (nvrtcResult, log)."""
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), nvrtc_source(module).encode(), f"{module}.cu".encode(),
                                  0, None, None) == 0
    options = [o.encode() for o in (*nvrtc_options(), "-ftz=true", f"-arch={arch}")]  # CuPy adds -ftz=true
    status = lib.nvrtcCompileProgram(prog, len(options), (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return status, log.value.decode(errors="replace")


@pytest.mark.parametrize("source", SOURCES)
def test_compiles_with_nvrtc(source):
    lib = _find_nvrtc()
    if lib is None:
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc, or set LLOGOS_NVRTC)")
    status, log = nvrtc_compile(lib, source.removesuffix(".cu"), "sm_90")
    assert status == 0, log
