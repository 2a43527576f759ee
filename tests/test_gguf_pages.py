"""What a model keeps of its GGUF file's memory map: pages read once are given back, and an
embedding table's rows read during generation do not stay mapped with their neighbours."""

import struct

import numpy as np
import pytest

from llogos_cli.backends.cpu import numpy_backend
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


def test_an_embedding_that_gives_pages_back_reads_the_same_rows(monkeypatch):
    m = Model(GGUFFile(need(FIXTURES / "tiny-llama-q8_0.gguf")), NumpyBackend("quantized"))
    table, ids = m.w["token_embd.weight"], np.array([5, 3, 5, 200, 17, 9, 1, 2, 3, 4, 11], np.int32)
    want = m.backend.embed(table, ids)
    monkeypatch.setattr(numpy_backend, "DROP_ROWS_BYTES", 0)
    assert np.array_equal(m.backend.embed(table, ids), want)
