"""Corrupt GGUF files: whatever the bytes, opening a model and running a token either works or stops
with one LlogosError line, quickly and without allocating far beyond the file's size.

Cases start from the tiny fixtures and from SmolLM2's real header, and apply truncations, byte
flips, and rewrites of the header's structured fields (version, counts, string and array lengths,
value types, tensor dimensions, types and offsets) with values chosen to break naive parsers. A
fixed seed and LLOGOS_FUZZ_EXAMPLES examples (default 100; a fifth of that on the real header) keep `make test` reproducible;
set it higher to search further, with a random seed.
"""

import functools
import os
import signal
import time
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.config import ModelConfig
from llogos_cli.model.forward import Model
from tests.conftest import FIXTURES, model_path, need

EXAMPLES = int(os.environ.get("LLOGOS_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, derandomize="LLOGOS_FUZZ_EXAMPLES" not in os.environ, deadline=None,
                database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SECONDS = 10   # of this process's CPU time (all its threads), which other processes' load leaves alone
WALL_FACTOR = 30   # a case blocked (not spinning) fails after this many times SECONDS of wall time
FIXTURE_FILES = ["tiny-llama-f32.gguf", "tiny-llama-q8_0.gguf", "tiny-qwen2-q8_0.gguf", "tiny-qwen3-f32.gguf",
                 "tiny-qwen35-f32.gguf", "tiny-gemma3-q8_0.gguf"]


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLOGOS_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def case_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "case.gguf"


@contextmanager
def time_limit(seconds: int):
    """Raises TimeoutError once the block has used `seconds` of CPU time (a hang that spins), or
    WALL_FACTOR times that of wall time (one that blocks: far past any load's slowing)."""
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} CPU-s" if signum == signal.SIGPROF
                           else f"still running after {seconds * WALL_FACTOR} s")
    previous = signal.signal(signal.SIGPROF, expire), signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.alarm(seconds * WALL_FACTOR)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.alarm(0)
        signal.signal(signal.SIGPROF, previous[0])
        signal.signal(signal.SIGALRM, previous[1])


def open_and_run(path: Path) -> None:
    """Load on the NumPy backend and run one token; a LlogosError must be a single line."""
    try:
        model = Model(GGUFFile(path), NumpyBackend())
        logits = model.forward_seq(model.new_context(8), np.array([0], np.int32))
        assert logits.shape == (1, model.cfg.n_vocab)
    except LlogosError as e:
        assert "\n" not in str(e) and str(e)


def check_case(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    tracemalloc.start()
    start = time.process_time()
    try:
        with time_limit(SECONDS * 2):
            open_and_run(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.process_time() - start < SECONDS
    # Weights dequantized to float32 take up to ~4x a q8_0 file; the rest is small.
    assert peak < 8 * len(data) + (32 << 20), f"peak allocation {peak >> 20} MB for a {len(data) >> 10} KB file"


# --- where the structured fields of a valid file are --------------------------------------------

@functools.cache
def fields(path: Path) -> tuple[tuple[int, int, str, int], ...]:
    """(offset, width, kind, value) of every count, length, type id and tensor-info field in the
    header, located through the gguf reader's memmap views of a valid file."""
    reader = read(path)
    base = reader.data.ctypes.data

    def at(part) -> int:
        return part.ctypes.data - base

    out = [(4, 4, "version"), (8, 8, "count"), (16, 8, "count")]
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):
            continue
        p = field.parts
        out += [(at(p[0]), 8, "length"), (at(p[2]), 4, "value type")]
        if field.types[0] == GGUFValueType.STRING:
            out.append((at(p[3]), 8, "length"))
        elif field.types[0] == GGUFValueType.ARRAY:
            out += [(at(p[3]), 4, "value type"), (at(p[4]), 8, "length")]
            if len(p) > 5:
                out.append((at(p[5]), p[5].nbytes, "length" if field.types[1] == GGUFValueType.STRING else "value"))
        else:
            out.append((at(p[3]), p[3].nbytes, "value"))
    for tensor in reader.tensors:
        name_len, _, n_dims, dims, ggml_type, offset = tensor.field.parts
        out += [(at(name_len), 8, "length"), (at(n_dims), 4, "n_dims"), (at(ggml_type), 4, "tensor type"),
                (at(offset), 8, "offset")]
        out += [(at(dims) + 8 * i, 8, "dim") for i in range(len(dims))]
    data = path.read_bytes()
    return tuple((o, w, kind, int.from_bytes(data[o:o + w], "little")) for o, w, kind in out)


def interesting(kind: str, old: int, width: int, size: int) -> st.SearchStrategy[int]:
    top = (1 << (8 * width)) - 1
    common = [0, 1, old + 1, old - 1, top, top >> 1, (top >> 1) + 1]
    extra = {"version": [2, 3, 4, 0x00030000],
             "count": [old * 2, size, 1 << 32],
             "length": [old * 2, size, size + 1, 1 << 40],
             "value type": list(range(16)),
             "n_dims": [2, 3, 4, 5],
             "dim": [old * 2, 1 << 32, 1 << 33, 3, 31, 32, 255],
             "tensor type": list(range(42)),
             "offset": [old + 32, old - 32, size, size - 32],
             "value": [2, 3, 7, 1 << (8 * width - 2)]}[kind]
    values = sorted({v & top for v in common + extra})
    return st.one_of(st.sampled_from(values), st.integers(0, top))


@st.composite
def corruption(draw, path: Path, size: int, header_end: int) -> tuple:
    """How to corrupt the file: ("field", [(offset, width, value)...]), ("truncate", length) or
    ("flip", [(offset, xor)...]); a small description, so that a failing case prints legibly."""
    how = draw(st.sampled_from(["field", "field", "truncate", "flip"]))
    if how == "field":
        # Sometimes two fields, so that checks which stop at the first oddity are not enough.
        picks = [draw(st.sampled_from(fields(path))) for _ in range(draw(st.integers(1, 2)))]
        return how, [(offset, width, draw(interesting(kind, old, width, size))) for offset, width, kind, old in picks]
    anywhere = st.one_of(st.integers(0, header_end - 1), st.integers(0, size - 1))
    if how == "truncate":
        return how, draw(anywhere)
    return how, [(draw(anywhere), draw(st.integers(1, 255))) for _ in range(draw(st.integers(1, 8)))]


def corrupt(data: bytes, change: tuple) -> bytes:
    how, what = change
    if how == "truncate":
        return data[:what]
    buf = bytearray(data)
    if how == "field":
        for offset, width, value in what:
            buf[offset:offset + width] = value.to_bytes(width, "little")
    else:
        for offset, xor in what:
            buf[offset] ^= xor
    return bytes(buf)


@functools.cache
def read(path: Path) -> GGUFReader:
    return GGUFReader(path)


def header_end(path: Path) -> int:
    return int(read(path).data_offset)


# --- the cases --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FIXTURE_FILES)
def test_fixtures_load_and_run_before_corruption(name, case_path):
    path = need(FIXTURES / name)
    check_case(case_path, path.read_bytes())
    ModelConfig.from_gguf(GGUFFile(path))


# Corrupted weights may hold NaNs and infinities: numpy warns about them, and running them is the point.
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@FUZZ
@given(data=st.data())
def test_corrupted_fixture(case_path, data):
    path = need(FIXTURES / data.draw(st.sampled_from(FIXTURE_FILES)))
    original = path.read_bytes()
    check_case(case_path, corrupt(original, data.draw(corruption(path, len(original), header_end(path)))))


@pytest.fixture(scope="module")
def smollm_header(tmp_path_factory) -> tuple[Path, bytes, int]:
    """SmolLM2's real header (49k-token vocabulary, its chat template), cut after the tensor infos:
    every corruption of it must fail, and fail fast, before the slow reader walks the vocabulary."""
    path = model_path("smollm2-135m")
    end = header_end(path)
    with open(path, "rb") as f:
        return path, f.read(end), end


@settings(FUZZ, max_examples=max(10, EXAMPLES // 5))  # each walks a 49k-token vocabulary
@given(data=st.data())
def test_corrupted_real_header(case_path, smollm_header, data):
    path, header, end = smollm_header
    check_case(case_path, corrupt(header, data.draw(corruption(path, len(header), end))))


# --- metadata of the wrong type or out of range -----------------------------------------------------

def with_value(src: Path, dst: Path, key: str, value) -> Path:
    """src with metadata `key` set to `value`, stored with the GGUF type of the value itself (copy_gguf
    keeps an existing key's type, which cannot hold a string where an integer was)."""
    reader = GGUFReader(src)
    writer = GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if not name.startswith("GGUF.") and name not in ("general.architecture", key):
            sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), field.types[0], sub)
    sub = GGUFValueType.get_type(value[0]) if isinstance(value, list) else None
    writer.add_key_value(key, value, GGUFValueType.get_type(value), sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.mark.parametrize("key, value, fragment", [
    ("llama.attention.head_count", 0, "not an integer from 1"),
    ("llama.attention.head_count", -4, "not an integer from 1"),
    ("llama.attention.head_count", "four", "'four'"),
    ("llama.attention.head_count", [4, 4], "[4, 4]"),
    ("llama.attention.head_count", 6, "attn_q.weight has shape"),
    ("llama.attention.head_count_kv", 3, "do not group"),
    ("llama.block_count", 1 << 30, "the file has only"),
    ("llama.block_count", 0, "not an integer from 1"),
    ("llama.embedding_length", 1.5, "1.5"),
    ("llama.feed_forward_length", 65, "ffn_gate.weight has shape"),
    ("llama.context_length", 0, "not an integer from 1"),
    ("llama.attention.layer_norm_rms_epsilon", 0.0, "not a positive number"),
    ("llama.attention.layer_norm_rms_epsilon", float("nan"), "not a positive number"),
    ("llama.rope.freq_base", "high", "not a positive number"),
    ("llama.rope.dimension_count", 7, "rope dimension 7"),
    ("llama.vocab_size", 7, "token_embd.weight has shape"),
])
def test_absurd_metadata_is_one_line(tmp_path, key, value, fragment):
    path = with_value(need(FIXTURES / "tiny-llama-f32.gguf"), tmp_path / "bad.gguf", key, value)
    with pytest.raises(LlogosError, match="bad.gguf") as e:
        Model(GGUFFile(path), NumpyBackend())
    assert fragment in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("key, value, fragment", [
    ("qwen35.ssm.time_step_rank", 3, "do not tile"),
    ("qwen35.ssm.group_count", 0, "not an integer from 1"),
    ("qwen35.attention.recurrent_layers", [True, False], "one flag for each of the 4 layers"),
    ("qwen35.ssm.conv_kernel", 5, "ssm_conv1d.weight has shape"),
])
def test_absurd_recurrent_metadata_is_one_line(tmp_path, key, value, fragment):
    path = with_value(need(FIXTURES / "tiny-qwen35-f32.gguf"), tmp_path / "bad.gguf", key, value)
    with pytest.raises(LlogosError, match=fragment):
        Model(GGUFFile(path), NumpyBackend())
