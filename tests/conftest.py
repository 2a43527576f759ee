"""Shared test fixtures: reference data from ../shared and the installed real models."""

import importlib.util
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from llogos_cli.errors import LlogosError

SHARED = Path(__file__).resolve().parents[2] / "shared"
FIXTURES = SHARED / "fixtures"
REFERENCE = SHARED / "reference"
# Cache types for a test of the forward pass's exactness against float32 (HF transformers' logits,
# tolerances of float32 rounding): the default f16 cache rounds each key and value by up to 2^-11 of
# itself, more than those tolerances allow once it has passed through every layer. Also for a test
# that two routes through the engine (batched and alone, paged, resumed) agree to float32 rounding:
# a key two routes compute a float32 step apart can round to neighbouring f16 values, a whole f16
# step (2^-10 of itself) apart. What f16 does to one attention is bounded in test_kv_cache_types.py;
# llama.cpp's references (made with f16 caches) are matched with the default.
EXACT_KV = ("f32", "f32")


# The user cache's folders whose entries are named by what they were built from (the kernels'
# sources, a GGUF's header bytes) and written whole by a rename: a command reads what another built
# only when it would have built the same.
SHARED_CACHES = ("numba", "gguf", "tokenizer")


def fresh_cache(tmp_path_factory) -> str:
    """An empty LLOGOS_CACHE for a module's commands, but for SHARED_CACHES: they link to the run's
    own, so that the module's first command loads the compiled CPU kernels (some 80 CPU-seconds to
    compile SmolLM2's), its GGUF's parsed header and its tokenizer's tables instead of building them
    again (2.6 of the 4.7 CPU-seconds of a first SmolLM2 generate)."""
    from llogos_cli.paths import cache_dir
    folder = tmp_path_factory.mktemp("cache")
    for name in SHARED_CACHES:
        (folder / name).symlink_to(cache_dir(name), target_is_directory=True)
    return str(folder)


def subprocess_env(tmp_path_factory, **extra: str) -> dict[str, str]:
    """os.environ for a module's llogos commands: a fresh_cache, no colour, rich's own width.
    NUMBA_CACHE_DIR is left out whether or not this process has imported numba yet (it sets it),
    which decided, by what ran before, whether a file's commands shared the kernels or compiled
    their own; each command names the folder itself, and compiles in children as a user's does."""
    env = dict(os.environ, LLOGOS_CACHE=fresh_cache(tmp_path_factory), NO_COLOR="1", **extra)
    for name in ("COLUMNS", "NUMBA_CACHE_DIR"):
        env.pop(name, None)
    return env


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"reference data not present: {path}")
    return path


class LazyModule:
    """A module's stand-in that imports it at its first public attribute's use. Collection reads a
    test module's every global, a module's private names too (fixtures behind `__wrapped__`, mocks'
    `_mock_name`), so a stand-in that answered those would load the module all the same."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)


def lazy_import(name: str) -> LazyModule:
    """pytest.importorskip at a module's top, but the module loads when a test first uses it:
    openai's and anthropic's clients (their types) and fastapi take seconds to import, and every
    xdist worker collects every test file while only one of them runs it."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"could not import {name!r}", allow_module_level=True)
    return LazyModule(name)


def relative_error(ours, expected) -> float:
    """Largest difference as a fraction of the expected values' scale: float32 error grows with the
    magnitude of what is summed, so tolerances are relative to it, not to each entry."""
    return float(np.abs(np.asarray(ours) - expected).max() / np.abs(expected).max())


def assert_decisive_choices_kept(got, want, lead: float = 0.5) -> None:
    """Every next token the reference logits `want` choose by a lead of `lead` or more is `got`'s
    choice too (and there is such a choice): how a product that is not float32-exact (8-bit
    activations) is held to the exact one."""
    top2 = np.sort(want, axis=-1)[:, -2:]
    decisive = top2[:, 1] - top2[:, 0] >= lead
    assert decisive.any() and (np.argmax(got, -1) == np.argmax(want, -1))[decisive].all()


def reference(name: str) -> dict:
    return json.loads(need(REFERENCE / f"{name}.json").read_text())


def assert_teacher_forced(logits: np.ndarray, case: dict, tolerance: float, label: str) -> None:
    """logits (position, vocab) of a reference case's prompt + llama.cpp's tokens: transformers'
    float32 top-5 logprobs within tolerance at every step, and llama.cpp's top-1 wherever its lead
    over the second is at least 0.5 (closer calls differ by rounding, see reference/README.md)."""
    from llogos_cli.engine.sampling import log_softmax
    for step in case["transformers_fp32"]["teacher_forced"]:
        lp = log_softmax(logits[step["pos"]])
        for token_id, expected in step["top5"]:
            assert abs(lp[token_id] - expected) < tolerance, (label, case["id"], step["pos"], token_id)
    for i, step in enumerate(case["llamacpp"]["steps"]):
        (top1, lp1), (_, lp2) = step["top5"][:2]
        if lp1 - lp2 >= 0.5:
            assert int(np.argmax(logits[len(case["prompt_ids"]) - 1 + i])) == top1, (label, case["id"], i)


def model_path(name: str) -> Path:
    from llogos_cli.model.registry import resolve_model
    try:
        return resolve_model(name)[0]
    except LlogosError as e:  # `make test` pulls both models before running the suite
        pytest.fail(f"{e} (or run: make models)")


def copy_gguf(src: Path, dst: Path, meta: dict | None = None, tensors: dict | None = None,
              vocab_only: bool = False, keep=lambda name: True) -> Path:
    """Write src's metadata and tensors to dst, with metadata values and tensors replaced or added:
    meta {key: value}, tensors {name: (array, GGML type or None for the array's own type)}.
    vocab_only: no tensors at all, as llama.cpp's vocabulary files; keep(name): whether src's tensor goes."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    meta, tensors = dict(meta or {}), dict(tensors or {})
    reader = GGUFReader(src)
    arch = meta.pop("general.architecture", None) or reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, meta.pop(key, field.contents()), field.types[0], sub)
    for key, value in meta.items():
        writer.add_key_value(key, value, GGUFValueType.get_type(value))
    for t in [] if vocab_only else [t for t in reader.tensors if keep(t.name)]:
        data, qtype = tensors.pop(t.name, (t.data, None))
        writer.add_tensor(t.name, data, raw_dtype=qtype)
    for name, (data, qtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    return model_path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return model_path("gemma3-270m")


def pytest_report_header(config):
    state = "present" if FIXTURES.is_dir() and REFERENCE.is_dir() else "MISSING: tests that need it skip"
    return f"llogos reference data: {SHARED} ({state})"


def interruptible() -> None:
    """Popen's preexec_fn for a child a test interrupts with SIGINT: Ctrl-C's default disposition,
    which a child otherwise inherits ignored when the suite itself runs as a background job."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# The files that take minutes, longest first (as make test timed them on the 2-core CI host).
# xdist hands a worker the next file whenever it finishes one, so a long file that comes last keeps
# one worker busy while the other has nothing left to do; started first, the short files fill in
# beside it.
LONGEST_FILES = ("test_webui.py", "test_speculation.py", "test_server_anthropic.py", "test_server_responses.py")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: LONGEST_FILES.index(item.path.name) if item.path.name in LONGEST_FILES
               else len(LONGEST_FILES))
