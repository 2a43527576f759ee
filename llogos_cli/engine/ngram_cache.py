"""llama.cpp's ngram-cache speculation (lookup decoding): for each n-gram of 1 to 4 tokens in the
row's prompt and output, how often each token followed it. A draft grows a token at a time: the
longest n-gram ending the row (drafted tokens included) whose counts are convincing gives the token
that followed it most often; a draft ends where none does, or at NGRAM_CACHE_DRAFT tokens.

Three caches draft, in llama.cpp's order: the row's own (its context, with lax thresholds), then a
dynamic one (-lcd: n-grams of 1 to 4 tokens from earlier runs, with strict thresholds), then a
static one (-lcs: 2-grams counted over a corpus, as llama-lookup-create writes it). In the first
two, a token's count is weighted by how often the static cache saw it after the row's last 2
tokens (100 times its count there, 1 where it has none), as llama.cpp does.

The files are llama.cpp's (common/ngram-cache.cpp), without a header: records to the end of the
file, each the n-gram as 4 int32 (unused slots -1), an int32 count of following tokens (> 0), then
that many pairs of int32 (token, count > 0), little-endian. llama.cpp writes its records in its
hash map's order; here they are sorted, so that the same counts make the same bytes. Where a file
names an n-gram or a token twice, the first is kept, as llama.cpp's load keeps it.

The dynamic cache is read at the start (no file: an empty one), and each row that ends adds its
prompt's and output's n-grams to the counts written back; it drafts with what was read, as
llama.cpp's lookup adds its context only at the end of a run. The file is written when a row ends
and no other row runs or waits, so a batch writes it at its end, and a server each time it falls
idle: one stopped leaves it holding every request finished by then (those cut short are counted as
far as they got).

llama.cpp indexes only the tokens new since a row's last draft, so the n-grams across that boundary
go uncounted; here every n-gram is.
"""

import os

import numpy as np

from llogos_cli.console import warn
from llogos_cli.engine.speculation import Speculator
from llogos_cli.errors import LlogosError

NGRAM_SIZES = (4, 3, 2, 1)          # longest first: llama.cpp's LLAMA_NGRAM_MAX .. LLAMA_NGRAM_MIN
NGRAM_MAX = max(NGRAM_SIZES)
STATIC_SIZE = 2                     # the static cache's n-grams (LLAMA_NGRAM_STATIC)
# occurrences of an n-gram before it may draft, and the top token's share of them in percent: the
# lax thresholds (the row's cache, the static one) and the strict ones (the dynamic cache)
MIN_SAMPLES = {1: 2, 2: 2, 3: 1, 4: 1}
MIN_PERCENT = {1: 66, 2: 50, 3: 50, 4: 50}
MIN_SAMPLES_STRICT = {1: 4, 2: 3, 3: 2, 4: 2}
MIN_PERCENT_STRICT = {1: 75, 2: 66, 3: 66, 4: 66}

Counts = dict[tuple, dict[int, int]]   # n-gram -> {token that followed: times}


def count(tokens: list[int], sizes=NGRAM_SIZES, into: Counts | None = None) -> Counts:
    """The n-grams of the given sizes in tokens, each to the tokens that followed it and how often
    (added to `into` when given). count(tokens, (2,)) is what llama-lookup-create writes for them."""
    follows = {} if into is None else into
    for size in sizes:
        for i in range(size, len(tokens)):
            counts = follows.setdefault(tuple(tokens[i - size:i]), {})
            counts[tokens[i]] = counts.get(tokens[i], 0) + 1
    return follows


def load(path: str) -> Counts:
    """A lookup cache file read, or LlogosError saying what is wrong with it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise LlogosError(f"lookup cache {path}: {e.strerror or e}") from None
    n_words = len(data) // 4
    words = np.frombuffer(data, dtype="<i4", count=n_words).tolist()
    cache: Counts = {}
    i = 0
    while i < n_words:
        at = 4 * i
        if i + NGRAM_MAX + 1 > n_words:
            raise LlogosError(f"lookup cache {path} is corrupt: the record at byte {at} is cut short")
        gram, n = words[i:i + NGRAM_MAX], words[i + NGRAM_MAX]
        if n <= 0:
            raise LlogosError(f"lookup cache {path} is corrupt: the record at byte {at} has {n} following tokens")
        end = i + NGRAM_MAX + 1 + 2 * n
        if end > n_words:
            raise LlogosError(f"lookup cache {path} is corrupt: the record at byte {at} is cut short")
        pairs = words[i + NGRAM_MAX + 1:end]
        counts: dict[int, int] = {}
        for token, times in zip(pairs[::2], pairs[1::2]):
            if times <= 0:
                raise LlogosError(f"lookup cache {path} is corrupt: the record at byte {at} counts token "
                                  f"{token} {times} times")
            counts.setdefault(token, times)
        while gram and gram[-1] == -1:
            gram.pop()
        cache.setdefault(tuple(gram), counts)
        i = end
    if len(data) % 4:
        raise LlogosError(f"lookup cache {path} is corrupt: it ends inside a record (byte {4 * n_words})")
    return cache


def encode(cache: Counts) -> bytes:
    """The file's bytes for these counts, records in sorted order."""
    words = []
    for key in sorted(cache):
        counts = cache[key]
        words += key
        words += (-1,) * (NGRAM_MAX - len(key))
        words.append(len(counts))
        for token in sorted(counts):
            words += (token, counts[token])
    return np.asarray(words, dtype="<i4").tobytes()


def save(cache: Counts, path: str) -> None:
    """Write the file whole or not at all: a copy beside it, renamed over it."""
    part = f"{path}.part"
    with open(part, "wb") as f:
        f.write(encode(cache))
    os.replace(part, path)


def _pick(counts: dict[int, int], weights: dict[int, int], size: int, min_samples, min_percent) -> int | None:
    """The token to draft from one n-gram's counts, each weighted by the static cache's (100 times
    its count, 1 where it has none); None where the counts are too few or too split."""
    token, best, best_n, total = None, 0, 0, 0
    for t, n in counts.items():   # the first of equals, in the order they came
        w = 100 * weights[t] if t in weights else 1
        if n * w > best:
            token, best, best_n = t, n * w, n
        total += n
    if total >= min_samples[size] and 100 * best_n >= min_percent[size] * total:
        return token
    return None


def _draft_from(follows: Counts, tail: list[int], weights: dict[int, int], min_samples, min_percent) -> int | None:
    for size in NGRAM_SIZES:
        if len(tail) < size:
            continue
        counts = follows.get(tuple(tail[-size:]))
        if counts:
            token = _pick(counts, weights, size, min_samples, min_percent)
            if token is not None:
                return token
    return None


class ContextCache:
    """A row's n-grams of 1 to 4 tokens, each to {token that followed: times}, made once and
    extended as the row grows."""
    __slots__ = ("follows", "upto")

    def __init__(self):
        self.follows: Counts = {}
        self.upto = 1   # the tokens before this have been counted as followers

    def extend(self, tokens: list[int]) -> None:
        follows = self.follows
        for i in range(self.upto, len(tokens)):
            for size in NGRAM_SIZES:
                if i >= size:
                    counts = follows.setdefault(tuple(tokens[i - size:i]), {})
                    counts[tokens[i]] = counts.get(tokens[i], 0) + 1
        self.upto = max(self.upto, len(tokens))

    def next(self, tail: list[int]) -> int | None:
        """The token to draft after tail (the row's last tokens) from the row's counts alone, or None."""
        return _draft_from(self.follows, tail, {}, MIN_SAMPLES, MIN_PERCENT)


class NgramCache(Speculator):
    def __init__(self, params):
        super().__init__(params)
        self.static: Counts = load(params.lookup_cache_static) if params.lookup_cache_static else {}
        self.dynamic: Counts = {}
        path = params.lookup_cache_dynamic
        if path and os.path.exists(path):
            self.dynamic = load(path)
        self.updated: Counts | None = None   # the dynamic counts with the ended rows' added, to write
        if path:
            self.updated = {key: dict(counts) for key, counts in self.dynamic.items()}

    def next(self, cache: ContextCache, tail: list[int]) -> int | None:
        """The token to draft after tail: the row's cache, the dynamic one, the static one, in turn."""
        weights = self.static.get(tuple(tail[-STATIC_SIZE:]), {}) if self.static else {}
        token = _draft_from(cache.follows, tail, weights, MIN_SAMPLES, MIN_PERCENT)
        if token is None and self.dynamic:
            token = _draft_from(self.dynamic, tail, weights, MIN_SAMPLES_STRICT, MIN_PERCENT_STRICT)
        if token is None and weights:
            token = _pick(weights, {}, STATIC_SIZE, MIN_SAMPLES, MIN_PERCENT)
        return token

    def propose(self, row, n_most: int) -> list[int]:
        tokens, state = row.tokens, row.drafting
        if len(tokens) < 2:
            return []
        if state.index is None:
            state.index = ContextCache()
        cache = state.index
        cache.extend(tokens)
        tail, draft = tokens[-NGRAM_MAX:], []
        while len(draft) < n_most:
            token = self.next(cache, tail)
            if token is None:
                break
            draft.append(token)
            tail = tail[1:] + [token]
        return draft

    def finished(self, row, last: bool) -> None:
        """A row ended: its n-grams join the dynamic cache's file (-lcd), if one was given. The file
        is rewritten whole, so only when no other row runs or waits (the end of a batch, a server
        with nothing to do): a row ending beside others would stall their step for it."""
        if self.updated is None:
            return
        count(list(row.request.prompt) + row.completion.generated, into=self.updated)
        if not last:
            return
        try:
            save(self.updated, self.params.lookup_cache_dynamic)
        except OSError as e:
            warn(f"could not write the lookup cache {self.params.lookup_cache_dynamic}: {e.strerror or e}")
