"""BERT's WordPiece ("bert" vocabularies), as llama.cpp's llm_tokenizer_wpm does it.

The text is normalized and cut into words: when accents are stripped, each code point becomes
the first of its canonical decomposition (é -> e, a Hangul syllable -> its first consonant, as
llama.cpp's table has it) and accent marks are dropped; each is lowercased when asked (both by
default, as BERT's uncased models and llama.cpp do); whitespace ends a word, control characters
vanish, and each punctuation mark, ASCII symbol and CJK ideograph is a word of its own. Each word, written with
a leading ▁ (llama.cpp's converter turns BERT's "##" continuations into plain pieces and marks
word starts with ▁), is then covered greedily by the longest vocabulary tokens from its start;
a word that cannot be covered becomes the unknown token.
"""

import unicodedata

# llama.cpp's whitespace (unicode-data.cpp); Python's isspace() also takes U+001C-U+001F.
_WHITESPACE = frozenset(map(chr, (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                                  0x2028, 0x2029, 0x202F, 0x205F, 0x3000)))
# Code points BERT's tokenizer (and llama.cpp's) takes as CJK ideographs, each a word.
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
WORD_START = "\u2581"


def _alone(c: str, category: str) -> bool:
    """Whether c is a word by itself: punctuation, an ASCII symbol, or a CJK ideograph."""
    cpt = ord(c)
    return category[0] == "P" or (cpt < 0x7F and category[0] == "S") or any(lo <= cpt <= hi for lo, hi in _CJK)


def _lower(c: str) -> str:
    """Unicode's simple (one code point) lowercase mapping, as llama.cpp's table holds it."""
    low = c.lower()
    return low if len(low) == 1 else low[0]


def words(text: str, lowercase: bool = True, strip_accents: bool = True) -> list[str]:
    out, word = [], []
    for c in text:
        if strip_accents:   # llama.cpp's "NFD" maps each code point to its decomposition's first
            c = unicodedata.normalize("NFD", c)[0]
        if c in _WHITESPACE:
            if word:
                out.append("".join(word))
                word = []
            continue
        category = unicodedata.category(c)   # "Cn" (unassigned) is not a control character
        if c in ("\0", "\ufffd") or (category[0] == "C" and category != "Cn") or (strip_accents and category[0] == "M"):
            continue
        alone = _alone(c, category)
        if lowercase:
            c = _lower(c)
        if alone:
            if word:
                out.append("".join(word))
                word = []
            out.append(c)
        else:
            word.append(c)
    if word:
        out.append("".join(word))
    return out


class WordPiece:
    """A "bert" GGUF vocabulary's WordPiece, with the encode() of vocab.SubwordModel."""

    def __init__(self, meta: dict, token_ids: dict[str, int], unk_id: int | None):
        self._ids = token_ids
        self._unk = unk_id
        self._longest = max(map(len, token_ids))
        self._lowercase = bool(meta.get("tokenizer.ggml.normalizer.lowercase", True))
        self._strip_accents = bool(meta.get("tokenizer.ggml.normalizer.strip_accents", self._lowercase))

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [[i for word in words(text, self._lowercase, self._strip_accents) for i in self._word(word)]
                for text in texts]

    def _word(self, word: str) -> list[int]:
        word = WORD_START + word
        ids, i = [], 0
        while i < len(word):
            for j in range(min(len(word), i + self._longest), i, -1):
                token = self._ids.get(word[i:j])
                if token is not None:
                    ids.append(token)
                    i = j
                    break
            else:   # a part no token covers: the whole word is unknown
                return [] if self._unk is None else [self._unk]
        return ids
