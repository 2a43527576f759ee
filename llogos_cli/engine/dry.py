"""DRY ("Don't Repeat Yourself"), llama.cpp's penalty on extending text that repeats earlier text.

Looking at the last `dry_penalty_last_n` tokens (prompt and output), every earlier place where
the text ending there matches the text ending now, for at least `dry_allowed_length` tokens,
makes the token that followed it there a repeat in the making: its logit loses
multiplier x base^(match length - allowed length). Sequence breakers (strings such as "\\n" or
":") cut matches short: no match reaches back past the latest breaker in the text, and a token
that is a breaker on its own is never penalized.

A breaker string becomes token sequences once per vocabulary: every token whose text contains it
is a breaker on its own, and a token whose text ends with the start of it is one followed by
the tokens of the rest (as llama.cpp's reading of koboldcpp's rule has it).
"""

import weakref

import numpy as np

from llogos_cli.engine.samplers import dry_penalty

# llama.cpp's limits on a breaker: its first 40 bytes, and at most 20 tokens after its head.
MAX_BREAKER_BYTES = 40
MAX_TAIL_TOKENS = 20

Breakers = dict[int, tuple[tuple[int, ...], ...]]   # head token -> the token sequences that follow it

_PROCESSED: "weakref.WeakKeyDictionary[object, dict[tuple[str, ...], Breakers]]" = weakref.WeakKeyDictionary()


def sequence_breakers(tokenizer, strings: tuple[str, ...]) -> Breakers:
    """The breakers' token sequences in this vocabulary, worked out once per tokenizer and set
    (a fraction of a second over a large vocabulary)."""
    per_tokenizer = _PROCESSED.setdefault(tokenizer, {})
    if strings not in per_tokenizer:
        per_tokenizer[strings] = _process(tokenizer, strings)
    return per_tokenizer[strings]


def _process(tokenizer, strings: tuple[str, ...]) -> Breakers:
    words = [_word(tokenizer, i) for i in range(tokenizer.n_vocab)]
    found: dict[int, set[tuple[int, ...]]] = {}
    for text in strings:
        breaker = text.encode()[:MAX_BREAKER_BYTES]
        if not breaker:
            continue
        for token_id, word in enumerate(words):
            if breaker in word:
                found.setdefault(token_id, set()).add(())
            elif breaker[:1] in word:
                for tail in _tails(tokenizer, word, breaker):
                    found.setdefault(token_id, set()).add(tail)
    return {head: tuple(sorted(tails)) for head, tails in found.items()}


def _word(tokenizer, token_id: int) -> bytes:
    # A token alone, as llama.cpp detokenizes it: SentencePiece's prefix space is not part of the text.
    word = tokenizer.token_bytes(token_id, special=True)
    return word[1:] if getattr(tokenizer, "add_space_prefix", False) and word[:1] == b" " else word


def _tails(tokenizer, word: bytes, breaker: bytes):
    """The rest of the breaker, as tokens, for each end of `word` that begins the breaker."""
    for start in range(len(word)):
        end = word[start:]
        if breaker.startswith(end):
            try:
                rest = breaker[len(end):].decode()
            except UnicodeDecodeError:   # the word ends inside a character: no text can follow it
                continue
            yield tuple(tokenizer.encode(rest, add_bos=False, parse_special=False)[:MAX_TAIL_TOKENS])


class Dry:
    """DRY for one sequence: its parameters, its window and its vocabulary's breakers."""

    def __init__(self, params, n_ctx: int, breakers: Breakers):
        self.multiplier, self.base, self.allowed = params.dry_multiplier, params.dry_base, params.dry_allowed_length
        self.window = n_ctx if params.dry_penalty_last_n == -1 else params.dry_penalty_last_n
        self.breakers = breakers
        self.heads = np.fromiter(breakers, np.int64, len(breakers))
        self.alone = frozenset(head for head, tails in breakers.items() if () in tails)

    def penalties(self, history: list[int]) -> dict[int, float]:
        """token id -> what DRY takes off its logit, given the tokens so far."""
        window = np.asarray(history[-self.window:], np.int64)
        if len(window) <= self.allowed:
            return {}
        limit = self._repeat_limit(window)
        if limit < self.allowed:
            return {}
        lengths = repeat_lengths(window, limit)
        ends = np.flatnonzero(lengths >= self.allowed)
        by_length = ends[np.argsort(lengths[ends], kind="stable")]   # so that each token keeps its longest
        longest = dict(zip(window[by_length + 1].tolist(), lengths[by_length].tolist()))
        return {token: dry_penalty(self.multiplier, self.base, self.allowed, n)
                for token, n in longest.items() if token not in self.alone}

    def _repeat_limit(self, window: np.ndarray) -> int:
        """How many tokens at the end come after the latest complete breaker (all, if none does)."""
        n = len(window)
        for head in np.flatnonzero(np.isin(window, self.heads))[::-1]:
            after = n - 1 - head   # tokens after the head
            fits = [len(tail) for tail in self.breakers[int(window[head])]
                    if len(tail) <= after and tuple(window[head + 1:head + 1 + len(tail)].tolist()) == tail]
            if fits:
                return after - max(fits)
        return n


def repeat_lengths(window: np.ndarray, limit: int) -> np.ndarray:
    """For each position but the last: how many tokens ending there equal the tokens ending at
    the last position, at most `limit`. Only the last token's earlier occurrences can match; each
    round extends the matches still alive by one token."""
    last = len(window) - 1
    lengths = np.zeros(last, np.int64)
    alive = np.flatnonzero(window[:-1] == window[-1])
    n = 0
    while alive.size and n < limit:
        n += 1
        lengths[alive] = n
        alive = alive[alive >= n]
        alive = alive[window[alive - n] == window[last - n]]
    return lengths
