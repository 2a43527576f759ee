"""o200k, gpt-oss's tokenizer (llama.cpp's "gpt-4o" pre-tokenizer), held to llama.cpp's
llama-tokenize on tests/fixtures/vocab-o200k.gguf: o200k cut to the tokens of its texts, which
tokenizes them as the whole vocabulary does (see tests/fixtures/make_o200k_vocab.py). The texts
cover digits, whitespace runs, accents (upper and lower case beside each other), CJK, emoji, code
and gpt-oss's chat markers."""

import pytest

from llogos_cli.gguf.file import GGUFFile
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.vocab_fixtures import FIXTURES, cases, llogos_tokenize, tokenizer

PAIRS = cases("o200k")


@pytest.fixture(scope="module")
def o200k() -> Tokenizer:
    return tokenizer("o200k")


@pytest.mark.parametrize("text, ids", PAIRS, ids=[text[:20] for text, _ in PAIRS])
def test_ids_equal_llama_tokenize(o200k, text, ids):
    assert o200k.encode(text) == ids


@pytest.mark.parametrize("text, ids", PAIRS, ids=[text[:20] for text, _ in PAIRS])
def test_ids_decode_to_the_text(o200k, text, ids):
    assert o200k.decode(ids, special=True) == text


def test_chat_markers_are_always_tokens_and_control_tokens_only_when_parsed(o200k):
    """As llama-tokenize --no-parse-special: llama.cpp makes gpt-oss's markers user-defined tokens,
    which are always matched, while <|endoftext|> and <|return|> are then spelled out."""
    markers, controls = "<|start|>user<|message|>hi<|end|>", "<|endoftext|><|return|>"
    plain = o200k.encode(markers + controls, parse_special=False)
    assert plain[:5] == o200k.encode(markers) and [o200k.piece(i) for i in (plain[0], plain[2], plain[4])] == [
        "<|start|>", "<|message|>", "<|end|>"]
    assert o200k.decode(plain[5:]) == controls and len(plain) == 5 + 13
    assert len(o200k.encode(markers + controls)) == 7


def test_other_pre_tokenizers_cut_these_texts_differently(o200k):
    """The ids depend on the gpt-4o split: under GPT-2's regex the same vocabulary gives others."""
    f = GGUFFile(FIXTURES / "vocab-o200k.gguf")
    gpt2 = Tokenizer({**f.meta, "tokenizer.ggml.pre": "gpt-2"}, f.header_sha256 + "-gpt2")
    assert o200k.add_bos is False and sum(gpt2.encode(text) != ids for text, ids in PAIRS) >= 4


def test_llogos_tokenize_reads_the_vocabulary_only_file(tmp_path):
    """`llogos tokenize` on the tensorless file prints llama-tokenize's ids, as a JSON list."""
    text, ids = PAIRS[5]   # CJK
    assert llogos_tokenize("o200k", tmp_path, text) == ids
