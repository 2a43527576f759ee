"""A bounded walk over a GGUF header that rejects what the `gguf` package's reader would choke on.

The reader trusts every count and length it reads: an array that claims 2**63 elements loops
forever appending empty views once it runs past the end of the file, and dimensions whose product
overflows 64 bits wrap to a small size. This walk checks each count and length against the bytes
that are left before anything is built from it, and each tensor's type, shape, offset and extent
against the file, so that whatever reaches the reader is small and consistent.
"""

import math
import mmap
import struct
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from llogos_cli.errors import LlogosError

_SCALAR_BYTES = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.UINT16: 2,
                 GGUFValueType.INT16: 2, GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4,
                 GGUFValueType.FLOAT32: 4, GGUFValueType.BOOL: 1, GGUFValueType.UINT64: 8,
                 GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8}
_MIN_BYTES = {**_SCALAR_BYTES, GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}
_MIN_ENTRY = 8 + 4 + 1         # key length, value type, smallest value
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8  # name length, dimension count, type, offset
_MAX_DIMS = 4                  # ggml's GGML_MAX_DIMS
_DEFAULT_ALIGNMENT = 32


def printable(text: str) -> str:
    """Text from a file, fit for a one-line message: quoted and escaped if it holds control characters."""
    return text if text.isprintable() else repr(text)


def check_layout(path: Path) -> None:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        _Walk(path, buf).header()


class _Walk:
    def __init__(self, path: Path, buf):
        self.path, self.buf, self.pos = path, buf, 0

    def fail(self, what: str):
        raise LlogosError(f"{self.path} is not a valid GGUF file ({what})")

    def take(self, n: int, what: str) -> int:
        left = len(self.buf) - self.pos
        if n > left:
            self.fail(f"{what} at byte {self.pos:,} needs {n:,} bytes but {left:,} are left")
        start, self.pos = self.pos, self.pos + n
        return start

    def unpack(self, fmt: str, what: str) -> tuple:
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt), what))

    def count(self, n: int, min_bytes: int, what: str) -> None:
        # Each element needs at least min_bytes, so a count the rest of the file cannot hold is corrupt.
        self.take(0, what)
        if n * min_bytes > len(self.buf) - self.pos:
            self.fail(f"{n:,} {what} cannot fit in the {len(self.buf) - self.pos:,} bytes left at byte {self.pos:,}")

    def string(self, what: str) -> bytes:
        (n,) = self.unpack("<Q", what)
        return bytes(self.buf[self.take(n, what):self.pos])

    def header(self) -> None:
        _, version = self.unpack("<4sI", "header")
        if version & 0xFFFF == 0:
            self.fail("big-endian files are not supported")
        if version not in (2, 3):
            self.fail(f"GGUF version {version}; versions 2 and 3 are supported")
        n_tensors, n_entries = self.unpack("<QQ", "header")
        self.count(n_entries, _MIN_ENTRY, "metadata entries")
        alignment = _DEFAULT_ALIGNMENT
        for _ in range(n_entries):
            key = self.string("metadata key")
            (vtype,) = self.unpack("<I", "type of a metadata value")
            if key == b"general.alignment":
                if vtype != GGUFValueType.UINT32:
                    self.fail("general.alignment is not a uint32")
                (alignment,) = self.unpack("<I", "general.alignment")
                if alignment == 0 or alignment & (alignment - 1):
                    self.fail(f"general.alignment {alignment} is not a power of two")
            else:
                self.value(vtype, printable(key.decode("utf-8", "replace")), nested=False)
        self.count(n_tensors, _MIN_TENSOR_INFO, "tensor infos")
        tensors = [self.tensor_info() for _ in range(n_tensors)]
        data_start = -(-self.pos // alignment) * alignment
        for name, offset, nbytes in tensors:
            if offset % alignment:
                self.fail(f"tensor {name} starts at offset {offset:,}, not a multiple of the alignment {alignment}")
            if data_start + offset + nbytes > len(self.buf):
                self.fail(f"tensor {name} ends at byte {data_start + offset + nbytes:,}, "
                          f"the file has {len(self.buf):,}: truncated")

    def value(self, vtype: int, key: str, nested: bool) -> None:
        if vtype in _SCALAR_BYTES:
            self.take(_SCALAR_BYTES[vtype], key)
        elif vtype == GGUFValueType.STRING:
            self.take(self.unpack("<Q", key)[0], key)
        elif vtype == GGUFValueType.ARRAY:
            itype, n = self.unpack("<IQ", key)
            if itype not in _MIN_BYTES or (nested and itype == GGUFValueType.ARRAY):
                self.fail(f"{key} is an array of value type {itype}, which is unknown or nested too deep")
            self.count(n, _MIN_BYTES[itype], f"elements of {key}")
            if itype in _SCALAR_BYTES:
                self.take(n * _SCALAR_BYTES[itype], key)
            else:
                for _ in range(n):
                    self.value(itype, key, nested=True)
        else:
            self.fail(f"{key} has unknown value type {vtype}")

    def tensor_info(self) -> tuple[str, int, int]:
        name = printable(self.string("tensor name").decode("utf-8", "replace"))
        (n_dims,) = self.unpack("<I", f"tensor {name}")
        if not 1 <= n_dims <= _MAX_DIMS:
            self.fail(f"tensor {name} has {n_dims} dimensions (1 to {_MAX_DIMS} are possible)")
        dims = self.unpack(f"<{n_dims}Q", f"tensor {name}")
        type_id, offset = self.unpack("<IQ", f"tensor {name}")
        try:
            qtype = GGMLQuantizationType(type_id)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            self.fail(f"tensor {name} has unknown type id {type_id}")
        if min(dims) < 1 or dims[0] % block:
            self.fail(f"tensor {name} has shape {list(dims)}, which {qtype.name} blocks of {block} cannot hold")
        # Python integers do not wrap: a product past the file's size is caught by the extent check.
        return name, offset, math.prod(dims) // block * type_size
