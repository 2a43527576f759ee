"""The vocabulary-only fixtures cut from real vocabularies (tests/fixtures/vocab-NAME.gguf, made by
tests/fixtures/make_NAME_vocab.py) and llama-tokenize's ids for their texts (vocab-NAME.json)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from llogos_cli.gguf.file import GGUFFile
from llogos_cli.tokenizer.tokenizer import Tokenizer

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def cases(name: str) -> list[tuple[str, list[int]]]:
    """(text, llama-tokenize's ids without BOS) for each text of the fixture."""
    recorded = json.loads((FIXTURES / f"vocab-{name}.json").read_text())
    return list(zip(recorded["texts"], recorded["llama_tokenize_ids"]))


def tokenizer(name: str) -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(FIXTURES / f"vocab-{name}.gguf"))


def llogos_tokenize(name: str, cache: Path, *args: str) -> list[int]:
    """`llogos tokenize -m` the fixture's file, its ids as printed (a JSON list)."""
    env = dict(os.environ, LLOGOS_CACHE=str(cache), NO_COLOR="1")
    done = subprocess.run([sys.executable, "-m", "llogos_cli", "tokenize", "-m", str(FIXTURES / f"vocab-{name}.gguf"),
                           *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
