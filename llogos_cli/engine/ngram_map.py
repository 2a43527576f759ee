"""llama.cpp's ngram-map-k and ngram-map-k4v speculation: a row's n-grams of size_n tokens (keys)
looked up in its own prompt and output, as ngram-simple, with a record per key of what its drafts
kept.

ngram-map-k drafts the size_m tokens that followed the key's most recent occurrence (one that
size_m tokens follow, unlike ngram-simple's, so a draft is never cut short by the end of the
context), and only as many as the key's last draft kept: a key whose copy diverged early drafts
short, one that failed at once drafts no more. ngram-map-k4v counts the distinct size_m-grams that
followed the key (the first four, as llama.cpp's COMMON_NGRAM_MAX_VALUES) and drafts only when one
of them came at least twice as often as the others together: text that continues one way after a
phrase, not text where the same phrase leads anywhere. Both draft once the key has been looked up
min_hits times.

Where llama.cpp differs: its map keeps the first position a hash of a key was seen at (then falls
back to a scan), so it may copy after an older occurrence; ngram-map-k4v copies the tokens after
the match where it counted the most frequent value (its own comment says it uses that value); and
it takes the key's hits into account only in k4v. Here both kinds copy the most recent occurrence
of the chosen continuation, and min_hits counts in both (its default, 1, changes nothing).
"""

from dataclasses import dataclass, field

from llogos_cli.engine.ngram_index import NgramIndex
from llogos_cli.engine.speculation import SpecParams, Speculator

MAX_VALUES = 4   # continuations counted per key (llama.cpp's COMMON_NGRAM_MAX_VALUES)


@dataclass(slots=True)
class Value:
    start: int      # the most recent key occurrence this continuation follows
    count: int      # occurrences of the key it followed
    accepted: int   # tokens its last draft kept (size_m before any)


@dataclass(slots=True)
class Key:
    hits: int = 0                   # lookups that found the key
    counted: int = 0                # of its occurrences, those counted into values
    values: list[Value] = field(default_factory=list)


@dataclass(slots=True)
class RowMap:
    index: NgramIndex
    keys: dict = field(default_factory=dict)   # key n-gram -> Key
    last: Value | None = None                  # the continuation the row's last draft copied


class NgramMap(Speculator):
    def __init__(self, params: SpecParams):
        super().__init__(params)
        kind = "k4v" if params.spec_type == "ngram-map-k4v" else "k"
        self.n, self.m, self.min_hits = (getattr(params, f"spec_ngram_map_{kind}_{x}") for x in ("size_n", "size_m", "min_hits"))
        self.counts = kind == "k4v"

    def propose(self, row, n_most: int) -> list[int]:
        tokens, state, n, m = row.tokens, row.drafting, self.n, self.m
        history = len(tokens) - 1   # llama.cpp's cur_len
        if history < 2 * n + m:
            return []
        if state.index is None:
            state.index = RowMap(NgramIndex(n))
        rec = state.index
        rec.last = None
        rec.index.extend(tokens, history - n - m)   # keys start at 1 .. history - n - m - 1: m tokens follow
        key = tuple(tokens[-n:])
        starts = rec.index.find(key)
        if not starts:
            return []
        stats = rec.keys.setdefault(key, Key())
        stats.hits += 1
        if stats.hits < self.min_hits:
            return []
        value = self._counted(tokens, stats, starts) if self.counts else self._latest(stats, starts)
        if value is None:
            return []
        rec.last = value
        return tokens[value.start + n:value.start + n + min(m, value.accepted, n_most)]

    def kept(self, row, n_drafted: int, n_accepted: int) -> None:
        super().kept(row, n_drafted, n_accepted)
        rec = row.drafting.index
        if rec is not None and rec.last is not None:
            rec.last.accepted = n_accepted

    def _latest(self, stats: Key, starts: list[int]) -> Value:
        """ngram-map-k: the key's one record, following its most recent occurrence."""
        if not stats.values:
            stats.values.append(Value(starts[-1], 0, self.m))
        stats.values[0].start = starts[-1]
        return stats.values[0]

    def _counted(self, tokens: list[int], stats: Key, starts: list[int]) -> Value | None:
        """ngram-map-k4v: the key's occurrences not yet counted join their continuation's count;
        the most frequent continuation, if it came at least twice as often as the others together."""
        n, m = self.n, self.m
        for s in starts[stats.counted:]:
            follows = tokens[s + n:s + n + m]
            value = next((v for v in stats.values if tokens[v.start + n:v.start + n + m] == follows), None)
            if value is not None:
                value.start, value.count = s, value.count + 1
            elif len(stats.values) < MAX_VALUES:
                stats.values.append(Value(s, 1, m))
        stats.counted = len(starts)
        best = max(stats.values, key=lambda v: v.count)
        others = sum(v.count for v in stats.values) - best.count
        return best if others == 0 or best.count >= 2 * others else None
