"""Text the user hands llogos, from a file or from stdin, read as UTF-8 the same way from both.

Python decodes stdin with the locale's error handler: strictly under most locales (a traceback), with
surrogate escapes under C.UTF-8 (an error from deep in the tokenizer). Reading the bytes and decoding
them here gives one error, naming where the text came from and where it stops being UTF-8.
"""

import sys
from pathlib import Path

from llogos_cli.errors import LlogosError


def read_file(path: Path, what: str, exact: bool = False) -> str:
    """The file's text; `what` names it in errors ("prompt file"). exact keeps every character,
    carriage returns included (what a tokenizer is given)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise LlogosError(f"cannot read {what} {path}: {e.strerror or e}") from None
    return _decode(data, f"{what} {path}", exact)


def read_stdin(what: str, exact: bool = False) -> str:
    """All of stdin's text; `what` names it in errors ("the message")."""
    return _decode(sys.stdin.buffer.read(), f"{what} on stdin", exact)


def _decode(data: bytes, where: str, exact: bool) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LlogosError(f"{where} is not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} "
                          "cannot be decoded") from None
    # Otherwise newlines as Python's text mode gives them, which is how these were read before.
    return text if exact else text.replace("\r\n", "\n").replace("\r", "\n")


# llama.cpp's escapes in command-line text (its --escape, on by default): \xHH is a byte
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}
_HEX = frozenset("0123456789abcdefABCDEF")


def unescape(text: str) -> str:
    """text with llama.cpp's escapes turned into the characters they name; any other backslash,
    an \\x without two hex digits among them, stays as written. \\xHH is one byte, so its bytes
    with the text's must form UTF-8."""
    out = bytearray()
    i = 0
    while i < len(text):
        c, nxt = text[i], text[i + 1:i + 2]
        if c == "\\" and nxt in _ESCAPES:
            out += _ESCAPES[nxt].encode()
            i += 2
        elif c == "\\" and nxt == "x" and len(text) > i + 3 and set(text[i + 2:i + 4]) <= _HEX:
            out.append(int(text[i + 2:i + 4], 16))
            i += 4
        else:
            out += c.encode("utf-8", "surrogateescape")
            i += 1
    return _decode(bytes(out), "the text after its escapes", exact=True)
