"""A row's n-grams, each to the positions where it starts, kept up to date as the row grows.

llama.cpp's ngram-simple scans the whole context backwards for the last n tokens at every step;
here each n-gram is indexed once, when the row first reaches past it, so a step's lookup is a
dictionary access at any context length and a step that drafts nothing costs microseconds. The
n-grams are the tuples themselves, not hashes of them: a lookup finds exactly the occurrences a
scan would.
"""


class NgramIndex:
    __slots__ = ("n", "starts", "upto")

    def __init__(self, n: int):
        self.n = n
        self.starts: dict[tuple, list[int]] = {}   # n-gram -> where it starts, in order
        self.upto = 1   # the n-grams starting before this are indexed (the first token starts none, as in llama.cpp)

    def extend(self, tokens: list[int], end: int) -> None:
        """Index the n-grams of tokens that start before end."""
        n, starts = self.n, self.starts
        for s in range(self.upto, end):
            starts.setdefault(tuple(tokens[s:s + n]), []).append(s)
        self.upto = max(self.upto, end)

    def find(self, ngram: tuple) -> list[int]:
        """Where ngram starts among the indexed positions, in order (empty: nowhere)."""
        return self.starts.get(ngram, [])
