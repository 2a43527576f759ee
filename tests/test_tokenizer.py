"""Tokenizer tests. llama.cpp is the oracle: the reference files in ../shared hold its ids and
pieces for the two real models, and the ids written out below were produced by llama.cpp
(llama-cpp-python 0.3.36) on the same vocabularies."""

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.tokenizer.tokenizer import StreamDecoder, Tokenizer
from tests.conftest import FIXTURES, REFERENCE, model_path, need, reference

MODELS = ("smollm2-135m", "gemma3-270m")


@pytest.fixture(scope="module")
def gguf():
    return {name: GGUFFile(model_path(name)) for name in MODELS}


@pytest.fixture(scope="module")
def tok(gguf):
    return {name: Tokenizer.from_gguf(f) for name, f in gguf.items()}


@pytest.fixture(scope="module")
def tiny_gguf():
    return GGUFFile(need(FIXTURES / "tiny-llama-f32.gguf"))


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    return Tokenizer.from_gguf(tiny_gguf)


def _reference_cases():
    cases = []
    for name in MODELS:
        path = REFERENCE / f"{name}.json"
        if not path.exists():
            skip = pytest.mark.skip(f"reference data not present: {path}")
            cases.append(pytest.param(name, None, marks=skip))
            continue
        entries = json.loads(path.read_text())["tokenization"]
        cases += [pytest.param(name, e, id=f"{name}-{k}") for k, e in enumerate(entries)]
    return cases


# ---- agreement with llama.cpp -----------------------------------------------------------------

@pytest.mark.parametrize("name, entry", _reference_cases())
def test_reference_tokenization(tok, name, entry):
    t = tok[name]
    assert t.encode(entry["text"]) == entry["ids"]
    assert t.encode(entry["text"], parse_special=False) == entry["ids_no_parse_special"]
    for token_id, piece in zip(entry["ids"], entry["pieces"], strict=True):
        if isinstance(piece, str):
            assert t.piece(token_id) == piece
        else:  # a piece that is not whole UTF-8 characters is stored as its bytes
            assert t.token_bytes(token_id, special=True) == bytes(piece)


@pytest.mark.parametrize("name", MODELS)
def test_reference_prompts_and_vocab_facts(tok, name):
    ref, t = reference(name), tok[name]
    for g in ref["generation"]:
        assert t.encode(g["prompt"]) == g["prompt_ids"], g["prompt"]
    meta = ref["metadata"]
    assert t.n_vocab == meta["n_vocab"]
    assert (t.bos_id, t.piece(t.bos_id)) == tuple(meta["bos"])
    assert (t.eos_id, t.piece(t.eos_id)) == tuple(meta["eos"])
    assert t.eog_ids == frozenset(meta["eog_ids"])
    assert t.add_bos is meta["add_bos_token"]


LLAMA_CPP_IDS = [
    # 40 spaces: the 31-space token is split out first, then the 9-space one.
    ("gemma3-270m", " " * 40 + "x", True, [2, 167, 145, 236781]),
    # characters outside Gemma's vocabulary fall back to byte tokens
    ("gemma3-270m", "𠀋𪚥 rare", True, [2, 478, 398, 366, 377, 478, 408, 392, 403, 8401]),
    ("gemma3-270m", "<start_of_turn>user", True, [2, 105, 2364]),
    ("gemma3-270m", "<start_of_turn>user", False, [2, 236820, 3041, 236779, 1340, 236779, 887, 236813, 2364]),
    # </s> ends generation, so llama.cpp makes it a control token: split out only when parsing
    # special tokens. <b> is user-defined: always split out.
    ("gemma3-270m", "a</s>b<b>c</b>", True, [2, 236746, 212, 236763, 200, 236755, 209]),
    ("gemma3-270m", "a</s>b<b>c</b>", False, [2, 236746, 954, 236751, 236813, 236763, 200, 236755, 209]),
    ("smollm2-135m", "<|im_start|>user\nHi<|im_end|>\n", True, [1, 4093, 198, 26843, 2, 198]),
    ("smollm2-135m", "<|im_start|>user\nHi<|im_end|>\n", False,
     [44, 108, 306, 79, 3738, 108, 46, 4093, 198, 26843, 44, 108, 306, 79, 486, 108, 46, 198]),
    # U+4BABA starts with byte F1, which has no token: it still keeps ∞'s last byte from merging
    # with the byte after it, and is then dropped.
    ("smollm2-135m", "∞\U0004baba", True, [22052, 248, 229, 120, 135]),
]


@pytest.mark.parametrize("name, text, parse_special, ids", LLAMA_CPP_IDS)
def test_llama_cpp_ids(tok, name, text, parse_special, ids):
    assert tok[name].encode(text, parse_special=parse_special) == ids


# SmolLM2's vocabulary under other pre-tokenizers; only tokenizer.ggml.pre differs.
PRE_TOKENIZER_IDS = {
    "gpt-2": [8049, 33635, 10740, 506, 1792, 32657, 33, 43, 253, 28, 82, 30, 83, 17, 47, 35612, 16284, 23,
              67, 201, 14436, 216, 1112, 216, 34, 32, 34, 36, 3351, 138],
    "default": [8049, 33635, 10740, 23, 99, 1792, 32657, 33, 43, 253, 28, 82, 30, 83, 17, 47, 35612, 16284,
                23, 67, 201, 14436, 216, 1112, 216, 34, 32, 34, 36, 216, 16738],
    "llama-bpe": [8049, 33635, 10740, 506, 1792, 32657, 33, 43, 253, 28, 82, 30, 83, 17, 47, 35612, 16284,
                  23, 67, 201, 1116, 197, 216, 1112, 216, 34, 32, 34, 36, 216, 16738],
    "qwen2": [8049, 33635, 10740, 506, 1792, 32657, 33, 43, 253, 28, 82, 30, 83, 17, 47, 35612, 16284, 23,
              67, 201, 1116, 197, 216, 1112, 216, 34, 32, 34, 36, 216, 16738],
    "falcon": [8049, 33635, 10740, 23, 99, 1792, 32657, 33, 43, 253, 28, 82, 30, 83, 17, 47, 35612, 16284,
               23, 67, 201, 14436, 216, 1112, 216, 34, 32, 34, 36, 3351, 138],
    "smollm": [8049, 33635, 10740, 506, 1792, 32657, 33, 43, 253, 28, 82, 30, 83, 17, 47, 35612, 16284, 23,
               67, 201, 14436, 216, 1112, 216, 34, 32, 34, 36, 216, 16738],
    "bloom": [8049, 33635, 10740, 506, 1792, 32657, 33, 43, 253, 28, 82, 30, 83, 17, 47, 35612, 16284, 23,
              67, 201, 14436, 216, 1112, 216, 34, 32, 34, 36, 3351, 138],
    "gpt-4o": [8049, 33635, 10740, 506, 1792, 32657, 33, 43, 253, 28, 82, 30, 83, 17, 47, 35612, 16284, 23,
               67, 201, 1116, 197, 216, 1112, 216, 34, 32, 34, 36, 216, 16738],
    "deepseek-llm": [8049, 33635, 10740, 23, 99, 1792, 32657, 33, 43, 253, 28, 82, 30, 83, 17, 47, 35612, 16284,
                     23, 67, 201, 198, 198, 197, 216, 1112, 216, 34, 32, 34, 36, 216, 16738],
    "deepseek-coder": [8049, 33635, 10740, 23, 99, 1792, 32657, 33, 43, 253, 28, 82, 30, 83, 17, 47, 35612, 16284,
                       23, 67, 201, 198, 198, 197, 216, 1112, 216, 34, 32, 34, 36, 216, 16738],
}


@pytest.mark.parametrize("pre", PRE_TOKENIZER_IDS)
def test_pre_tokenizers(gguf, pre):
    f = gguf["smollm2-135m"]
    t = Tokenizer({**f.meta, "tokenizer.ggml.pre": pre}, f.header_sha256)
    text = "HTTPServer's x+=1; a,b.c!? WORLD'S\r\n\n\t  end 2024 ½"
    assert t.encode(text) == PRE_TOKENIZER_IDS[pre]


def test_add_bos_defaults_follow_llama_cpp(gguf):
    meta = {k: v for k, v in gguf["smollm2-135m"].meta.items() if k != "tokenizer.ggml.add_bos_token"}
    assert Tokenizer({**meta, "tokenizer.ggml.pre": "llama-bpe"}, "x").add_bos is True
    assert Tokenizer({**meta, "tokenizer.ggml.pre": "qwen2"}, "x").add_bos is False


# ---- decoding ---------------------------------------------------------------------------------

STREAM_TEXT = "naïve café, 日本語のテキスト, emoji 😀🎉👍🏽 ❤️ and rare 𠀋𪚥!"


@pytest.mark.parametrize("name", MODELS)
def test_stream_decoder_never_splits_a_character(tok, name):
    t = tok[name]
    ids = t.encode(STREAM_TEXT)
    # The test only means something if some tokens hold part of a character.
    assert any(not _is_utf8(t.token_bytes(i)) for i in ids)
    decoder = StreamDecoder(t)
    outputs = [decoder.push(i) for i in ids]
    outputs.append(decoder.flush())
    assert "".join(outputs) == t.decode(ids) == STREAM_TEXT
    assert "" in outputs[:-1]  # something was held back until its character was complete
    assert not any("\ufffd" in out for out in outputs)


def test_stream_decoder_hides_control_tokens_unless_special(tok):
    t = tok["gemma3-270m"]
    ids = t.encode("<start_of_turn>user\nhi<end_of_turn>")
    assert ids[:2] == [t.bos_id, t.token_id("<start_of_turn>")]
    hidden, shown = StreamDecoder(t), StreamDecoder(t, special=True)
    assert "".join(hidden.push(i) for i in ids) + hidden.flush() == "user\nhi"
    assert "".join(shown.push(i) for i in ids) + shown.flush() == "<bos><start_of_turn>user\nhi<end_of_turn>"
    assert t.decode(ids) == "user\nhi"
    assert t.decode(ids, special=True) == "<bos><start_of_turn>user\nhi<end_of_turn>"


def test_flush_replaces_an_unfinished_character(tok):
    t = tok["gemma3-270m"]
    first_byte = t.encode("𠀋", add_bos=False)[0]
    assert t.token_bytes(first_byte) == b"\xf0"
    decoder = StreamDecoder(t)
    assert decoder.push(first_byte) == ""
    assert decoder.flush() == "\ufffd"
    assert t.decode([first_byte]) == "\ufffd"


def test_piece_shows_partial_characters_as_escapes(tok):
    t = tok["smollm2-135m"]
    ids = t.encode("😀")
    assert [t.token_bytes(i) for i in ids] == [b"\xf0\x9f", b"\x98", b"\x80"]
    assert [t.piece(i) for i in ids] == ["\\xf0\\x9f", "\\x98", "\\x80"]


ROUND_TRIP = ["Hello world", "  leading and trailing  ", "tabs\tand\nnew\n\nlines\r\n",
              "naïve café résumé Straße", "日本語のテキストと中文文本", "emoji 😀🎉👍🏽 ❤️ 🇯🇵 👨‍👩‍👧‍👦",
              "def f(x):\n    return x ** 2  # square\n", "3.14159 and 1,000,000 and 12345678901234",
              "don't WON'T it's I'M we'll", "Ελληνικά, русский, العربية, हिन्दी, ไทย", "", " ", "\n"]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(tok, tiny, text):
    for t in (*tok.values(), tiny):
        assert t.decode(t.encode(text)) == text
        assert t.decode(t.encode(text, add_bos=False, parse_special=False)) == text


# ---- threads ----------------------------------------------------------------------------------

def _varied_texts(n: int) -> list[str]:
    """Distinct texts whose characters differ from one to the next, so that a tokenizer which
    learns its characters as it goes meets new ones in every thread."""
    extras = ["", "é", "ß", "日本", "😀", "Ω", "ñ", "中文", "🇯🇵", "ü", "한국어", "№"]
    return [f"Fact number {i}: the {extras[i % len(extras)]}{i * 7919} {ROUND_TRIP[i % 8]}" for i in range(n)]


@pytest.mark.parametrize("name", MODELS)
def test_threads_encode_as_one_thread_does(gguf, name):
    texts = _varied_texts(48)
    expected = [Tokenizer.from_gguf(gguf[name]).encode(t) for t in texts]
    for _ in range(3):   # each round on a cold tokenizer, every thread starting at once
        fresh = Tokenizer.from_gguf(gguf[name])
        start = threading.Barrier(len(texts))

        def encode(text, t=fresh, start=start):
            start.wait()
            return t.encode(text)
        with ThreadPoolExecutor(len(texts)) as pool:
            assert list(pool.map(encode, texts)) == expected
        assert [fresh.encode(t) for t in texts] == expected   # and it stays right afterwards
        decoded = [fresh.decode(ids) for ids in expected]
        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(fresh.decode, expected)) == decoded


# ---- lookups and errors -----------------------------------------------------------------------

def test_token_id(tok):
    assert tok["smollm2-135m"].token_id("<|im_end|>") == 2
    assert tok["gemma3-270m"].token_id("<end_of_turn>") == 106
    assert tok["gemma3-270m"].token_id("no such token anywhere") is None


def test_out_of_range_ids_are_user_errors(tiny):
    for bad in (tiny.n_vocab, -1):
        with pytest.raises(LlogosError, match="outside the vocabulary"):
            tiny.token_bytes(bad)
    with pytest.raises(LlogosError, match="outside the vocabulary"):
        tiny.decode([5, tiny.n_vocab])
    with pytest.raises(LlogosError, match="outside the vocabulary"):
        StreamDecoder(tiny).push(tiny.n_vocab + 7)


def test_text_that_is_not_unicode_is_a_user_error(tiny):
    with pytest.raises(LlogosError, match="not valid Unicode"):
        tiny.encode("abc\udcff")


def test_unsupported_vocabularies_are_named(tiny_gguf):
    f = tiny_gguf
    with pytest.raises(LlogosError, match="'no-such-pre'"):
        Tokenizer({**f.meta, "tokenizer.ggml.pre": "no-such-pre"}, f.header_sha256)
    with pytest.raises(LlogosError, match="'ugm'"):   # T5's Unigram, which llogos does not read
        Tokenizer({**f.meta, "tokenizer.ggml.model": "ugm"}, f.header_sha256)


def test_merges_are_cached_by_header(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("LLOGOS_CACHE", str(tmp_path))
    f = tiny_gguf
    text = "the other thing"
    ids = Tokenizer.from_gguf(f).encode(text)
    [cached] = (tmp_path / "tokenizer").iterdir()
    assert cached.name.startswith(f.header_sha256[:32])
    assert Tokenizer.from_gguf(f).encode(text) == ids
    # A warm start reads the cache: with no merges there, every byte is its own token.
    with np.load(cached) as tables:
        chars, starts = tables["chars"], tables["starts"]
    np.savez(cached, merges=np.zeros((0, 3), dtype=np.int32), chars=chars, starts=starts)
    assert len(Tokenizer.from_gguf(f).encode(text)) == len(text.encode())
    # A damaged cache is rebuilt.
    for damaged in (cached.read_bytes()[:200], b"\x00garbage"):
        cached.write_bytes(damaged)
        assert Tokenizer.from_gguf(f).encode(text) == ids


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
