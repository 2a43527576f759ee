"""llama.cpp's ngram-mod speculation: one table, shared by every row of the engine, from a hash of
n_match tokens to the token that last followed them, anywhere (this row's prompt and output, and
every earlier request's). A draft is chained through it: the row's last n_match tokens give a next
token, the window moves on by that token and gives the next, until a window is unknown or the draft
holds n_max tokens; a draft shorter than n_min is none. Unlike ngram-simple's scan of one row, a
lookup costs the same at any context length, and text that an earlier request wrote (an agent
asking again about the file it edits) is drafted in the next.

The table is llama.cpp's: a polynomial hash of the window modulo the table's size, so two windows
may share an entry and the later one's token wins (a wrong draft only costs its verification; the
output does not depend on drafts). It is cleared when a new row finds it over a quarter full, and
after a row's fifth draft in a row of which under a quarter was kept.
"""

import numpy as np

from llogos_cli.engine.speculation import SpecParams, Speculator

TABLE_SIZE = 4 * 1024 * 1024
MAX_OCCUPANCY = 0.25     # a new row finds the table fuller than this: cleared first
INDEX_EVERY = 32         # a row's new tokens join the table 32 at a time
LOW_ACCEPTANCE = 0.25    # a draft that kept less than this share of its tokens is a low one...
LOW_STREAK = 5           # ...and this many in a row clear the table
_EMPTY = -1
_MUL = 6364136223846793005
_MASK = (1 << 64) - 1


def window_hash(window) -> int:
    h = 0
    for t in window:
        h = (h * _MUL + int(t)) & _MASK
    return h


def window_hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """window_hash of every window of n tokens, as uint64 (NumPy's unsigned products wrap modulo 2^64)."""
    count = len(tokens) - n + 1
    h = np.zeros(count, np.uint64)
    t = tokens.astype(np.uint64)
    for j in range(n):
        h = h * np.uint64(_MUL) + t[j:j + count]
    return h


class NgramMod(Speculator):
    def __init__(self, params: SpecParams):
        super().__init__(params)
        self.table = np.full(TABLE_SIZE, _EMPTY, np.int32)
        self.used = 0
        self._lead = pow(_MUL, params.spec_ngram_mod_n_match - 1, 1 << 64)   # a window's first token's factor

    def propose(self, row, n: int) -> list[int]:
        p, state, tokens = self.params, row.drafting, row.tokens
        k = p.spec_ngram_mod_n_match
        if len(tokens) < k:
            return []
        if state.indexed == 0:   # the row's first draft: its prompt joins the table
            self._index(tokens, 0)
            if self.used > MAX_OCCUPANCY * TABLE_SIZE:
                self.clear()
            state.indexed = max(len(tokens) - k, 1)
        elif state.indexed + INDEX_EVERY < len(tokens):
            self._index(tokens, state.indexed)
            state.indexed = len(tokens) - k
        window = list(tokens[-k:])
        h, draft = window_hash(window), []
        while len(draft) < n:
            token = int(self.table[h % TABLE_SIZE])
            if token == _EMPTY:
                break
            draft.append(token)
            h = ((h - window[len(draft) - 1] * self._lead) * _MUL + token) & _MASK
            window.append(token)
        return draft if len(draft) >= min(p.spec_ngram_mod_n_min, n) else []

    def kept(self, row, n_drafted: int, n_accepted: int) -> None:
        super().kept(row, n_drafted, n_accepted)
        state = row.drafting
        state.low = state.low + 1 if n_accepted < LOW_ACCEPTANCE * n_drafted else 0
        if state.low >= LOW_STREAK:
            self.clear()
            state.low, state.indexed = 0, 0

    def clear(self) -> None:
        self.table.fill(_EMPTY)
        self.used = 0

    def _index(self, tokens: list[int], start: int) -> None:
        """The windows starting at start.. that a token follows, each mapped to that token."""
        k = self.params.spec_ngram_mod_n_match
        if len(tokens) - start <= k:
            return
        ids = np.asarray(tokens[start:], np.int64)
        at = (window_hashes(ids[:-1], k) % np.uint64(TABLE_SIZE)).astype(np.int64)
        self.used += int(np.count_nonzero(self.table[np.unique(at)] == _EMPTY))
        self.table[at] = ids[k:]
