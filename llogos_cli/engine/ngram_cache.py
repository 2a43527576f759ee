"""llama.cpp's ngram-cache speculation (lookup decoding): for each n-gram of 1 to 4 tokens in the
row's prompt and output, how often each token followed it. A draft grows a token at a time: the
longest n-gram ending the row (drafted tokens included) whose counts are convincing gives the token
that followed it most often; a draft ends where none does, or at NGRAM_CACHE_DRAFT tokens.
"Convincing" is llama.cpp's lax thresholds for its context cache: enough occurrences of the n-gram,
and the top token's share of them.

Left out: llama.cpp's static and dynamic caches (-lcs/-lcd files written by its llama-lookup-create
tool from a corpus, in its own binary layout): without them, as in llama-server when neither flag is
given, only the row's own context drafts. llama.cpp indexes only the tokens new since a row's last
draft, so the n-grams across that boundary go uncounted; here every n-gram is.
"""

from llogos_cli.engine.speculation import Speculator

NGRAM_SIZES = (4, 3, 2, 1)          # longest first: llama.cpp's LLAMA_NGRAM_MAX .. LLAMA_NGRAM_MIN
MIN_SAMPLES = {1: 2, 2: 2, 3: 1, 4: 1}     # occurrences of an n-gram before it may draft
MIN_PERCENT = {1: 66, 2: 50, 3: 50, 4: 50}  # the top token's share of them, in percent


class ContextCache:
    """A row's n-grams of 1 to 4 tokens, each to {token that followed: times}, made once and
    extended as the row grows."""
    __slots__ = ("follows", "upto")

    def __init__(self):
        self.follows: dict[tuple, dict[int, int]] = {}
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
        """The token to draft after tail (the row's last tokens), or None."""
        for size in NGRAM_SIZES:
            if len(tail) < size:
                continue
            counts = self.follows.get(tuple(tail[-size:]))
            if not counts:
                continue
            token = max(counts, key=counts.__getitem__)   # the first of equals, in the order they came
            total = sum(counts.values())
            if total >= MIN_SAMPLES[size] and 100 * counts[token] >= MIN_PERCENT[size] * total:
                return token
        return None


class NgramCache(Speculator):
    def propose(self, row, n_most: int) -> list[int]:
        tokens, state = row.tokens, row.drafting
        if len(tokens) < 2:
            return []
        if state.index is None:
            state.index = ContextCache()
        cache = state.index
        cache.extend(tokens)
        tail, draft = tokens[-max(NGRAM_SIZES):], []
        while len(draft) < n_most:
            token = cache.next(tail)
            if token is None:
                break
            draft.append(token)
            tail = tail[1:] + [token]
        return draft
