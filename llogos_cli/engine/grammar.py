"""Constrained decoding: a JSON Schema or a grammar decides which tokens may come next.

llguidance (the library llama.cpp, vLLM and SGLang offer for this) compiles JSON Schema, GBNF and
Lark grammars and computes, per step, a bitmask of the vocabulary's tokens that keep the output
inside the grammar. It sees the vocabulary as the bytes each token prints, built here from the
GGUF vocabulary llogos already reads (byte-level BPE and SentencePiece alike), with control tokens
marked special so that grammar text never spells them, and with every end-of-generation token as
its "EOS": allowed only where the grammar accepts.

A Grammar is checked when it is made, without a tokenizer, so a bad schema fails before any weight
is read; a Matcher follows one row's output token by token.

A row's next mask can be started on the mask thread (Matcher.start) while the model's forward pass
runs, since llguidance computes it without holding the GIL, and is collected when the row samples.
A matcher is touched by one thread at a time: whatever reads or advances it first waits for the
mask in flight.
"""

import json
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache

import llguidance
import llguidance.numpy as llguidance_numpy
import numpy as np

from llogos_cli.engine.closed_schema import closed
from llogos_cli.errors import LlogosError
from llogos_cli.tokenizer.detokenize import SPM_SPACE

# Compiled grammars kept per vocabulary, so batch lines and requests sharing a schema compile it once.
_COMPILED_PER_VOCAB = 64
# JSON is written on one line with ", " and ": " between items: with free whitespace a small model can
# fill its whole budget with spaces inside a "{". oneOf is taken as anyOf, as llama.cpp does, since
# llguidance refuses a oneOf whose branches it cannot prove disjoint (discriminated unions often are
# not, when the discriminator is optional). A schema's own "x-guidance" options override these.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "coerce_one_of": True}


@dataclass(frozen=True, slots=True)
class Grammar:
    """A checked constraint in llguidance's form; `what` names it in messages ("JSON schema")."""
    what: str
    spec: str

    @classmethod
    def json_schema(cls, schema: str | dict | bool, lenient: bool = False) -> "Grammar":
        """From a JSON Schema, as text or already decoded, its objects closed to undeclared keys as
        llama.cpp closes them (closed_schema). `lenient` passes over keywords llguidance cannot
        enforce (uniqueItems, not, if/then...) instead of refusing the schema: for tool parameters,
        where a call that may miss one of them beats no call at all."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise LlogosError(f"the JSON schema is not valid JSON: {e.msg} at column {e.colno}") from None
        if schema is True or schema == {}:
            schema = {}   # anything at all: llguidance still needs it to be JSON
        if not isinstance(schema, dict):
            raise LlogosError("the JSON schema must be a JSON object")
        options = {**_JSON_OPTIONS, "lenient": lenient}
        return cls._checked("JSON schema", llguidance.LLMatcher.grammar_from_json_schema(closed(schema), options))

    @classmethod
    def json_object(cls) -> "Grammar":
        """Any JSON object (OpenAI's response_format "json_object")."""
        return cls._checked("JSON object",
                            llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, _JSON_OPTIONS))

    @classmethod
    def gbnf(cls, text: str) -> "Grammar":
        """From a grammar in llama.cpp's GBNF (llguidance also takes its Lark syntax here)."""
        if not text.strip():
            raise LlogosError("the grammar is empty")
        try:
            spec = llguidance.grammar_from("gbnf", text)
        except ValueError as e:
            raise LlogosError(f"the grammar cannot be used: {_one_line(str(e))}") from None
        return cls._checked("grammar", spec)

    @classmethod
    def _checked(cls, what: str, spec: str) -> "Grammar":
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(spec)
        if failed:
            raise LlogosError(f"the {what} cannot be used: {_one_line(messages[0])}")
        return cls(what, spec)


class Matcher:
    """One row's place in its grammar: which tokens may come next, and the tokens taken so far."""

    def __init__(self, grammar: Grammar, tokenizer):
        self.grammar = grammar
        self._matcher = _vocab(tokenizer).matcher(grammar)
        self._bits = llguidance_numpy.allocate_token_bitmask(1, tokenizer.n_vocab)
        self._pending: Future | None = None   # the next token's mask, being computed on the mask thread
        self._fail_if_broken()

    def start(self) -> None:
        """Begin computing the next token's mask on the mask thread; allowed() collects it."""
        if self._pending is None:
            self._pending = _mask_thread().submit(self._fill)

    def allowed(self, n: int) -> np.ndarray:
        """Which of n logits (the vocabulary, and any padding past it) may be chosen next, as bools."""
        bits = np.unpackbits(self.bits().view(np.uint8), bitorder="little").view(bool)
        mask = np.zeros(n, bool)
        mask[:min(n, len(bits))] = bits[:n]
        return mask

    def bits(self) -> np.ndarray:
        """The next token's bitmask as uint32 words: token i may be chosen where bit i % 32 of word
        i // 32 is set (what a backend's mask_logits takes)."""
        bits = self._wait()
        if bits is None:
            bits = self._fill()
        self._fail_if_broken()
        return bits

    def consume(self, token_id: int) -> None:
        self._wait()
        if not self._matcher.consume_token(token_id):
            self._fail_if_broken()

    @property
    def done(self) -> bool:
        """The grammar is complete and can take nothing more: the output ends here."""
        self._wait()
        return self._matcher.is_stopped()

    def _fill(self) -> np.ndarray:
        llguidance_numpy.fill_next_token_bitmask(self._matcher, self._bits)
        return self._bits[0].view(np.uint32).copy()

    def _wait(self) -> np.ndarray | None:
        """The mask in flight, once it is done (None if there is none): the matcher is ours again."""
        pending, self._pending = self._pending, None
        return None if pending is None else pending.result()

    def _fail_if_broken(self) -> None:
        if self._matcher.is_error():
            raise LlogosError(f"the {self.grammar.what} cannot be followed: {_one_line(self._matcher.get_error())}")


class _Vocab:
    """llguidance's view of one tokenizer, and the grammars compiled against it."""

    def __init__(self, tokenizer):
        tokens = [tokenizer.token_bytes(i, special=True) for i in range(tokenizer.n_vocab)]
        hidden = [i for i in range(tokenizer.n_vocab) if tokenizer.token_bytes(i) == b"" and tokens[i]]
        self.tokenizer = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_Wrapped(tokenizer, tokens, hidden)), n_vocab=tokenizer.n_vocab,
            eos_token=sorted(tokenizer.eog_ids))
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, grammar: Grammar) -> llguidance.LLMatcher:
        with self._lock:
            compiled = self._compiled.pop(grammar.spec, None)
            if compiled is None:
                compiled = llguidance.LLMatcher(self.tokenizer, grammar.spec, log_level=0)
            self._compiled[grammar.spec] = compiled
            if len(self._compiled) > _COMPILED_PER_VOCAB:
                self._compiled.popitem(last=False)
            return compiled.deep_copy()


class _Wrapped:
    """What llguidance.TokenizerWrapper reads: token bytes, special ids, and an encoder."""

    def __init__(self, tokenizer, tokens: list[bytes], special: list[int]):
        self._tokenizer = tokenizer
        self.tokens, self.special_token_ids = tokens, special
        self.eos_token_id, self.bos_token_id = tokenizer.eos_id, tokenizer.bos_id

    def __call__(self, text: bytes) -> list[int]:
        """Tokens spelling exactly `text`: llguidance tokenizes the text a grammar forces and allows
        those tokens. SentencePiece's encoder puts a space before the text, which is taken off the
        first token again (to the token without it, else to byte tokens)."""
        tok = self._tokenizer
        ids = tok.encode(text.decode("utf-8", errors="replace"), add_bos=False, parse_special=False)
        if not ids or self.tokens[ids[0]][:1] != b" " or text[:1] == b" ":
            return ids
        first = self.tokens[ids[0]][1:]
        if not first:
            return ids[1:]
        whole = tok.token_id(first.decode("utf-8", errors="replace").replace(" ", SPM_SPACE))
        if whole is not None and self.tokens[whole] == first:
            return [whole, *ids[1:]]
        spelled = [tok.token_id(f"<0x{b:02X}>") for b in first]
        return ids if None in spelled else spelled + ids[1:]


_VOCABS: "weakref.WeakKeyDictionary[object, _Vocab]" = weakref.WeakKeyDictionary()
_VOCABS_LOCK = threading.Lock()


def _vocab(tokenizer) -> _Vocab:
    """The tokenizer's llguidance view, built once (a fraction of a second for 50k tokens)."""
    with _VOCABS_LOCK:
        view = _VOCABS.get(tokenizer)
        if view is None:
            view = _VOCABS[tokenizer] = _Vocab(tokenizer)
        return view


@cache
def _mask_thread() -> ThreadPoolExecutor:
    """One thread for every row's masks: they run beside the forward pass, not beside each other,
    so the model's own threads keep the cores."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="llogos-masks")


def _one_line(message: str) -> str:
    return " ".join(part.strip() for part in message.strip().splitlines() if part.strip())
