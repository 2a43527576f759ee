"""Compile the kernels in cuda/ with NVRTC (through CuPy) and provide them to the launchers.

The launchers (cuda_matmul, cuda_attention, cuda_ops, ...) reach the GPU only through a kernel
provider: `xp` (the array module), `function(module, name)` (a kernel, called as
kernel(grid, block, args)), `int8_mma` (whether it has int8 tensor cores), `multiprocessors`, `gemm_f16`, `capture`, `to_host` and `synchronize`. `CudaKernels` is
the one backed by CuPy; the CPU emulator in tests/emu provides the same members over NumPy, so
the launch logic runs in the tests without a GPU.
"""

import ctypes
import functools
import hashlib

import numpy as np
from gguf import GGMLQuantizationType as QType

from llogos_cli.errors import LlogosError
from llogos_cli.paths import PROJECT_ROOT

CUDA_DIR = PROJECT_ROOT / "cuda"

# Kernel-name suffix of each weight type: matvec_q4_K, dequantize_bf16, get_rows_q8_0, ...
TYPE_SUFFIX = {QType.F32: "f32", QType.F16: "f16", QType.BF16: "bf16", QType.Q8_0: "q8_0", QType.Q4_0: "q4_0", QType.Q4_1: "q4_1",
               QType.Q5_0: "q5_0", QType.Q5_1: "q5_1", QType.Q2_K: "q2_K", QType.Q3_K: "q3_K", QType.Q4_K: "q4_K", QType.Q5_K: "q5_K",
               QType.Q6_K: "q6_K", QType.IQ4_NL: "iq4_nl", QType.IQ4_XS: "iq4_xs", QType.MXFP4: "mxfp4"}

# cuBLAS enums (library_types.h, cublas_api.h).
_CUDA_R_32F, _CUDA_R_16F = 0, 2
_CUBLAS_OP_N, _CUBLAS_OP_T = 0, 1
_CUBLAS_COMPUTE_32F = 68
_CUBLAS_GEMM_DEFAULT = -1


def nvrtc_source(module: str) -> str:
    path = CUDA_DIR / f"{module}.cu"
    return f'#line 1 "{path}"\n{path.read_text()}'  # errors name the real file and line


def nvrtc_options() -> tuple[str, ...]:
    # CuPy's on-disk cache is keyed on the source text and options, not on the headers it
    # includes: their hash joins the options, so editing a header recompiles its users.
    headers = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(CUDA_DIR.glob("*.cuh"))))
    return "-std=c++17", f"-I{CUDA_DIR}", f"-DLLOGOS_HEADERS=0x{headers.hexdigest()[:16]}"


def check(x, dtype, name: str) -> None:
    """Kernels index raw memory: every array they get must have the expected type and be C-contiguous."""
    assert x.dtype == dtype, f"{name}: expected {np.dtype(dtype).name}, got {x.dtype}"
    assert x.flags.c_contiguous, f"{name}: must be C-contiguous"


def cdiv(n: int, d: int) -> int:
    return -(-n // d)


class CudaKernels:
    def __init__(self):
        import cupy
        try:
            from cupy_backends.cuda.libs import cublas
        except ImportError as e:  # CuPy loads the CUDA libraries from the toolkit or from pip packages
            raise LlogosError(f"CuPy cannot load cuBLAS ({e}); install it with pip install 'cupy-cuda13x[ctk]'") from None

        self.xp = cupy
        self._cublas = cublas
        self._modules, self._functions = {}, {}
        self._options = nvrtc_options()
        self._alpha, self._beta = np.ones(1, np.float32), np.zeros(1, np.float32)
        self._capture_stream = None
        self._capturing = False
        # mma.sync's int8 products (matmul_q8_mma.cu) need sm_80 or later.
        self.int8_mma = int(cupy.cuda.Device().compute_capability) >= 80
        self.multiprocessors = cupy.cuda.Device().attributes["MultiProcessorCount"]

    def function(self, module: str, name: str):
        if name not in self._functions:
            if module not in self._modules:
                self._modules[module] = self.xp.RawModule(code=nvrtc_source(module), options=self._options)
            self._functions[name] = self._modules[module].get_function(name)
        return self._functions[name]

    def gemm_f16(self, a, b, out) -> None:
        """out (M, N) float32 = a (M, K) float16 · b (N, K) float16ᵀ on tensor cores, accumulating
        in float32. out may be a column slice of a wider matrix (rows strided, columns contiguous)."""
        (m, k), n = a.shape, b.shape[0]
        check(a, np.float16, "a")
        check(b, np.float16, "b")
        assert out.dtype == np.float32 and out.shape == (m, n) and out.strides[1] == 4
        handle = self.xp.cuda.device.get_cublas_handle()
        # CuPy's cuBLAS wrappers refuse to run while a stream captures (each sets the handle's
        # stream first): then cuBLAS itself is called, on the stream capture() set beforehand.
        if self._capturing:
            gemm_ex = _cublas_gemm_ex()
        else:
            gemm_ex = self._cublas.gemmEx
            self._cublas.setStream(handle, self.xp.cuda.get_current_stream().ptr)
        # cuBLAS is column-major: it computes outᵀ (N, M) = b · aᵀ, reading row-major b as bᵀ.
        status = gemm_ex(handle, _CUBLAS_OP_T, _CUBLAS_OP_N, n, m, k,
                         self._alpha.ctypes.data, b.data.ptr, _CUDA_R_16F, k, a.data.ptr, _CUDA_R_16F, k,
                         self._beta.ctypes.data, out.data.ptr, _CUDA_R_32F, out.strides[0] // 4,
                         _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT)
        if status:  # CuPy's wrapper raises; cuBLAS itself returns a status
            raise RuntimeError(f"cublasGemmEx failed with status {status}")

    def capture(self, fn):
        """Record the GPU work of fn() into a CUDA graph, executing none of it; -> (graph, fn's result).

        Its allocations come from a pool of the graph's own, which keeps the memory its kernels
        use for as long as the graph lives (the default pool would hand it out again)."""
        cupy = self.xp
        if self._capture_stream is None:
            self._capture_stream = cupy.cuda.Stream(non_blocking=True)
        stream, pool = self._capture_stream, cupy.cuda.MemoryPool()
        with stream, cupy.cuda.using_allocator(pool.malloc):
            # GEMMs (decode steps of many rows) must go to the capture stream, and CuPy refuses to
            # set a cuBLAS handle's stream while it captures: set it before.
            self._cublas.setStream(self.xp.cuda.device.get_cublas_handle(), stream.ptr)
            self._capturing = True
            stream.begin_capture()
            try:
                result = fn()
            finally:
                graph = stream.end_capture()
                self._capturing = False
        return _Graph(graph, pool), result

    def to_host(self, x) -> np.ndarray:
        return x.get()

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()


@functools.cache
def _cublas_gemm_ex():
    """cublasGemmEx from the cuBLAS library CuPy has loaded into this process."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/libcublas.so" in line}
    library = ctypes.CDLL(paths.pop() if paths else "libcublas.so.13")
    gemm_ex = library.cublasGemmEx
    int_, pointer = ctypes.c_int, ctypes.c_void_p
    gemm_ex.argtypes = [pointer, int_, int_, int_, int_, int_, pointer, pointer, int_, int_,
                        pointer, int_, int_, pointer, pointer, int_, int_, int_, int_]
    gemm_ex.restype = int_
    return gemm_ex


class _Graph:
    def __init__(self, graph, pool):
        self._graph, self._pool = graph, pool  # the pool holds the memory the captured kernels use

    def launch(self) -> None:
        self._graph.launch()  # on the current stream, in order with the work around it
