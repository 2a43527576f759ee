"""From a -m value to a ready model and tokenizer on the chosen backend.

Opening (the file's header, the config and the tokenizer) is cheap and comes first, so that bad
input is reported before the weights are read; loading the weights is the slow part.
"""

import time
from dataclasses import dataclass
from pathlib import Path

from llogos_cli.backends import cuda_available, get_backend, resolve_cache_types
from llogos_cli.console import err, notice, warn
from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model import memory
from llogos_cli.model.config import ModelConfig
from llogos_cli.model.forward import Model
from llogos_cli.model.registry import ModelEntry, resolve_model
from llogos_cli.tokenizer.tokenizer import Tokenizer

DEFAULT_MAX_CTX = 4096


@dataclass(frozen=True, slots=True)
class ModelFile:
    """Everything about a model but its weights."""
    path: Path
    entry: ModelEntry | None
    file: GGUFFile
    cfg: ModelConfig
    tokenizer: Tokenizer
    open_ms: float

    @property
    def sampling_defaults(self) -> dict:
        return self.entry.sampling if self.entry else {}

    def n_ctx(self, requested: int | None, allow_long: bool = False) -> int:
        """-c/--ctx-size, defaulting to the trained context capped at 4096; 0 means the trained context.
        A larger -c is capped at the trained context with a notice, unless allow_long (--allow-long-ctx)
        keeps it: positions past training are an explicit choice, and the memory check says whether it fits."""
        trained = self.cfg.n_ctx_train
        if requested is None:
            return min(trained, DEFAULT_MAX_CTX)
        if requested > trained and not allow_long:
            warn(f"-c {requested} capped at the {trained} tokens {self.path.name} was trained on "
                 "(--allow-long-ctx keeps it)")
            return trained
        return requested or trained


@dataclass(frozen=True, slots=True)
class Loaded:
    source: ModelFile
    model: Model
    load_ms: float   # opening included, compiling kernels not
    memory: str = ""   # how the weights are held and what the model needs, for --stats
    compile_ms: float = 0.0   # compiling the backend's kernels (a machine's first run), for --stats

    @property
    def tokenizer(self) -> Tokenizer:
        return self.source.tokenizer


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """Which model and how to load it: -m and the loading flags of every command that runs one
    (and of each `llogos batch --ray` worker)."""
    model_name: str | None = None
    ctx_size: int | None = None
    allow_long_ctx: bool = False
    backend: str = "auto"
    cpu_weights: str = "auto"
    cache_type_k: str | None = None      # None: DEFAULT_CACHE_TYPE (f16)
    cache_type_v: str | None = None
    threads: int = 0                     # 0: auto
    threads_batch: int = 0
    gpu_layers: int | str | None = None  # -ngl: a count, "auto" or "all"; None: not given
    mlock: bool = False
    mmap: bool = True

    @property
    def cache_types(self) -> tuple[str | None, str | None]:
        return self.cache_type_k, self.cache_type_v

    def open(self, generates: bool = True) -> ModelFile:
        """The model's file; one that cannot generate text (an encoder) is refused if it must."""
        mf = open_model(self.model_name, self.mmap)
        if generates and not mf.cfg.output:
            raise LlogosError(f"{mf.path.name} is a {mf.cfg.arch} model without an LM head: it makes embeddings "
                              "(llogos embed, llogos serve's /v1/embeddings), not text")
        return mf

    def n_ctx(self, mf: ModelFile) -> int:
        return mf.n_ctx(self.ctx_size, self.allow_long_ctx)

    def load(self, mf: ModelFile, n_ctx: int, n_slots: int = 1) -> Loaded:
        loaded = load(mf, self.placement(mf.cfg.n_layer), self.cpu_weights, n_ctx, self.cache_types, n_slots,
                      threads=(self.threads, self.threads_batch))
        refused = self.mlock and memory.lock_in_memory()
        if refused:
            warn(f"--mlock: the model could not be locked in memory ({refused}); it runs unlocked")
        return loaded

    def footprint(self, mf: ModelFile, n_ctx: int, n_slots: int, block_size: int, cache_bytes: int,
                  n_blocks: int | None = None) -> int:
        """Bytes the model holds once loaded for n_slots: its weights as the backend will hold them and
        its paged KV pool of n_blocks blocks (None: as many as memory.kv_pool_blocks would give it
        now, with cache_bytes of prefixes); decided without reading a weight."""
        cfg = mf.cfg
        types = resolve_cache_types(self.cache_types)
        if self.placement(cfg.n_layer) != "cpu" and cuda_available():
            held = device = "cuda"
        else:
            device = "cpu"
            held = memory.choose_cpu_weights(mf.file, cfg, self.cpu_weights, n_ctx, *types, n_slots)[0]
        if n_blocks is None:
            n_blocks = memory.kv_pool_blocks(cfg, device, *types, block_size, n_slots, n_ctx, cache_bytes)
        kv = n_blocks * block_size * memory.kv_bytes_per_position(cfg, device, *types)
        return memory.weight_bytes(mf.file, cfg, held) + int(kv)

    def placement(self, n_layer: int) -> str:
        """The backend, with -ngl read as llama.cpp means it. llogos runs a model whole on one device, so
        a count of layers picks the device: any layer on the GPU puts every layer there."""
        layers = self.gpu_layers
        if layers is None or layers == "auto":
            return self.backend
        wanted = "cpu" if layers == 0 else "cuda"
        if self.backend not in ("auto", wanted):
            raise LlogosError(f"-ngl {layers} and --backend {self.backend} disagree: give one of them")
        if wanted == "cpu":
            return "cpu"
        if not cuda_available():
            notice(f"-ngl {layers}: no CUDA GPU here (or no CuPy); running on the CPU")
            return "cpu"
        if layers != "all" and layers < n_layer:
            warn(f"-ngl {layers}: llogos does not split a model between GPU and CPU; "
                 f"all {n_layer} layers run on the GPU")
        return "cuda"


def open_model(name_or_path: str | None, mmap: bool = True) -> ModelFile:
    t0 = time.perf_counter()
    path, entry = resolve_model(name_or_path, install=True)
    f = GGUFFile(path, mmap)
    cfg = ModelConfig.from_gguf(f)
    tokenizer = Tokenizer.from_gguf(f)
    if tokenizer.n_vocab != cfg.n_vocab:
        raise LlogosError(f"{path}: tokenizer has {tokenizer.n_vocab} tokens but the model "
                          f"has {cfg.n_vocab} outputs")
    return ModelFile(path, entry, f, cfg, tokenizer, (time.perf_counter() - t0) * 1e3)


def open_tokenizer(name_or_path: str | None) -> Tokenizer:
    """The tokenizer of a model, or of a vocabulary-only GGUF file (no tensors), as llama.cpp's
    llama-tokenize reads one: nothing but its tokenizer metadata is read or checked."""
    path, _ = resolve_model(name_or_path, install=True)
    return Tokenizer.from_gguf(GGUFFile(path))


def load(source: ModelFile | str | None, backend: str = "auto", cpu_weights: str = "auto",
         n_ctx: int | None = None, cache_types: tuple[str | None, str | None] = (None, None),
         n_slots: int = 1, threads: tuple[int, int] = (0, 0)) -> Loaded:
    """The weights on the backend, from an opened ModelFile or a -m value. Before any weight is read,
    a model that would not fit in memory with n_slots contexts of n_ctx tokens (default: the default
    -c) is refused with a one-line LlogosError. threads: -t and -tb (0: auto)."""
    if not isinstance(source, ModelFile):
        source = open_model(source)
    t0 = time.perf_counter()
    f, cfg = source.file, source.cfg
    n_ctx = n_ctx or source.n_ctx(None)
    kv_types = resolve_cache_types(cache_types)
    weights, why = memory.choose_cpu_weights(f, cfg, cpu_weights, n_ctx, *kv_types, n_slots)
    b = get_backend(backend, weights, batched=n_slots > 1, threads=threads)
    held = "cuda" if b.name == "cuda" else weights
    need = memory.need(f, cfg, held, n_ctx, *kv_types, n_slots)
    available = memory.gpu_available() if held == "cuda" else memory.host_available()
    memory.check_fits(need, available, "GPU" if held == "cuda" else "host", n_ctx, held)
    note = f"{need.total / memory.GiB:.2f} GiB needed of {available / memory.GiB:.1f} GiB available"
    note += f"; {memory.kv_report(cfg, 'cuda' if held == 'cuda' else 'cpu', n_ctx, *kv_types)}"
    if held != "cuda":
        products = f", {b.products} products" if b.products else ""
        note = f"cpu weights {weights} ({why}{products}); {note}"
    loading = f"loading {source.path.name}"
    with err.status(loading, spinner="dots") as status:
        # first: the compiler's pages are handed back before the weights come
        compile_s = b.warm_up(memory.product_types(f, cfg), cfg.n_expert > 0, _CompileReport(status, loading), kv_types)
        model = Model(f, b)
    return Loaded(source, model, source.open_ms + (time.perf_counter() - t0 - compile_s) * 1e3, note, compile_s * 1e3)


class _CompileReport:
    """What a backend's warm-up says while it compiles kernels (once a machine: the compiled code is
    cached; loading it says nothing): a notice when it begins, then on a terminal the steps in the
    status line, elsewhere a line for each step that compiles."""

    def __init__(self, status, loading: str):
        self.status, self.loading, self.told = status, loading, False

    def __call__(self, p) -> None:
        if not self.told:
            self.told = True
            notice("compiling CPU kernels (once on this machine; later runs load them from the cache)")
        if err.is_terminal:
            self.status.update(f"compiling CPU kernels: {p.done} of {p.total} steps done, now {', '.join(p.compiling)}"
                               if p.compiling else self.loading)
        elif p.started is not None:
            notice(f"compiling CPU kernels: {p.started} (step {p.number} of {p.total})")
