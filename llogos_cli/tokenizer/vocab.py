"""Plain text (no special tokens) to token ids with a `tokenizers` BPE, as llama.cpp does it.

llama.cpp has three algorithms for the vocabularies llogos reads:
- "gpt2": byte-level BPE. The text is cut by a list of regexes applied in turn (each splits the
  pieces the previous one left, keeping matches and the text between them), every piece is
  mapped byte by byte onto GPT-2's printable alphabet, and merges apply by rank within a piece.
  That is `tokenizers`' Split(isolated) pre-tokenizers followed by ByteLevel without its regex.
- "llama" (SentencePiece): starting from single characters, repeatedly join the adjacent pair
  whose concatenation is a vocabulary token with the highest score; characters that never
  become tokens fall back to <0xXX> byte tokens. That is a BPE whose merges are every
  (left, right) split of every token into two tokens, ranked by the joined token's score, with
  byte fallback and no pre-tokenizer.
- "gemma4": BPE over characters with ranked merges, as "gpt2" but on the text itself (spaces
  written as ▁) and with <0xXX> byte fallback; the text is cut only at newlines, and a run of
  newlines that is a token is taken whole.

Gemma's 262k tokens give 515k such merges, and `tokenizers` takes about a second to build
that BPE (longer from its own JSON). Merging only ever forms tokens that are substrings of the
text, so the first BPE holds just the tokens spelled with characters the first text contains,
which builds in tens of milliseconds for a short prompt; a later text with other characters
gets the whole vocabulary, built once. The merges (as token ids) and each token's characters
are derived once per GGUF and cached under its header's SHA-256.
"""

import os
import re
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from llogos_cli.errors import LlogosError
from llogos_cli.paths import optional_cache_dir
from llogos_cli.tokenizer.detokenize import GPT2_BYTES

_CACHE_VERSION = 1
MODELS = ("gpt2", "llama", "gemma4", "bert")   # tokenizer.ggml.model values llogos reads (bert: wordpiece.py)
SPM_TEXT = ("llama", "gemma4", "bert")         # tokens show spaces as ▁ and bytes as <0xXX>
_NEWLINES = re.compile(r"[^\n]+|\n+")   # Gemma 4's pieces: lines, and runs of newlines
_UNKNOWN_BYTE = "<llogos: byte not in the vocabulary>"
_BYTE_CHARS = {b: ch for ch, b in GPT2_BYTES.items()}

# Regexes from llama.cpp's llm_tokenizer_bpe (llama-vocab.cpp), in the forms llama.cpp runs.
# GPT-2's regex ends in `\s+`: llama.cpp's hand-written matcher for it includes that fallback.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Upper-then-lower letter runs, written with lookaheads as llama.cpp does (std::regex lacks \p{Lu}).
_UPPER_LOWER = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+{c}"
                r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*{c}")
_GPT4O = (_UPPER_LOWER.replace("{c}", _CONTRACTIONS + "?")
          + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = _UPPER_LOWER.replace("{c}", "") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"
# DeepSeek's first models: newlines alone, CJK runs apart, and (deepseek-llm) letters as an explicit
# class of ranges, as llama.cpp writes them.
_CJK = "[一-龥ࠀ-一가-퟿]+"
_DEEPSEEK_LETTERS = ("[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-"
                     "Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ"
                     "-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ"
                     "-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]")


@dataclass(frozen=True, slots=True)
class PreTokenizer:
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a piece that is itself a token skips the merges
    add_bos: bool = False  # llama.cpp's default when the GGUF has no add_bos_token


_LLAMA3_PRE = PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)
_GROUPS = {
    ("default",): PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")),
    ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
     "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais",
     "exaone4", "trillion", "granite-docling"): PreTokenizer((_GPT2,)),
    ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
     "mellum2"): PreTokenizer((r"\p{N}", _GPT2)),
    ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
     "jina-v5-nano"): _LLAMA3_PRE,
    ("dbrx", "smaug-bpe", "glm4", "chatglm-bpe"): PreTokenizer((_LLAMA3,)),
    ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "megrez", "hunyuan",
     "solar-open"): PreTokenizer((_QWEN2,)),
    ("qwen35",): PreTokenizer((_QWEN35,)),
    ("falcon",): PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")),
    ("poro-chat", "bloom", "gpt3-finnish"): PreTokenizer((_BLOOM,)),
    ("viking",): PreTokenizer((_BLOOM, r"\p{N}")),
    ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"): PreTokenizer((_GPT4O,)),
    ("tekken",): PreTokenizer((_TEKKEN,), ignore_merges=True, add_bos=True),
    ("deepseek-llm",): PreTokenizer(("[\r\n]", r"\s?" + _DEEPSEEK_LETTERS + "+", r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
                                     r"\s+$", _CJK, r"\p{N}+")),
    ("deepseek-coder",): PreTokenizer(("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")),
}
PRE_TOKENIZERS = {name: pre for names, pre in _GROUPS.items() for name in names}


def pre_tokenizer(meta: dict) -> PreTokenizer:
    """llama.cpp's pre-tokenizer for a "gpt2" vocabulary; a missing name means "default"."""
    name = meta.get("tokenizer.ggml.pre") or "default"
    if name not in PRE_TOKENIZERS:
        raise LlogosError(f"unsupported pre-tokenizer {name!r} (tokenizer.ggml.pre); "
                          f"known: {', '.join(sorted(PRE_TOKENIZERS))}")
    return PRE_TOKENIZERS[name]


class SubwordModel:
    """llama.cpp's BPE or SentencePiece algorithm for one GGUF vocabulary."""

    def __init__(self, meta: dict, tokens: list[str], token_ids: dict[str, int], header_sha256: str):
        self._spm = meta["tokenizer.ggml.model"] in SPM_TEXT
        self._lines = meta["tokenizer.ggml.model"] == "gemma4"
        self._pre = None if self._spm else pre_tokenizer(meta)
        self._token_ids = token_ids
        self._tokens = tokens
        self._texts = np.array(tokens, dtype=object)  # gathers token texts by id arrays quickly
        self._merges, self._chars, self._starts = _cached_tables(meta, tokens, token_ids, header_sha256)
        # SentencePiece's fallback for characters outside the vocabulary, found by text as
        # `tokenizers` finds them.
        self._byte_tokens = [token_ids[t] for t in (f"<0x{b:02X}>" for b in range(256)) if t in token_ids]
        # The BPE and the characters it spells with (None: all), swapped as one pair so that a
        # thread never encodes with a BPE that lacks its text's characters; the lock makes one
        # thread build while the others wait for it (server requests tokenize concurrently).
        self._current: tuple[frozenset[str] | None, Tokenizer] | None = None
        self._building = threading.Lock()

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Ids of each stretch of text (for SentencePiece, with spaces already written as ▁)."""
        joined = "".join(texts)
        chars = frozenset(joined) if self._spm else frozenset(_BYTE_CHARS[b] for b in set(joined.encode()))
        bpe = self._bpe_for(chars)
        if self._lines:
            return [[i for piece in _NEWLINES.findall(text) for i in self._line_ids(bpe, piece)] for text in texts]
        # The "unknown byte" id, len(tokens), stands for a byte llama.cpp drops.
        return [[i for i in bpe.encode(text, add_special_tokens=False).ids if i < len(self._tokens)]
                for text in texts]

    def _line_ids(self, bpe: Tokenizer, piece: str) -> list[int]:
        if piece[0] == "\n" and piece in self._token_ids:
            return [self._token_ids[piece]]
        return bpe.encode(piece, add_special_tokens=False).ids

    def _bpe_for(self, chars: frozenset[str]) -> Tokenizer:
        """A BPE that spells every one of `chars`. The first texts get a BPE of just the tokens
        they can spell, which builds quickly; texts with new characters after that get the whole
        vocabulary, built once."""
        current = self._current
        if current is not None and (current[0] is None or chars <= current[0]):
            return current[1]
        with self._building:
            current = self._current
            if current is None or not (current[0] is None or chars <= current[0]):
                known = chars if current is None else None
                current = self._current = (known, self._build(known))
            return current[1]

    def _build(self, known: frozenset[str] | None) -> Tokenizer:
        if known is None:
            spellable = np.ones(len(self._tokens), dtype=bool)
        else:
            known = np.fromiter((ord(c) for c in known), dtype=np.int32)
            spellable = np.logical_and.reduceat(np.isin(self._chars, known), self._starts)
            spellable[self._byte_tokens] = True
        ids = np.flatnonzero(spellable)
        vocab = dict(zip(self._texts[ids].tolist(), ids.tolist()))
        rows = self._merges[spellable[self._merges[:, 2]]]
        merges = list(zip(self._texts[rows[:, 0]].tolist(), self._texts[rows[:, 1]].tolist()))
        if self._spm:
            return Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
        # A byte missing from the vocabulary stays in llama.cpp's symbol list, where it blocks
        # merges across it, before being dropped; `tokenizers` would drop it first. An extra
        # "unknown" token past the vocabulary keeps it in place.
        vocab[_UNKNOWN_BYTE] = len(self._tokens)
        bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=_UNKNOWN_BYTE,
                                   ignore_merges=self._pre.ignore_merges))
        bpe.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in self._pre.regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        return bpe


def _cached_tables(meta: dict, tokens: list[str], token_ids: dict[str, int], header_sha256: str):
    """Merges as rows of (left id, right id, joined id) in rank order, and every token's
    characters: their code points concatenated, and the offset where each token starts."""
    folder = optional_cache_dir("tokenizer")
    path = folder / f"{header_sha256[:32]}-v{_CACHE_VERSION}.npz" if folder else None
    cached = _read_tables(path, len(tokens)) if path else None
    if cached:
        return cached
    if meta["tokenizer.ggml.model"] == "llama":
        merges = _spm_merges(tokens, meta.get("tokenizer.ggml.scores"), token_ids)
    else:
        merges = _gpt2_merges(meta.get("tokenizer.ggml.merges"), token_ids)
    merges = np.array(merges, dtype=np.int32).reshape(-1, 3)
    chars = np.array([ord(c) for text in tokens for c in text], dtype=np.int32)
    starts = np.cumsum([0] + [len(text) for text in tokens[:-1]], dtype=np.int64)
    if path is None:
        return merges, chars, starts
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp.npz")
    try:
        np.savez(tmp, merges=merges, chars=chars, starts=starts)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
    return merges, chars, starts


def _read_tables(path: Path, n_tokens: int):
    try:
        with np.load(path) as cached:
            merges, chars, starts = cached["merges"], cached["chars"], cached["starts"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    return (merges, chars, starts) if merges.ndim == 2 and merges.shape[1] == 3 and len(starts) == n_tokens else None


def _gpt2_merges(lines: list[str] | None, ids: dict[str, int]) -> list[tuple[int, int, int]]:
    if not lines:
        raise LlogosError("the GGUF's gpt2 tokenizer has no tokenizer.ggml.merges")
    merges, seen = [], set()
    for line in lines:
        # llama.cpp splits at the first space after the first character, and keeps the first
        # rank of a repeated pair; `tokenizers` needs both halves and the result in the vocab.
        cut = line.find(" ", 1)
        left, right = line[:cut], line[cut + 1:]
        if cut > 0 and (left, right) not in seen and left in ids and right in ids \
                and left + right in ids:
            seen.add((left, right))
            merges.append((ids[left], ids[right], ids[left + right]))
    return merges


def _spm_merges(tokens: list[str], scores: list[float] | None,
                ids: dict[str, int]) -> list[tuple[int, int, int]]:
    scores = scores or [0.0] * len(tokens)
    ranked = []
    for joined, text in enumerate(tokens):
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in ids and right in ids:
                ranked.append((-scores[joined], joined, cut, ids[left], ids[right]))
    # Highest score first; llama.cpp breaks score ties by position in the text, which a rank
    # cannot express, so ties go by token id (only special tokens share scores in practice).
    ranked.sort(key=lambda m: m[:3])
    return [(left, right, joined) for _, joined, _, left, right in ranked]
