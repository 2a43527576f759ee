"""Run the CUDA kernels on the CPU: cuda/*.cu compiled as host C++ behind a CuPy-shaped provider.

`EmuKernels` has the members the launchers use of `llogos_cli.backends.cuda.cuda_kernels.CudaKernels`
(xp, function, int8_mma, multiprocessors, gemm_f16, capture, to_host, synchronize) with NumPy arrays in place of device
memory, so the launchers (grid sizes, kernel choice, argument packing) run unchanged against the
emulated kernels.

The library is built once per source hash (every .cu/.cuh and the emulator's own files) under the
llogos cache directory. Each kernel's parameter types are compiled in, and every launch checks
the argument kinds against them: a Python int or a float64 where the kernel takes int/float is the
bug CuPy would pass silently as a 64-bit value.
"""

import ctypes
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from llogos_cli.backends.cuda.cuda_kernels import check
from llogos_cli.paths import PROJECT_ROOT, cache_dir

CUDA_DIR = PROJECT_ROOT / "cuda"
EMU_DIR = Path(__file__).resolve().parent
CXX = os.environ.get("CXX", "g++")
# EMU_CXXFLAGS adds flags, e.g. "-fsanitize=address" to catch out-of-bounds accesses (run Python
# with LD_PRELOAD=$(g++ -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 then).
CXXFLAGS = ["-std=c++17", "-O2", "-fPIC", "-fno-strict-aliasing", "-Wall", "-Wno-unknown-pragmas",
            "-Wno-unused-function", "-Werror", f"-I{CUDA_DIR}", f"-I{EMU_DIR}", *os.environ.get("EMU_CXXFLAGS", "").split()]
# The preprocessed form of `extern "C" __global__ void name(` (cuda_emu.h defines __global__).
_ENTRY = re.compile(r'extern\s+"C"\s+__attribute__\(\(used\)\)\s+void\s+(\w+)\s*\(')
_ARG_CODES = {np.int32: "i", np.uint32: "u", np.float32: "f"}
_CTYPES = {"i": ctypes.c_int32, "u": ctypes.c_uint32, "f": ctypes.c_float}


class EmulationError(RuntimeError):
    """A launch the GPU would reject or hang on, or a kernel fault caught on the CPU."""


def _sources() -> list[Path]:
    return sorted(CUDA_DIR.glob("*.cu"))


def _source_hash() -> str:
    h = hashlib.sha256(" ".join([CXX, *CXXFLAGS]).encode())
    for path in sorted([*CUDA_DIR.glob("*.cu"), *CUDA_DIR.glob("*.cuh"), *EMU_DIR.glob("*.h"),
                        *EMU_DIR.glob("*.cpp"), Path(__file__)]):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:24]


def _run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise EmulationError(f"{' '.join(cmd)}\n{done.stderr}")
    return done.stdout


def _compile_unit(source: Path, work: Path) -> tuple[str, list[str], Path]:
    """Compile one .cu plus its thunks; return (module name, kernel names, object file)."""
    include = ["-include", str(EMU_DIR / "cuda_emu.h")]
    text = _run([CXX, *CXXFLAGS, *include, "-x", "c++", "-E", "-P", str(source)])
    names = _ENTRY.findall(text)
    unit = work / f"{source.stem}.cpp"
    unit.write_text(f'#include "{source}"\n#include "emu_thunk.h"\n'
                    + "".join(f"EMU_THUNK({name})\n" for name in names))
    obj = work / f"{source.stem}.o"
    _run([CXX, *CXXFLAGS, *include, "-c", str(unit), "-o", str(obj)])
    return source.stem, names, obj


def build() -> Path:
    """The emulator library for the current sources, compiled if not cached; returns its folder."""
    target = cache_dir("emu") / _source_hash()
    if (target / "kernels.json").is_file():
        return target
    work = Path(tempfile.mkdtemp(prefix="build-", dir=target.parent))
    try:
        runtime = work / "emu_runtime.o"
        jobs = [lambda s=s: _compile_unit(s, work) for s in _sources()]
        jobs.append(lambda: _run([CXX, *CXXFLAGS, "-c", str(EMU_DIR / "emu_runtime.cpp"), "-o", str(runtime)]))
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            results = list(pool.map(lambda job: job(), jobs))
        units = results[:-1]
        _run([CXX, "-shared", *CXXFLAGS, "-o", str(work / "libemu.so"), str(runtime), *(str(o) for _, _, o in units)])
        (work / "kernels.json").write_text(json.dumps({module: names for module, names, _ in units}))
        try:
            os.replace(work, target)
        except OSError:  # another process finished the same build first
            pass
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


class EmuKernel:
    """One kernel, called like cupy.RawKernel: kernel(grid, block, args, shared_mem=0)."""

    def __init__(self, lib: ctypes.CDLL, name: str):
        self.name = name
        self._thunk = ctypes.cast(getattr(lib, f"emu_thunk_{name}"), ctypes.c_void_p)
        sig = getattr(lib, f"emu_sig_{name}")
        sig.restype = ctypes.c_char_p
        self.signature = sig().decode()
        self._launch, self._error = lib.emu_launch, lib.emu_error
        self._launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._error.restype = ctypes.c_char_p

    def __call__(self, grid, block, args, shared_mem=0):
        if shared_mem:
            raise EmulationError(f"{self.name}: dynamic shared memory is not emulated")
        if len(args) != len(self.signature):
            raise EmulationError(f"{self.name} takes {len(self.signature)} arguments, got {len(args)}")
        cells = []
        for i, (arg, code) in enumerate(zip(args, self.signature)):
            if code == "p":
                if not isinstance(arg, np.ndarray):
                    raise EmulationError(f"{self.name} argument {i}: expected an array, got {type(arg).__name__}")
                cells.append(ctypes.c_void_p(arg.ctypes.data))
            else:
                got = _ARG_CODES.get(type(arg))
                if got != code:
                    raise EmulationError(f"{self.name} argument {i}: kernel takes '{code}', "
                                         f"launcher passed {type(arg).__name__}")
                cells.append(_CTYPES[code](arg))
        argv = (ctypes.c_void_p * len(cells))(*(ctypes.addressof(c) for c in cells))
        dims = [(ctypes.c_uint * 3)(*(tuple(d) + (1, 1))[:3]) for d in (grid, block)]
        if self._launch(self._thunk, argv, dims[0], dims[1]):
            raise EmulationError(f"{self.name}: {self._error().decode()}")


class EmuKernels:
    """The kernel provider for the launchers, backed by the CPU emulator and NumPy."""

    def __init__(self):
        folder = build()
        self._lib = ctypes.CDLL(str(folder / "libemu.so"))
        self.modules: dict[str, list[str]] = json.loads((folder / "kernels.json").read_text())
        self._kernels: dict[str, EmuKernel] = {}
        self.int8_mma = True  # cuda_emu.h emulates the tensor cores' int8 products
        self.multiprocessors = 4  # few: the tiny test models' products take both tile sizes
        self.launched: list[str] = []  # names in launch order, for tests of kernel choice
        self._recording: list | None = None  # work a capture has recorded, as functions to replay
        self.xp = _NumpyInGraphs(self)

    def _run_or_record(self, work) -> None:
        if self._recording is not None:
            self._recording.append(work)
        else:
            work()

    def function(self, module: str, name: str):
        if name not in self.modules.get(module, ()):
            raise EmulationError(f"no kernel {name} in cuda/{module}.cu")
        if name not in self._kernels:
            self._kernels[name] = EmuKernel(self._lib, name)
        kernel = self._kernels[name]

        def launch(grid, block, args, shared_mem=0):
            self.launched.append(name)
            args = tuple(args)
            self._run_or_record(lambda: kernel(grid, block, args, shared_mem))
        return launch

    def capture(self, fn):
        """As a CUDA graph: the kernels fn() launches are recorded, not run, with their arguments as
        they were (the arrays stay referenced, as a graph's memory stays allocated); launch() replays
        them. So are GEMMs and the copies xp.ascontiguousarray makes. Other NumPy work fn() does is
        not recorded: on a GPU that work is kernels too, so only functions that compute through
        these alone replay the same here."""
        self._recording = []
        try:
            result = fn()
            launches = self._recording
        finally:
            self._recording = None
        return _Replay(launches), result

    def gemm_f16(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        check(a, np.float16, "a")
        check(b, np.float16, "b")
        assert out.dtype == np.float32 and out.shape == (a.shape[0], b.shape[0]) and out.strides[1] == 4

        def gemm():  # cuBLAS multiplies the f16 inputs exactly and accumulates in f32; float64 is closer still
            out[...] = (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float32)
        self._run_or_record(gemm)

    def to_host(self, x: np.ndarray) -> np.ndarray:
        if isinstance(x, _HostArray):  # CuPy's .get() is a device array's: a host array has none
            raise EmulationError("to_host of an array already on the host")
        return np.array(x).view(_HostArray)

    def synchronize(self) -> None:
        pass


class _HostArray(np.ndarray):
    """What to_host returns, marked as on the host, as a GPU's NumPy results are."""


class _NumpyInGraphs:
    """NumPy as the launchers' `xp`, but for copies of strided views, which a capture records: CuPy
    makes them with kernels, which a CUDA graph captures like ours."""

    def __init__(self, kernels: EmuKernels):
        self._k = kernels

    def __getattr__(self, name: str):
        return getattr(np, name)

    def ascontiguousarray(self, x: np.ndarray) -> np.ndarray:
        out = np.ascontiguousarray(x)
        if out is not x and self._k._recording is not None:
            self._k._recording.append(lambda: np.copyto(out, x))
        return out


class _Replay:
    def __init__(self, work: list):
        self._work = work

    def launch(self) -> None:
        for work in self._work:
            work()
