"""Token ids back to bytes and text, the way llama.cpp's token_to_piece renders each token.

A token's bytes need not be whole UTF-8 characters (byte-level BPE tokens and <0xXX> byte
tokens often hold part of one), so text is only produced from the concatenated bytes; the
StreamDecoder does this incrementally while tokens are generated.
"""

import codecs
from enum import IntEnum

SPM_SPACE = "\u2581"  # SentencePiece writes spaces as ▁ inside tokens


class TokenType(IntEnum):
    """GGUF tokenizer.ggml.token_type values."""
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


def _gpt2_byte_alphabet() -> dict[str, int]:
    """GPT-2's map from the printable character standing for each byte back to the byte."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    alphabet = {chr(b): b for b in printable}
    alphabet.update({chr(0x100 + n): b for n, b in enumerate(others)})
    return alphabet


GPT2_BYTES = _gpt2_byte_alphabet()


def _byte_level_bytes(text: str) -> bytes:
    out = bytearray()
    for ch in text:
        if ch in GPT2_BYTES:
            out.append(GPT2_BYTES[ch])
        else:
            # What llama.cpp emits for a character outside the byte alphabet (broken vocabularies).
            out += f"[UNK_BYTE_0x{ch.encode().hex()}{text}]".encode()
    return bytes(out)


def piece_bytes(text: str, token_type: int, spm: bool) -> bytes:
    """The bytes llama.cpp's token_to_piece gives a token when special tokens are shown."""
    if token_type in (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.USER_DEFINED):
        return text.encode()
    if token_type == TokenType.NORMAL:
        return text.replace(SPM_SPACE, " ").encode() if spm else _byte_level_bytes(text)
    if token_type == TokenType.BYTE:
        return bytes([int(text[3:5], 16)])  # "<0xAB>"
    return b""  # unused and undefined tokens render as nothing


def is_hidden(token_type: int) -> bool:
    """Control and unknown tokens render empty unless special tokens are asked for."""
    return token_type in (TokenType.CONTROL, TokenType.UNKNOWN)


def display(piece: bytes) -> str:
    """A piece as text; bytes that are only part of a character are shown as \\xNN escapes."""
    return piece.decode("utf-8", errors="backslashreplace")


class StreamDecoder:
    """Turns a stream of token ids into text, holding back incomplete UTF-8 characters."""

    def __init__(self, tok, special: bool = False):
        self._tok = tok
        self._special = special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text completed by this token (possibly "")."""
        return self._utf8.decode(self._tok.token_bytes(token_id, self._special))

    def flush(self) -> str:
        """Whatever is held back, with an unfinished character replaced by U+FFFD."""
        return self._utf8.decode(b"", final=True)
