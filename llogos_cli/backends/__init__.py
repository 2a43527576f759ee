"""Backends: the small set of tensor operations the forward pass is written in.

Every backend implements the same methods on its own array type (NumPy on CPU, CuPy on GPU):

  loading     vector(raw) · matrix(raw, qtype, matmul) · to_host(x)
  embedding   embed(table, ids)
  arithmetic  matmul(x, w) · add(a, b) · mul(a, b) · scale(x, s) · sigmoid(x)
  norms       rmsnorm(x, w, eps) · l2norm(x, eps)
  positions   rope(x, pos, dims, base, freq_scale, neox)
  attention   kv_cache(n_ctx, n_kv, dk, dv) · kv_store(cache, k, v, pos0)
              attention(q, cache, pos0, scale, window)
  ffn         glu(gate, up, gelu)
  recurrence  conv_state(...) / delta_state(...) · ssm_conv(...) · delta_net(...)
  sampling    argmax(row)

Shapes are (tokens, features) or (tokens, heads, head_dim); weights are (out, in).
"""

from llogos_cli.errors import LlogosError

BACKENDS = ("cpu", "cuda", "auto")


def cuda_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, or no device: all mean "use the CPU"
        return False


def get_backend(name: str):
    if name == "auto":
        name = "cuda" if cuda_available() else "cpu"
    if name == "cpu":
        from llogos_cli.backends.numpy_backend import NumpyBackend
        return NumpyBackend()
    if name == "cuda":
        if not cuda_available():
            raise LlogosError("--backend cuda needs CuPy and a CUDA GPU; none was found (install llogos[cuda])")
        from llogos_cli.backends.cuda_backend import CudaBackend
        return CudaBackend()
    raise LlogosError(f"unknown backend '{name}' (choose from {', '.join(BACKENDS)})")
