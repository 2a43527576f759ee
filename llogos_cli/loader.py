"""From a -m value to a ready model and tokenizer on the chosen backend.

Opening (the file's header, the config and the tokenizer) is cheap and comes first, so that bad
input is reported before the weights are read; loading the weights is the slow part.
"""

import time
from dataclasses import dataclass
from pathlib import Path

from llogos_cli.backends import get_backend
from llogos_cli.config import ModelConfig
from llogos_cli.console import err
from llogos_cli.errors import LlogosError
from llogos_cli.gguf_file import GGUFFile
from llogos_cli.model import Model
from llogos_cli.registry import ModelEntry, resolve_model
from llogos_cli.tokenizer import Tokenizer

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

    def n_ctx(self, requested: int | None) -> int:
        """-c/--ctx-size, defaulting to the trained context capped at 4096; 0 means the trained context."""
        if requested is None:
            return min(self.cfg.n_ctx_train, DEFAULT_MAX_CTX)
        return requested or self.cfg.n_ctx_train


@dataclass(frozen=True, slots=True)
class Loaded:
    source: ModelFile
    model: Model
    load_ms: float   # opening included

    @property
    def tokenizer(self) -> Tokenizer:
        return self.source.tokenizer


def open_model(name_or_path: str | None) -> ModelFile:
    t0 = time.perf_counter()
    path, entry = resolve_model(name_or_path)
    f = GGUFFile(path)
    cfg = ModelConfig.from_gguf(f)
    tokenizer = Tokenizer.from_gguf(f)
    if tokenizer.n_vocab != cfg.n_vocab:
        raise LlogosError(f"{path}: tokenizer has {tokenizer.n_vocab} tokens but the model "
                          f"has {cfg.n_vocab} outputs")
    return ModelFile(path, entry, f, cfg, tokenizer, (time.perf_counter() - t0) * 1e3)


def load(source: ModelFile | str | None, backend: str = "auto") -> Loaded:
    """The weights on the backend, from an opened ModelFile or a -m value."""
    if not isinstance(source, ModelFile):
        source = open_model(source)
    t0 = time.perf_counter()
    with err.status(f"loading {source.path.name}", spinner="dots"):
        model = Model(source.file, get_backend(backend))
    return Loaded(source, model, source.open_ms + (time.perf_counter() - t0) * 1e3)
