"""Gemma 4's tokenizer ("gemma4": BPE over characters with spaces written as ▁, cut only at
newlines, <0xXX> byte fallback), held to llama.cpp's llama-tokenize on
tests/fixtures/vocab-gemma4.gguf: its vocabulary cut to the tokens of its texts, which tokenizes
them as the whole of it does (see tests/fixtures/make_gemma4_vocab.py). The texts cover digits,
whitespace and newline runs, accents, CJK, emoji, code and Gemma 4's chat markers."""

import pytest

from llogos_cli.gguf.file import GGUFFile
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.vocab_fixtures import FIXTURES, cases, llogos_tokenize, tokenizer

PAIRS = cases("gemma4")


@pytest.fixture(scope="module")
def gemma4() -> Tokenizer:
    return tokenizer("gemma4")


@pytest.mark.parametrize("text, ids", PAIRS, ids=[text[:20] for text, _ in PAIRS])
def test_ids_equal_llama_tokenize(gemma4, text, ids):
    assert gemma4.encode(text, add_bos=False) == ids


@pytest.mark.parametrize("text, ids", PAIRS, ids=[text[:20] for text, _ in PAIRS])
def test_ids_decode_to_the_text(gemma4, text, ids):
    assert gemma4.decode(ids, special=True) == text


def test_bos_is_added_whatever_the_file_says(gemma4):
    """llama.cpp adds BOS for Gemma 4 even where the GGUF's add_bos_token is false."""
    f = GGUFFile(FIXTURES / "vocab-gemma4.gguf")
    told_not_to = Tokenizer({**f.meta, "tokenizer.ggml.add_bos_token": False}, f.header_sha256)
    for t in (gemma4, told_not_to):
        assert t.add_bos and t.encode("Hello world")[0] == t.bos_id == t.token_id("<bos>")
    assert gemma4.add_space_prefix is False


def test_a_run_of_newlines_that_is_a_token_is_one_token(gemma4):
    five = gemma4.token_id("\n" * 5)
    assert five is not None and gemma4.encode("\n" * 5, add_bos=False) == [five]


def test_characters_outside_the_vocabulary_fall_back_to_bytes(gemma4):
    """A character none of whose tokens were kept in the cut: its UTF-8 bytes as <0xXX> tokens."""
    ids = gemma4.encode("\u16a0", add_bos=False)   # a rune, in no text of the fixture
    assert ids == [gemma4.token_id(f"<0x{b:02X}>") for b in "\u16a0".encode()]
    assert gemma4.decode(ids) == "\u16a0"


def test_llogos_tokenize_reads_the_vocabulary_only_file(tmp_path):
    text, ids = PAIRS[5]   # CJK
    assert llogos_tokenize("gemma4", tmp_path, "--no-bos", text) == ids
