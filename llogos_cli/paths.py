"""Where llogos keeps files it derives: assembled models, parsed GGUF headers, tokenizers."""

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cache_dir(*parts: str) -> Path:
    base = os.environ.get("LLOGOS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llogos")
    path = Path(base, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
