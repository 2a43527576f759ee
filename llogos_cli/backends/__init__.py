"""Backends: the small set of tensor operations the forward pass is written in.

Every backend implements the same methods on its own array type (NumPy on CPU, CuPy on GPU):

  loading     vector(raw, qtype) · matrix(raw, qtype, matmul) · matrices(raws, qtype) · to_host(x) · load_threads · warm_up(product_types, experts, progress)
  graphs      graphs (bool) · capture(fn) · device_input(name, values) · release_inputs(): CUDA only
  batch       batch_layout(slots, pos)
  embedding   embed(table, ids)
  arithmetic  matmul(x, w) · matmuls(x, ws) · add(a, b) · mul(a, b) · scale(x, s) · softcap(x, cap) · sigmoid(x) · silu(x)
              softplus(x)
  norms       rmsnorm(x, w, eps) · l2norm(x, eps)
  positions   rope(x, pos, dims, base, freq_scale, neox, factors=None, attn_factor=1)
  attention   kv_cache(n_slots, n_ctx, n_kv, dk, dv, type_k, type_v) · kv_store(cache, k, v, layout)
              paged_kv_cache(tables, n_blocks, block_size, n_kv, dk, dv, type_k, type_v)
              block_tables(n_rows, max_blocks) · write_block_table(tables, row, blocks)
              attention(q, cache, layout, scale, window, softcap=0, sinks=None, causal=True)
              kv_shift(cache, slot, src, n, delta, rope)
  ffn         glu(gate, up, gelu)
  encoders    layernorm(x, w, b, eps) · gelu(x) (`encoders` True)
  experts     route(logits, k) · matmul_experts(x, w, experts, n_expert, weights=None)
  recurrence  zeros(shape) · ssm_conv(x, conv_state, w, layout) · delta_net(q, k, v, g, beta, state, layout)
  sampling    mask_logits(logits, bits) · argmax_rows(logits)

Shapes are (tokens, features) or (tokens, heads, head_dim); weights are (out, in).

A forward pass runs a batch of T tokens from one or more sequences, in llama.cpp's llama_batch
manner: token t belongs to cache slot slots[t] at position pos[t]. The tokens of one slot form one
contiguous run with consecutive positions (a prompt chunk, or a single decode token), and a slot
has at most one run in a batch. batch_layout(slots, pos) (int32 host arrays) is called once per
forward pass; what it returns is handed to every layer's kv_store, attention, ssm_conv and delta_net.

  kv_cache(n_slots, n_ctx, ...)  n_slots independent regions of n_ctx positions each
  paged_kv_cache(tables, ...)    one pool of n_blocks blocks of block_size positions; slot s's
                                 position p lies in block tables[s, p // block_size] (the batch
                                 engine's cache: blocks taken as rows grow, shared between rows
                                 whose prompts begin alike); write_block_table sets a row of them
  kv_store(cache, k, v, layout)  k (T, n_kv, dk), v (T, n_kv, dv): token t is written at
                                 (slots[t], pos[t])
  attention(q, cache, layout, scale, window, softcap=0)
                                 q (T, H, dk): token t attends the keys of its own slot at positions
                                 [max(0, pos[t] + 1 - window), pos[t] + 1) (window 0: from 0), the
                                 batch's own keys included; scores s = scale q·k become
                                 softcap * tanh(s / softcap) unless softcap is 0. Not causal
                                 (encoders), each token attends its run's keys up to the run's last
                                 position. -> (T, H, dv)
  kv_shift(cache, slot, src, n, delta, rope)
                                 a context shift: slot's positions src..src+n-1 move to
                                 src-delta.., keys turned by -delta positions with rope =
                                 (dims, base, freq_scale, neox, factors), only moved if None
  matmuls(x, ws)                 [x · wᵀ for w in ws]: the products that share an input (q, k
                                 and v; gate and up), which a backend may run as one
  matrices(raws, qtype)          matrices of one type loaded together, whose products will be
                                 taken together (matmuls): a backend may hold them as one
  mask_logits(logits, bits)      logits (R, n_vocab), bits (R, words) host uint32 (a grammar's
                                 token bitmask per row: bit i % 32 of word i / 32) -> the logits
                                 with each row's unset tokens, and any past the words, at -inf
  argmax_rows(logits)            logits (R, n_vocab) -> host int array (R,): each row's argmax,
                                 taken where the logits are
  capture(fn)                    where graphs is true: fn()'s device work recorded, not run, as
                                 a graph to replay -> (graph, fn's result); the forward pass reads
                                 its inputs from device_input buffers, which release_inputs hands
                                 over to the graph (engine/decode_graph.py)

The recurrence ops (Gated DeltaNet layers) work on float32 arrays and advance their state in place.
Their states hold one region per slot, the first axis; each run of the batch reads and advances
its own slot's region:
  zeros(shape)            a float32 array of zeros: recurrent state
  ssm_conv(x, conv_state, w, layout)
                          causal depthwise convolution: x (T, C), conv_state (n_slots, K-1, C) the
                          inputs before each run, w the (C, K) kernel from matrix(); within a run,
                          out[t] = sum_j w[:, j] * [conv_state[slot]; x][t + j]. conv_state[slot]
                          becomes the run's last K-1 rows. -> (T, C)
  delta_net(q, k, v, g, beta, state, layout)
                          gated delta rule: q, k (T, Hk, dk); v (T, Hv, dv); g, beta (T, Hv); state
                          (n_slots, Hv, dv, dk). Value head h reads key head h % Hk. Per token and
                          head: S = exp(g) S; S += beta (v - S k) k^T; out = S q. -> (T, Hv, dv)
"""

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from llogos_cli.errors import LlogosError

BACKENDS = ("cpu", "cuda", "auto")
CACHE_TYPES = ("f32", "f16", "q8_0", "q4_0", "iq4_nl")   # llama.cpp's -ctk/-ctv names
# Both backends' KV cache type unless asked otherwise, as llama.cpp's: half f32's memory, and each
# backend's attention reads f16 where it lies. Rounding each key and value to within 2^-11 of itself
# is all it changes; recurrent layers' state is float32 whatever the cache type.
DEFAULT_CACHE_TYPE = "f16"
# Elements per block of each block-quantized cache type (32 for all of them).
CACHE_BLOCKS = {name: GGML_QUANT_SIZES[GGMLQuantizationType[name.upper()]][0] for name in ("q8_0", "q4_0", "iq4_nl")}
QUERY_CHUNK = 256   # a prompt chunk's queries whose attention scores a backend holds at once
# Matrices with rows shorter than this are convolution kernels (C, K) that ssm_conv reads whole, never
# a product: no block type has such rows, and they are too small to matter. Backends hold them
# decoded to float32.
MIN_PRODUCT_ROW = 32
# The weight types the CPU multiplies in their blocks, one token at a time (cpu_quant_dot).
CPU_DOT_TYPES = frozenset(getattr(GGMLQuantizationType, n) for n in
                          ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"))
# ... and those it multiplies with 8-bit activations, any number of tokens at a time, where it has
# integer dot products (cpu_quant_int8).
CPU_INT8_TYPES = frozenset(getattr(GGMLQuantizationType, n) for n in
                           ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                            "Q6_K", "IQ4_XS"))
# Lists of matrices whose products' routes the CPU keeps (a model's own lists are a few hundred;
# the experts' slices are new arrays every step, so past this many the kept ones are dropped).
ROUTES_KEPT = 1024


def resolve_cache_types(cache_types: tuple[str | None, str | None]) -> tuple[str, str]:
    """-ctk and -ctv as given, DEFAULT_CACHE_TYPE for either left out (None)."""
    type_k, type_v = cache_types
    return type_k or DEFAULT_CACHE_TYPE, type_v or DEFAULT_CACHE_TYPE


def check_cache_type(cache_type: str, head_dim: int) -> None:
    """A KV cache type both backends can hold for heads of this size, or a one-line error."""
    if cache_type not in CACHE_TYPES:
        raise LlogosError(f"unknown KV cache type '{cache_type}' (choose from {', '.join(CACHE_TYPES)})")
    block = CACHE_BLOCKS.get(cache_type, 1)
    if head_dim % block:
        raise LlogosError(f"the {cache_type} KV cache type needs head sizes that are multiples of {block}, not {head_dim}")


def cuda_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, or no device: all mean "use the CPU"
        return False


def get_backend(name: str, cpu_weights: str = "f32", batched: bool = False, threads: tuple[int, int] = (0, 0)):
    """The backend `name` (cpu, cuda, auto); a CPU backend holds its weights as cpu_weights says
    (f32 or quantized: see numpy_backend), is told whether several sequences will decode
    together (batched), and computes on `threads` (-t, -tb; 0: auto, see cpu_threads)."""
    if name not in BACKENDS:
        raise LlogosError(f"unknown backend '{name}' (choose from {', '.join(BACKENDS)})")
    gpu = name != "cpu" and cuda_available()
    if name == "cuda" and not gpu:
        raise LlogosError("--backend cuda needs CuPy and a CUDA GPU; none was found (install llogos[cuda])")
    if gpu:
        from llogos_cli.backends.cuda.cuda_backend import CudaBackend
        try:
            return CudaBackend()
        except LlogosError as e:  # a GPU without a usable CUDA stack: auto falls back, cuda says why
            if name == "cuda":
                raise
            from llogos_cli.console import warn
            warn(f"{e}; running on the CPU")
    from llogos_cli.backends.cpu.cpu_threads import CpuThreads
    from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
    return NumpyBackend(cpu_weights, batched, CpuThreads(*threads))
