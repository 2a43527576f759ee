"""What a model keeps of its GGUF file's memory map: pages read once are given back, and an
embedding table's rows read during generation do not stay mapped with their neighbours."""

import struct

import numpy as np
import pytest

from llogos_cli.backends.cpu import numpy_backend
from llogos_cli.gguf import file as gguf_file
from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.gguf.file import GGUFFile, drop_pages, drop_rows
from llogos_cli.model.forward import Model
from tests.conftest import FIXTURES, need


def mapped_pages(view: np.ndarray) -> int:
    """Pages of the view this process has mapped (/proc/self/pagemap's present bit)."""
    first, last = view.ctypes.data // 4096, (view.ctypes.data + view.nbytes - 1) // 4096
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        data = f.read((last - first + 1) * 8)
    return sum(struct.unpack_from("<Q", data, 8 * i)[0] >> 63 for i in range(last - first + 1))


@pytest.fixture
def table(tmp_path) -> np.ndarray:
    path = tmp_path / "rows.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 16 << 20, np.uint8).tobytes())
    return np.memmap(path, np.uint8, "r").reshape(4096, 4096)


def test_rows_read_are_given_back_with_what_came_around_them(table):
    drop_pages(table)
    ids = np.array([7, 1000, 1001, 3000])
    rows = table[ids].copy()
    assert mapped_pages(table) >= len(ids) - 1
    drop_rows(table, ids)
    assert mapped_pages(table) == 0
    assert np.array_equal(table[ids], rows)   # the contents come back from the file


def test_rows_near_each_other_give_their_window_back_once(table, monkeypatch):
    """Rows 1500 and 1501 lie in one 2 MiB window (or two that touch), 7 and 3000 each in one of
    their own, far from the others: three calls."""
    calls = []
    monkeypatch.setattr(gguf_file, "_libc", type("Libc", (), {"madvise": lambda self, at, size, advice: calls.append(
        (at.value, size.value))})())
    drop_rows(table, np.array([3000, 1501, 7, 1500]))
    assert len(calls) == 3 and [a for a, _ in calls] == sorted(a for a, _ in calls)
    assert all(a % 4096 == 0 and n % 4096 == 0 and n > 0 for a, n in calls)


def test_an_embedding_that_gives_pages_back_reads_the_same_rows(monkeypatch):
    m = Model(GGUFFile(need(FIXTURES / "tiny-llama-q8_0.gguf")), NumpyBackend("quantized"))
    table, ids = m.w["token_embd.weight"], np.array([5, 3, 5, 200, 17, 9, 1, 2, 3, 4, 11], np.int32)
    want = m.backend.embed(table, ids)
    monkeypatch.setattr(numpy_backend, "DROP_ROWS_BYTES", 0)
    assert np.array_equal(m.backend.embed(table, ids), want)
