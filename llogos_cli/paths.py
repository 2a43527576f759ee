"""Where llogos keeps files it derives: assembled models, parsed GGUF headers, tokenizers."""

import os
from pathlib import Path

from llogos_cli.errors import LlogosError

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cache_dir(*parts: str) -> Path:
    base = os.environ.get("LLOGOS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llogos")
    path = Path(base, *parts)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LlogosError(f"cannot use the cache folder {path}: {e.strerror} "
                          "(set LLOGOS_CACHE to a writable folder)") from None
    return path


def optional_cache_dir(*parts: str) -> Path | None:
    """The cache folder for things that are only faster with a cache: None when it is unusable."""
    try:
        return cache_dir(*parts)
    except LlogosError:
        return None
