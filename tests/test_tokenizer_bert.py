"""BERT's WordPiece ("bert" vocabularies), held to llama.cpp's llama-tokenize on
tests/fixtures/vocab-bert.gguf: a BERT vocabulary cut to the tokens of its texts' words, which
tokenizes them as the whole of it does (see tests/fixtures/make_bert_vocab.py). The texts cover
digits, whitespace and control characters, accents (stripped and lowercased), CJK and emoji
(unknown to this vocabulary), code, words split into pieces, and BERT's own special tokens."""

import pytest

from llogos_cli.tokenizer.tokenizer import Tokenizer
from llogos_cli.tokenizer.wordpiece import words
from tests.vocab_fixtures import cases, llogos_tokenize, tokenizer

PAIRS = cases("bert")


@pytest.fixture(scope="module")
def bert() -> Tokenizer:
    return tokenizer("bert")


@pytest.mark.parametrize("text, ids", PAIRS, ids=[text[:20] for text, _ in PAIRS])
def test_ids_equal_llama_tokenize(bert, text, ids):
    assert bert.encode(text, add_bos=False) == ids


def test_special_tokens_wrap_the_text_in_cls_and_sep(bert):
    ids = bert.encode("Hello world")
    assert ids[0] == bert.token_id("[CLS]") and ids[-1] == bert.token_id("[SEP]")
    assert ids[1:-1] == bert.encode("Hello world", add_bos=False)


def test_pieces_read_back_as_lowercased_words(bert):
    """Every word, punctuation marks too, begins with ▁: llama.cpp's pieces show a space before each."""
    assert bert.decode(bert.encode("Hello, Wörld!", add_bos=False)) == " hello , world !"
    unaffable = bert.encode("unaffable", add_bos=False)
    assert len(unaffable) > 1 and bert.decode(unaffable) == " unaffable"


def test_words_are_cut_as_bert_cuts_them():
    assert words("Héllo,world  日本 a\u200bb\x00c 한국") == ["hello", ",", "world", "日", "本", "abc", "\u1112\u1100"]
    assert words("Héllo", lowercase=False, strip_accents=False) == ["Héllo"]


def test_a_word_no_tokens_cover_is_unknown(bert):
    assert bert.encode("😀", add_bos=False) == [bert.token_id("[UNK]")]


def test_llogos_tokenize_reads_the_vocabulary_only_file(tmp_path):
    text, ids = PAIRS[4]   # accents
    assert llogos_tokenize("bert", tmp_path, "--no-bos", text) == ids
