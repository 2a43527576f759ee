"""Text the user hands llogos, from a file or from stdin, read as UTF-8 the same way from both.

Python decodes stdin with the locale's error handler: strictly under most locales (a traceback), with
surrogate escapes under C.UTF-8 (an error from deep in the tokenizer). Reading the bytes and decoding
them here gives one error, naming where the text came from and where it stops being UTF-8.
"""

import sys
from pathlib import Path

from llogos_cli.errors import LlogosError


def read_file(path: Path, what: str) -> str:
    """The file's text; `what` names it in errors ("prompt file")."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise LlogosError(f"cannot read {what} {path}: {e.strerror or e}") from None
    return _decode(data, f"{what} {path}")


def read_stdin(what: str) -> str:
    """All of stdin's text; `what` names it in errors ("the message")."""
    return _decode(sys.stdin.buffer.read(), f"{what} on stdin")


def _decode(data: bytes, where: str) -> str:
    try:   # newlines as Python's text mode gives them, which is how these were read before
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as e:
        raise LlogosError(f"{where} is not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} "
                          "cannot be decoded") from None
