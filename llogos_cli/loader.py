"""From a -m value to a ready model and tokenizer on the chosen backend."""

import time
from dataclasses import dataclass
from pathlib import Path

from llogos_cli.backends import get_backend
from llogos_cli.console import err
from llogos_cli.errors import LlogosError
from llogos_cli.gguf_file import GGUFFile
from llogos_cli.model import Model
from llogos_cli.registry import ModelEntry, resolve_model
from llogos_cli.tokenizer import Tokenizer

DEFAULT_MAX_CTX = 4096


@dataclass(frozen=True, slots=True)
class Loaded:
    path: Path
    entry: ModelEntry | None
    file: GGUFFile
    model: Model
    tokenizer: Tokenizer
    load_ms: float

    def n_ctx(self, requested: int | None) -> int:
        """-c/--ctx-size, defaulting to the trained context capped at 4096; 0 means the trained context."""
        trained = self.model.cfg.n_ctx_train
        if requested is None:
            return min(trained, DEFAULT_MAX_CTX)
        if requested < 0:
            raise LlogosError("--ctx-size must be positive (or 0 for the model's trained context)")
        return requested or trained


def open_model(name_or_path: str | None) -> tuple[Path, ModelEntry | None, GGUFFile]:
    path, entry = resolve_model(name_or_path)
    return path, entry, GGUFFile(path)


def load(name_or_path: str | None, backend: str = "auto") -> Loaded:
    t0 = time.perf_counter()
    path, entry, f = open_model(name_or_path)
    with err.status(f"loading {path.name}", spinner="dots"):
        b = get_backend(backend)
        model = Model(f, b)
        tokenizer = Tokenizer.from_gguf(f)
    if tokenizer.n_vocab != model.cfg.n_vocab:
        raise LlogosError(f"{path}: tokenizer has {tokenizer.n_vocab} tokens but the model "
                          f"has {model.cfg.n_vocab} outputs")
    return Loaded(path, entry, f, model, tokenizer, (time.perf_counter() - t0) * 1e3)
