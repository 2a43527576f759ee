"""Backends: the small set of tensor operations the forward pass is written in.

Every backend implements the same methods on its own array type (NumPy on CPU, CuPy on GPU):

  loading     vector(raw, qtype) · matrix(raw, qtype, matmul) · to_host(x) · decoder(model, ctx)
  embedding   embed(table, ids)
  arithmetic  matmul(x, w) · add(a, b) · mul(a, b) · scale(x, s) · sigmoid(x) · silu(x) · softplus(x)
  norms       rmsnorm(x, w, eps) · l2norm(x, eps)
  positions   rope(x, pos, dims, base, freq_scale, neox, factors=None)
  attention   kv_cache(n_ctx, n_kv, dk, dv, type_k, type_v) · kv_store(cache, k, v, pos0)
              attention(q, cache, pos0, scale, window)
  ffn         glu(gate, up, gelu)
  recurrence  zeros(shape) · ssm_conv(x, conv_state, w) · delta_net(q, k, v, g, beta, state)
  sampling    argmax(row)

Shapes are (tokens, features) or (tokens, heads, head_dim); weights are (out, in).

The recurrence ops (Gated DeltaNet layers) work on float32 arrays and advance their state in place:
  zeros(shape)            a float32 array of zeros: per-sequence recurrent state
  ssm_conv(x, conv_state, w)
                          causal depthwise convolution: x (T, C), conv_state (K-1, C) the inputs
                          before x, w the (C, K) kernel from matrix(); out[t] = sum_j w[:, j] *
                          [conv_state; x][t + j]. conv_state becomes the last K-1 rows. -> (T, C)
  delta_net(q, k, v, g, beta, state)
                          gated delta rule over T tokens: q, k (T, Hk, dk); v (T, Hv, dv); g, beta
                          (T, Hv); state (Hv, dv, dk). Value head h reads key head h % Hk. Per token
                          and head: S = exp(g) S; S += beta (v - S k) k^T; out = S q. -> (T, Hv, dv)
"""

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from llogos_cli.errors import LlogosError

BACKENDS = ("cpu", "cuda", "auto")
CACHE_TYPES = ("f32", "f16", "q8_0")
Q8_0_BLOCK = GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0][0]


def check_cache_type(cache_type: str, head_dim: int) -> None:
    """A KV cache type both backends can hold for heads of this size, or a one-line error."""
    if cache_type not in CACHE_TYPES:
        raise LlogosError(f"unknown KV cache type '{cache_type}' (choose from {', '.join(CACHE_TYPES)})")
    if cache_type == "q8_0" and head_dim % Q8_0_BLOCK:
        raise LlogosError(f"a q8_0 KV cache needs head sizes that are multiples of {Q8_0_BLOCK}, not {head_dim}")


def cuda_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, or no device: all mean "use the CPU"
        return False


def get_backend(name: str):
    if name not in BACKENDS:
        raise LlogosError(f"unknown backend '{name}' (choose from {', '.join(BACKENDS)})")
    gpu = name != "cpu" and cuda_available()
    if name == "cuda" and not gpu:
        raise LlogosError("--backend cuda needs CuPy and a CUDA GPU; none was found (install llogos[cuda])")
    if gpu:
        from llogos_cli.backends.cuda_backend import CudaBackend
        try:
            return CudaBackend()
        except LlogosError as e:  # a GPU without a usable CUDA stack: auto falls back, cuda says why
            if name == "cuda":
                raise
            from llogos_cli.console import warn
            warn(f"{e}; running on the CPU")
    from llogos_cli.backends.numpy_backend import NumpyBackend
    return NumpyBackend()
