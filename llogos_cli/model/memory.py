"""What a model will need in memory, against what there is: decided before any weight is read.

The need is the weights as the backend will hold them, the KV cache, the recurrent state, and
scratch for a prefill batch. The KV cache is a pool of blocks that rows take as they grow (the
batch engine's paged cache), which must hold one full context and is otherwise sized to the memory
left once the model is loaded (kv_pool_blocks), so -np does not multiply the need. Host memory is what the kernel
reports available (MemAvailable, bounded by a cgroup limit); on CUDA, the GPU's free memory. A
model that cannot fit is refused with one line, instead of being killed by the kernel part-way.
"""

import ctypes
import math
import os
from dataclasses import dataclass
from pathlib import Path

from gguf import GGMLQuantizationType

from llogos_cli.backends import CPU_DOT_TYPES, CPU_INT8_TYPES, QUERY_CHUNK
from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.config import ModelConfig

GiB = 1 << 30
MiB = 1 << 20
# auto expands to float32 only when that copy, with everything else, leaves this much of the
# memory free: the page cache, the tokenizer, and other programs need some too.
F32_HEADROOM = 0.5
# ...and only for models this small (weights used in products): past it, decode reads 4 bytes a
# weight from memory on the float32 path, slower than the quantized kernels (see docs/PERF.md).
F32_MAX_WEIGHTS = 200_000_000
# The paged KV pool takes at most this share of the memory left after loading: rows past it wait
# or are preempted instead of driving the machine into swap.
KV_POOL_SHARE = 0.5
PREFILL_BATCH = 512      # tokens of one engine step (-b/--batch-size), the activations a prefill holds
# Bytes per cached element: the CPU holds q8_0 entries as float32 after rounding, CUDA packs them;
# both pack the 4-bit types (32 elements in 18 bytes).
_KV_BYTES = {"cpu": {"f32": 4, "f16": 2, "q8_0": 4, "q4_0": 18 / 32, "iq4_nl": 18 / 32},
             "cuda": {"f32": 4, "f16": 2, "q8_0": 34 / 32, "q4_0": 18 / 32, "iq4_nl": 18 / 32}}


@dataclass(frozen=True, slots=True)
class Need:
    weights: int
    kv_cache: int
    state: int
    scratch: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.state + self.scratch


def _in_products(name: str, cfg: ModelConfig) -> bool:
    return name != "token_embd.weight" or cfg.output == name


def _products(f: GGUFFile, cfg: ModelConfig) -> list:
    """The matrices used in products."""
    return [t for name, t in f.tensors.items() if len(t.shape) > 1 and _in_products(name, cfg)]


def product_types(f: GGUFFile, cfg: ModelConfig) -> set:
    """The block types of the matrices used in products: the kernels a backend's warm_up readies."""
    return {t.ggml_type for t in _products(f, cfg)}


def weight_bytes(f: GGUFFile, cfg: ModelConfig, held: str) -> int:
    """Bytes of the weights as held: "f32" (the CPU's matrices used in products expanded),
    "quantized" (the CPU's matrices used in products tiled for its integer products, at most; the
    rest read in place) or "cuda" (blocks uploaded)."""
    total = 0
    for name, t in f.tensors.items():
        n = math.prod(t.shape)
        if len(t.shape) == 1:
            total += 4 * n                     # vectors are float32 copies on every backend
        elif held == "f32" and _in_products(name, cfg):
            total += 4 * n
        elif held == "quantized" and _in_products(name, cfg):
            # imported here: numba comes with it, which the float32 and CUDA paths never load
            from llogos_cli.backends.cpu.cpu_quant_int8 import packed_bytes
            total += packed_bytes(t.ggml_type, t.nbytes)
        else:
            total += t.nbytes
    return total


def need(f: GGUFFile, cfg: ModelConfig, held: str, n_ctx: int, type_k: str, type_v: str,
         n_slots: int = 1) -> Need:
    """Memory for the weights as `held` (see weight_bytes), the KV of one context of n_ctx tokens
    (the least a pool holds; kv_pool_blocks sizes it once the model is loaded) and the recurrent
    state of n_slots sequences."""
    device = "cuda" if held == "cuda" else "cpu"
    kv = int(n_ctx * kv_bytes_per_position(cfg, device, type_k, type_v))   # the paged pool's least
    state = 4 * n_slots * sum(cfg.recurrent) * (cfg.ssm.state_floats if cfg.ssm else 0)
    batch = min(n_ctx, PREFILL_BATCH)
    activations = batch * (6 * cfg.n_embd + 3 * cfg.n_ff + cfg.n_head * (cfg.head_dim_k + cfg.head_dim_v))
    scores = cfg.n_head * min(batch, QUERY_CHUNK) * n_ctx
    logits = batch * cfg.n_vocab
    return Need(weight_bytes(f, cfg, held), kv, state, 4 * (activations + scores + logits))


def kv_bytes_per_position(cfg: ModelConfig, device: str, type_k: str, type_v: str) -> float:
    """Bytes one token's keys and values take in every attention layer's cache, on "cpu" or "cuda"."""
    n_attn = cfg.n_layer - sum(cfg.recurrent)
    return n_attn * cfg.n_head_kv * (cfg.head_dim_k * _KV_BYTES[device][type_k]
                                     + cfg.head_dim_v * _KV_BYTES[device][type_v])


def kv_report(cfg: ModelConfig, device: str, n_ctx: int, type_k: str, type_v: str) -> str:
    """The KV cache of one n_ctx context as --stats tells it: its size, and what it saves against f16
    (llama.cpp's default), or costs more, if it is another type."""
    size = n_ctx * kv_bytes_per_position(cfg, device, type_k, type_v)
    note = f"KV cache {size / MiB:.2f} MiB for -c {n_ctx} ({type_k}/{type_v}"
    f16 = n_ctx * kv_bytes_per_position(cfg, device, "f16", "f16")
    if size != f16 and f16:
        note += f", {abs(f16 - size) / MiB:.2f} MiB {'less' if size < f16 else 'more'} than f16/f16"
    return note + ")"


def kv_pool_blocks(cfg: ModelConfig, device: str, type_k: str, type_v: str, block_size: int, n_slots: int,
                   n_ctx: int, cache_bytes: int) -> int:
    """Blocks of the paged KV pool on "cpu" or "cuda": room for every slot at its full context plus
    `cache_bytes` of prompt prefixes kept for reuse (--cache-ram), within KV_POOL_SHARE of the
    memory available now, and never less than one full context (a request that fits alone always
    runs). On the CPU the pool's pages are touched only as blocks are first written; on a GPU it is
    allocated at start."""
    per_block = block_size * kv_bytes_per_position(cfg, device, type_k, type_v)
    row = -(-n_ctx // block_size)
    if not per_block:   # no attention layers: the tables are never read
        return row
    want = n_slots * row + int(cache_bytes // per_block)
    if want <= row:   # one row without a prefix cache: one context, whatever memory is left
        return row
    available = gpu_available() if device == "cuda" else host_available()
    return max(row, min(want, int(KV_POOL_SHARE * available // per_block)))


def host_available() -> int:
    """Bytes of host memory a new allocation can have: MemAvailable, within a cgroup's limit."""
    available = _meminfo_available()
    limit = _cgroup_room()
    return available if limit is None else min(available, limit)


def _meminfo_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _cgroup_room() -> int | None:
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - used)


def gpu_available() -> int:
    import cupy
    return int(cupy.cuda.runtime.memGetInfo()[0])


_MCL_CURRENT = 1   # mlockall(2)'s flag for the pages mapped now, the loaded model's among them


def lock_in_memory() -> str | None:
    """Lock what the process has mapped into RAM, as llama.cpp's --mlock does the model: None, or why
    the kernel refused (most often the locked-memory limit, `ulimit -l`)."""
    if ctypes.CDLL(None, use_errno=True).mlockall(_MCL_CURRENT) == 0:
        return None
    return os.strerror(ctypes.get_errno())


def choose_cpu_weights(f: GGUFFile, cfg: ModelConfig, requested: str, n_ctx: int, type_k: str, type_v: str,
                       n_slots: int = 1) -> tuple[str, str]:
    """--cpu-weights: f32 and quantized as asked. auto reads the blocks in place when every product
    has a block kernel on this CPU (cpu_quant.block_types): one sequence and batches of up to 64
    rows then decode faster than from float32 rows, in a quarter of the memory (docs/PERF.md).
    Otherwise auto expands a small model whose float32 copy fits with room to spare. -> (mode, why,
    for --stats and info)."""
    if requested != "auto":
        return requested, "--cpu-weights"
    products = _products(f, cfg)
    types = {t.ggml_type for t in products}
    in_blocks = CPU_DOT_TYPES | {GGMLQuantizationType.F32}   # F32 matrices are used in place
    if types - in_blocks and types - in_blocks <= CPU_INT8_TYPES:   # the integer products' alone: if the CPU has them
        from llogos_cli.backends.cpu import cpu_quant   # numba's: loaded only for such a model
        in_blocks = cpu_quant.block_types() | {GGMLQuantizationType.F32}
    if types <= in_blocks:
        return "quantized", "auto: every product read in its blocks"
    f32 = need(f, cfg, "f32", n_ctx, type_k, type_v, n_slots)
    product_weights = sum(math.prod(t.shape) for t in products)
    if product_weights > F32_MAX_WEIGHTS:
        return "quantized", f"auto: {product_weights / 1e6:.0f} M weights in products, quantized kernels are faster"
    available = host_available()
    if f32.total > F32_HEADROOM * available:
        return "quantized", (f"auto: the float32 copy would need {f32.total / GiB:.1f} GiB of "
                             f"{available / GiB:.1f} GiB available")
    return "f32", f"auto: {product_weights / 1e6:.0f} M weights, float32 copy {f32.weights / GiB:.2f} GiB fits"


def check_fits(n: Need, available: int, where: str, n_ctx: int, held: str) -> None:
    """A one-line error, before loading, when the need exceeds what is available."""
    if n.total <= available:
        return
    tips = []
    if held == "f32":
        tips.append("--cpu-weights quantized")
    if n.kv_cache > n.weights / 4:
        tips += [f"a smaller -c than {n_ctx}", "--cache-type-k/--cache-type-v f16, q8_0 or q4_0"]
    tips.append("another backend" if held == "cuda" else "a smaller model")
    raise LlogosError(
        f"the model needs {n.total / GiB:.1f} GiB of {where} memory (weights {n.weights / GiB:.1f} GiB "
        f"{'as float32' if held == 'f32' else 'as stored'}, KV cache {n.kv_cache / GiB:.1f} GiB for -c {n_ctx}, "
        f"scratch {(n.state + n.scratch) / GiB:.1f} GiB) but {available / GiB:.1f} GiB is available; "
        f"try {', '.join(tips)}")
