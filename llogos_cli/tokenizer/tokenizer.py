"""Text ↔ token ids for a GGUF vocabulary, matching llama.cpp's tokenizer (llama-vocab.cpp).

Encoding first cuts the text at special-token strings the way llama.cpp does: each special
token in turn, longest first, splits every stretch of text not yet claimed at all its
occurrences. Control tokens are only looked for when special tokens are parsed; user-defined
ones (Gemma's runs of spaces and newlines, its HTML tags) always are. The plain stretches in
between go to the byte-level BPE or SentencePiece model built in vocab.py.

Which tokens end generation, and which count as control tokens, also follows llama.cpp: it
recognises tokens such as <|im_end|> or <end_of_turn> by their text, whatever the GGUF says.
"""

import operator
import threading

from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.tokenizer import vocab
from llogos_cli.tokenizer.detokenize import (
    SPM_SPACE,
    StreamDecoder,
    TokenType,
    display,
    is_hidden,
    piece_bytes,
)
from llogos_cli.tokenizer.wordpiece import WordPiece

__all__ = ["StreamDecoder", "Tokenizer"]

_META = "tokenizer.ggml."
# Token texts llama.cpp takes for these roles when the GGUF does not name the id; a token found
# this way becomes a control token. The first text present in the vocabulary wins.
_ROLE_TEXTS = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
            "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
            "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# Older GGUFs name the infill ids differently; llama.cpp lets the old name win.
_ROLE_KEYS = {"fim_pre": ("prefix", "fim_pre"), "fim_suf": ("suffix", "fim_suf"),
              "fim_mid": ("middle", "fim_mid")}
# Every token with one of these texts ends generation (and becomes a control token).
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
              "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
              "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
              "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")
# gpt-oss's channel markers are always rendered, so llama.cpp makes them user-defined.
_ALWAYS_SHOWN = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


class Tokenizer:
    """A GGUF vocabulary: "gpt2" (byte-level BPE), "llama" (SentencePiece), "gemma4" (BPE over
    characters, spaces written as ▁ as SentencePiece writes them) or "bert" (WordPiece)."""

    def __init__(self, meta: dict, header_sha256: str):
        model = meta.get(_META + "model")
        if model not in vocab.MODELS:
            raise LlogosError(f"unsupported tokenizer {model!r} ({_META}model); llogos reads 'gpt2' "
                              "(byte-level BPE), 'llama' (SentencePiece), 'gemma4' and 'bert' (WordPiece) vocabularies")
        tokens = meta.get(_META + "tokens")
        if not tokens:
            raise LlogosError(f"the GGUF has no vocabulary ({_META}tokens)")
        if "" in tokens:  # llama.cpp names empty tokens so that they stay distinct
            tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self._meta, self._sha = meta, header_sha256
        self._kind = model
        self._spm = model in vocab.SPM_TEXT   # tokens show spaces as ▁, <0xXX> byte tokens
        self._tokens = tokens
        self._ids = {text: i for i, text in enumerate(tokens)}
        if len(self._ids) != len(tokens):
            raise LlogosError("the GGUF vocabulary has duplicate tokens")
        # A copy: llama.cpp retypes some tokens (see _find_eog).
        self._types = list(meta.get(_META + "token_type") or [TokenType.NORMAL] * len(tokens))
        if len(self._types) != len(tokens):
            raise LlogosError(f"the GGUF has {len(tokens)} tokens but {len(self._types)} token types")
        self.n_vocab = len(tokens)

        pre = None if self._spm else vocab.pre_tokenizer(meta)  # fails early if unknown
        # llama.cpp adds BOS for Gemma 4 whatever its GGUF says, and BERT's [CLS] ... [SEP] always.
        self.add_bos = model in ("gemma4", "bert") or bool(meta.get(_META + "add_bos_token", self._spm or pre.add_bos))
        # EOS after a text that asks for it (embedding models: Qwen3-Embedding pools its last token, EOS),
        # which llama.cpp's add_special appends; BERT's closing [SEP] is encode's own.
        self.add_eos = model != "bert" and bool(meta.get(_META + "add_eos_token", False))
        self.add_space_prefix = model == "llama" and bool(meta.get(_META + "add_space_prefix", True))
        default_bos, default_eos = {"llama": (1, 2), "gpt2": (11, 11), "bert": (101, None)}.get(model, (None, None))
        no_bos = meta.get(_META + "pre") in ("glm4", "chatglm-bpe")
        self.bos_id = self._role_id("bos", None if no_bos else default_bos)
        self.eos_id = self._role_id("eos", default_eos)
        # BERT's [SEP] closes what begins with [CLS] ([SEP]'s key is spelled so in GGUF).
        self.sep_id = self._role_id("seperator", 102) if model == "bert" else None
        if self.add_bos and self.bos_id is None:
            raise LlogosError(f"{_META}add_bos_token is true but the vocabulary has no BOS token")
        self.eog_ids: frozenset[int] = self._find_eog()

        # Special tokens in the order llama.cpp tries them: longest (in bytes) first.
        special_types = (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN)
        specials = [i for i, t in enumerate(self._types) if t in special_types]
        specials.sort(key=lambda i: -len(tokens[i].encode()))
        self._specials = [(tokens[i], i, is_hidden(self._types[i])) for i in specials]
        # Grouped by their first characters, so that a long text is searched once per group
        # rather than once per token (Gemma has 6,414 special tokens, mostly <unusedN>).
        self._special_groups: dict[str, list[tuple[str, int]]] = {}
        for text, token_id, _ in self._specials:
            self._special_groups.setdefault(text[:4], []).append((text, token_id))
        self._pieces: dict[int, bytes] = {}   # filled as tokens are shown; a racing fill writes the same bytes
        self._subword: vocab.SubwordModel | WordPiece | None = None
        self._subword_lock = threading.Lock()

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Tokenizer":
        return cls(f.meta, f.header_sha256)

    # ---- special tokens ----------------------------------------------------------------------

    def _role_id(self, role: str, default: int | None) -> int | None:
        """The id the GGUF gives a role; llama.cpp ignores ids outside the vocabulary."""
        for key in _ROLE_KEYS.get(role, (role,)):
            value = self._meta.get(f"{_META}{key}_token_id")
            if value is not None and 0 <= value < self.n_vocab:
                return value
        return default if default is not None and default < self.n_vocab else None

    def _find_eog(self) -> frozenset[int]:
        """End-of-generation ids as llama.cpp computes them; marks tokens it treats as control."""
        roles = {}
        for role, texts in _ROLE_TEXTS.items():
            roles[role] = self._role_id(role, None)
            if roles[role] is None:
                found = [self._ids[t] for t in texts if t in self._ids]
                if found:
                    roles[role] = found[0]
                    self._types[found[0]] = TokenType.CONTROL
        eog = {roles[r] for r in ("fim_pad", "fim_rep", "fim_sep", "eot", "eom")} - {None}
        for text in _EOG_TEXTS:
            if text in self._ids:
                eog.add(self._ids[text])
                self._types[self._ids[text]] = TokenType.CONTROL
        for text in _ALWAYS_SHOWN:
            if text in self._ids:
                self._types[self._ids[text]] = TokenType.USER_DEFINED
        if self.eos_id is not None:
            eog.add(self.eos_id)
        texts = {self._tokens[i] for i in eog}
        # gpt-oss and solar-open use <|end|> between messages, not to end the reply.
        if "<|end|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts) \
                and ("<|return|>" in texts or "<|flush|>" in texts):
            eog.discard(self._ids["<|end|>"])
            self._types[self._ids["<|end|>"]] = TokenType.USER_DEFINED
        # Gemma 4 uses </s> as ordinary text.
        if "<|tool_response>" in texts and "</s>" in texts:
            eog.discard(self._ids["</s>"])
            self._types[self._ids["</s>"]] = TokenType.NORMAL
        return frozenset(eog)

    def _split_special(self, text: str, parse_special: bool) -> list[str | int]:
        """The text as plain stretches (str) and special token ids (int), as llama.cpp cuts it."""
        present = {token_id for start, group in self._special_groups.items() if start in text
                   for special, token_id in group if special in text}
        pieces: list[str | int] = [text] if text else []
        for special, token_id, hidden in self._specials:
            if token_id not in present or (hidden and not parse_special):
                continue
            cut: list[str | int] = []
            for piece in pieces:
                if isinstance(piece, int) or special not in piece:
                    cut.append(piece)
                    continue
                for k, part in enumerate(piece.split(special)):
                    if k:
                        cut.append(token_id)
                    if part:
                        cut.append(part)
            pieces = cut
        return pieces

    # ---- encoding ----------------------------------------------------------------------------

    @property
    def _model(self) -> "vocab.SubwordModel | WordPiece":
        # Made on first use, once however many threads ask: decoding never needs it, and it
        # reads a cache file.
        if self._subword is None:
            with self._subword_lock:
                if self._subword is None:
                    self._subword = (WordPiece(self._meta, self._ids, self._role_id("unknown", 100)) if self._kind == "bert"
                                     else vocab.SubwordModel(self._meta, self._tokens, self._ids, self._sha))
        return self._subword

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        """Token ids of `text`. BOS comes first if `add_bos`; None means what the model asks for
        (llama.cpp's add_special). With `parse_special` control-token text becomes those tokens."""
        try:
            text.encode()
        except UnicodeEncodeError as e:  # lone surrogates, as undecodable command-line bytes give
            raise LlogosError(f"the text is not valid Unicode at character {e.start}") from None
        ids = []
        add_special = self.add_bos if add_bos is None else add_bos
        if add_special:
            if self.bos_id is None:
                raise LlogosError("cannot add BOS: the vocabulary has no BOS token")
            ids.append(self.bos_id)
        pieces = self._split_special(text, parse_special)
        if self._kind in ("llama", "gemma4"):   # spaces written as ▁ before the subword model sees them
            pieces = [p if isinstance(p, int) else self._spm_text(p, k == 0 or isinstance(pieces[k - 1], int))
                      for k, p in enumerate(pieces)]
        encoded = iter(self._model.encode([p for p in pieces if isinstance(p, str)]))
        for piece in pieces:
            if isinstance(piece, int):
                ids.append(piece)
            else:
                ids.extend(next(encoded))
        if add_special and self.sep_id is not None:
            ids.append(self.sep_id)
        return ids

    def _spm_text(self, text: str, after_special: bool) -> str:
        """SentencePiece writes spaces as ▁; llama.cpp also puts one at the start of the text and
        after each special token when the model asks for a space prefix."""
        if self.add_space_prefix and after_special:
            text = " " + text
        return text.replace(" ", SPM_SPACE)

    def token_id(self, text: str) -> int | None:
        """The id of the token whose text is exactly `text`, if there is one."""
        return self._ids.get(text)

    # ---- decoding ----------------------------------------------------------------------------

    def token_bytes(self, token_id: int, special: bool = False) -> bytes:
        """The bytes llama.cpp prints for a token; control tokens are empty unless `special`."""
        try:
            token_id = operator.index(token_id)
        except TypeError:
            raise LlogosError(f"token id {token_id!r} is not an integer") from None
        if not 0 <= token_id < self.n_vocab:
            raise LlogosError(f"token id {token_id} is outside the vocabulary (0..{self.n_vocab - 1})")
        token_type = self._types[token_id]
        if not special and is_hidden(token_type):
            return b""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = piece_bytes(self._tokens[token_id], token_type, self._spm)
        return piece

    def piece(self, token_id: int) -> str:
        """One token as llama.cpp shows it, special tokens included."""
        return display(self.token_bytes(token_id, special=True))

    def decode(self, ids, special: bool = False) -> str:
        """The text of a token sequence; bytes that do not form UTF-8 become U+FFFD."""
        return b"".join(self.token_bytes(i, special) for i in ids).decode("utf-8", errors="replace")
