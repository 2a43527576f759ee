"""Open a GGUF file: metadata, tensor directory, and memory-mapped tensor bytes.

Parsing is done by the `gguf` package, after layout.py has checked every count, length and
tensor extent in the header against the file (the reader trusts them). The reader walks every
element of every metadata array through numpy memmap slices, which takes ~10 s for a 262k-token
vocabulary, so the parsed header is cached as JSON, keyed by the SHA-256 of the header bytes it
was parsed from.
Tensor data is never read here: `raw()` returns views into a read-only memory map.
"""

import ctypes
import hashlib
import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader

from llogos_cli.errors import LlogosError
from llogos_cli.gguf.layout import check_layout, printable
from llogos_cli.paths import optional_cache_dir

_PROBE_BYTES = 1 << 20
_CACHE_VERSION = 1


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order: (..., rows, cols); GGUF lists it reversed (ne0 first)
    offset: int  # absolute byte offset of the data in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return self.ggml_type.name


class GGUFFile:
    def __init__(self, path: str | os.PathLike, mmap: bool = True):
        """mmap=False reads the whole file into memory instead of mapping it (llama.cpp's --no-mmap)."""
        self.path = Path(path)
        if not self.path.is_file():
            raise LlogosError(f"model file not found: {self.path}")
        self.size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(_PROBE_BYTES)
        if head[:4] != b"GGUF":
            raise LlogosError(f"{self.path} is not a GGUF file (no GGUF magic at its start)")
        header = _load_cached_header(self.path, self.size, head) or _parse_header(self.path, self.size, head)
        self.header_sha256: str = header["header_sha256"]
        self.meta: dict = header["meta"]
        self.tensors: dict[str, TensorInfo] = {
            t["name"]: TensorInfo(t["name"], GGMLQuantizationType(t["type"]), tuple(t["shape"]),
                                  t["offset"], t["nbytes"])
            for t in header["tensors"]
        }
        for t in self.tensors.values():
            if t.offset + t.nbytes > self.size:
                raise LlogosError(f"{self.path} is truncated: tensor {printable(t.name)} ends at byte "
                                  f"{t.offset + t.nbytes}, the file has {self.size} bytes")
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r") if mmap else np.fromfile(self.path, np.uint8)

    @property
    def arch(self) -> str:
        return self.meta.get("general.architecture", "?")

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes of a tensor as a uint8 view shaped (rows, bytes per row)."""
        t = self.tensors[name]
        rows = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
        return self._data[t.offset:t.offset + t.nbytes].reshape(rows, t.nbytes // rows)


def drop_pages(view: np.ndarray) -> None:
    """Give back this process's pages of a view into a GGUF file's memory map that it will no longer
    read (they stay in the page cache, and come back if it does): a matrix copied at load time then
    counts once in the resident memory, not twice. Whole pages inside the view only; anything that is
    not a file-backed map is left alone (dropping an anonymous page would zero it)."""
    if not isinstance(view, np.memmap) or getattr(view, "_mmap", None) is None:
        return
    start = view.ctypes.data
    first, last = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, (start + view.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        advise(first, last, mmap.MADV_DONTNEED)


def drop_rows(view: np.ndarray, ids: np.ndarray) -> None:
    """drop_pages for the rows of a view just read (a tied embedding table's, say): a page fault maps
    the whole large folio of the page cache around the page, up to _FOLIO bytes, so each row read
    brought back up to that much (docs/PERF.md, "Figures behind choices in the code"). The windows
    around the rows go, whole pages within the view only, each window once (rows near each other
    share theirs)."""
    if not isinstance(view, np.memmap) or getattr(view, "_mmap", None) is None:
        return
    start, end, row = view.ctypes.data, view.ctypes.data + view.nbytes, view.strides[0]
    low, high = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
    windows = []   # (first, last) in address order, overlapping ones merged
    for i in np.unique(ids):
        at = start + int(i) * row
        first, last = max(at // _FOLIO * _FOLIO, low), min(-(-(at + row) // _FOLIO) * _FOLIO, high)
        if windows and first <= windows[-1][1]:
            windows[-1][1] = max(windows[-1][1], last)
        elif last > first:
            windows.append([first, last])
    for first, last in windows:
        advise(first, last, mmap.MADV_DONTNEED)


def advise(first: int, last: int, advice: int) -> None:
    """madvise(2) on this process's addresses first..last (page-aligned); a refusal is ignored."""
    _libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), advice)


_FOLIO = 2 << 20   # the largest folio the page cache maps at once (a huge page)
_libc = ctypes.CDLL(None, use_errno=True)


def _cache_path(size: int, head: bytes) -> Path | None:
    folder = optional_cache_dir("gguf")
    probe = hashlib.sha256(size.to_bytes(8, "little") + head).hexdigest()
    return folder / f"{probe[:32]}.json" if folder else None


def _load_cached_header(path: Path, size: int, head: bytes) -> dict | None:
    cached = _cache_path(size, head)
    if cached is None:
        return None
    try:
        header = json.loads(cached.read_text())
        if header.get("version") != _CACHE_VERSION:
            return None
        with open(path, "rb") as f:
            if hashlib.sha256(f.read(header["header_len"])).hexdigest() != header["header_sha256"]:
                return None
        return header
    except (OSError, ValueError, KeyError):
        return None


def _parse_header(path: Path, size: int, head: bytes) -> dict:
    check_layout(path)
    try:
        reader = GGUFReader(path, "r")
        meta = {name: _plain(field.contents()) for name, field in reader.fields.items()}
        tensors = [{"name": t.name, "type": int(t.tensor_type),
                    "shape": [int(n) for n in reversed(t.shape.tolist())],
                    "offset": int(t.data_offset), "nbytes": int(t.n_bytes)} for t in reader.tensors]
        header_len = int(reader.data_offset)
    except (ValueError, KeyError, IndexError, OSError, UnicodeDecodeError, OverflowError) as e:
        raise LlogosError(f"{path} is not a valid GGUF file (truncated or corrupt: {printable(str(e))})") from None
    with open(path, "rb") as f:
        header_sha256 = hashlib.sha256(f.read(header_len)).hexdigest()
    header = {"version": _CACHE_VERSION, "header_len": header_len, "header_sha256": header_sha256,
              "meta": meta, "tensors": tensors}
    target = _cache_path(size, head)
    if target is None:
        return header
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(header))
        os.replace(tmp, target)
    except OSError:
        tmp.unlink(missing_ok=True)
    return header


def _plain(value):
    """GGUF field contents as JSON-able Python values (numpy scalars become ints/floats)."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
