"""Speculative decoding: a continuation drafted for a decoding row, checked in the row's next step.

A decoding row evaluates one token a step. With speculation the engine first drafts tokens that
may come next (llama.cpp's ngram-simple: the tokens that followed the last earlier occurrence of
the row's last n tokens, in its prompt or its output), and the step evaluates the row's last token
and the draft in one forward pass, as it runs a prompt chunk. The logits at each position choose
the next token as the row would without speculation; the draft holds while the chosen token is
the drafted one, and the first that is not (or the one after the whole draft) is the step's last
token. The KV written for drafted tokens past that point stays where it is: a row reads only the
positions it has reached, and its next step writes over them.

Exactness. A greedy row takes the argmax at each position: the same tokens as without speculation.
A sampled row draws x from the target's final distribution p (penalties, grammar, truncation and
temperature applied, the tokens before it taken into account) and keeps the drafted d exactly
when x == d: d is kept with probability p(d), and otherwise the token is x given x != d, whose
distribution is p with d removed and renormalized. That is the rejection rule of speculative
sampling (keep d with probability min(1, p(d)/q(d)), else draw from max(0, p - q) renormalized)
for a draft q that is all on d. The draws are the ones the row makes without speculation, so a
seeded row writes the same text with it as without.

Recurrent layers (DeltaNet, short convolutions) fold each token into a state that cannot step
back to the accepted prefix: models with them run without speculation.

A step that drafts nothing costs what a step without speculation costs plus a lookup: the n-gram
kinds keep each row's n-grams in an index that grows with the row (engine/ngram_index.py), so a
lookup does not rescan the context, and a row backing off looks nothing up.
"""

import os
from dataclasses import dataclass

from llogos_cli.engine.ngram_index import NgramIndex
from llogos_cli.errors import LlogosError

# llama.cpp's names (--spec-type) for its draft-free kinds; a draft model (-md) is its draft-simple
SPEC_TYPES = ("none", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
NGRAM_CACHE_DRAFT = 8   # ngram-cache's tokens drafted a step, at most: fixed in llama.cpp too
# After a draft of which nothing was kept, a row skips this many steps before drafting again, twice
# as many after each further such draft, up to BACKOFF_MAX: drafts that do not pay cost a
# verification pass of several tokens each.
BACKOFF_FIRST = 1
BACKOFF_MAX = 32


@dataclass(frozen=True, slots=True)
class SpecParams:
    """Speculative decoding's flags, named as llama.cpp's (defaults too)."""
    spec_type: str = "none"
    spec_ngram_simple_size_n: int = 12   # tokens looked up
    spec_ngram_simple_size_m: int = 48   # tokens copied after the match, at most
    spec_ngram_map_k_size_n: int = 12    # ngram-map-k (engine/ngram_map.py): tokens looked up
    spec_ngram_map_k_size_m: int = 48    # ngram-map-k: tokens drafted after the match, at most
    spec_ngram_map_k_min_hits: int = 1   # ngram-map-k: lookups that found the key before it drafts
    spec_ngram_map_k4v_size_n: int = 12  # ngram-map-k4v: the same for the kind that counts what followed
    spec_ngram_map_k4v_size_m: int = 48
    spec_ngram_map_k4v_min_hits: int = 1
    spec_ngram_mod_n_match: int = 24     # ngram-mod (engine/ngram_mod.py): tokens hashed to find the next
    spec_ngram_mod_n_min: int = 48       # ngram-mod: a shorter draft is none
    spec_ngram_mod_n_max: int = 64       # ngram-mod: tokens drafted a step, at most
    draft_max: int = 16                  # the draft model's tokens drafted a step, at most
    draft_min: int = 0                   # a shorter draft is not tried
    spec_draft_model: str | None = None  # a draft model's -m value: drafts with it instead (engine/draft_model.py)
    draft_p_min: float = 0.75            # a draft model stops drafting below this probability of its best token
    lookup_cache_static: str | None = None   # ngram-cache: llama.cpp's -lcs file, read only (engine/ngram_cache.py)
    lookup_cache_dynamic: str | None = None  # ngram-cache: llama.cpp's -lcd file, read if there, written as rows end

    def __post_init__(self):
        checks = [
            (self.spec_type in SPEC_TYPES, f"--spec-type must be one of {', '.join(SPEC_TYPES)}"),
            (self.spec_ngram_simple_size_n >= 1, "--spec-ngram-simple-size-n must be at least 1"),
            (self.spec_ngram_simple_size_m >= 1, "--spec-ngram-simple-size-m must be at least 1"),
            *[(1 <= getattr(self, f"spec_ngram_map_{k}_size_{x}") <= 1024,
               f"--spec-ngram-map-{k}-size-{x} must be between 1 and 1024") for k in ("k", "k4v") for x in "nm"],
            *[(getattr(self, f"spec_ngram_map_{k}_min_hits") >= 1, f"--spec-ngram-map-{k}-min-hits must be at least 1")
              for k in ("k", "k4v")],
            (1 <= self.spec_ngram_mod_n_match <= 1024, "--spec-ngram-mod-n-match must be between 1 and 1024"),
            (0 <= self.spec_ngram_mod_n_min <= self.spec_ngram_mod_n_max <= 1024,
             "--spec-ngram-mod-n-min and --spec-ngram-mod-n-max must be 0 <= n-min <= n-max <= 1024"),
            (self.draft_max >= 0, "--draft-max must be 0 or more"),
            (0 <= self.draft_min <= self.draft_max, "--draft-min must be between 0 and --draft-max"),
            (0.0 <= self.draft_p_min <= 1.0, "--draft-p-min must be between 0 and 1"),
            (self.spec_type == "none" or self.spec_draft_model is None,
             "give either --spec-type or a draft model (-md), not both"),
        ]
        for flag, path in (("--lookup-cache-static", self.lookup_cache_static),
                           ("--lookup-cache-dynamic", self.lookup_cache_dynamic)):
            if path is not None:
                checks.append((self.spec_type == "ngram-cache", f"{flag} needs --spec-type ngram-cache"))
        if self.lookup_cache_static is not None:
            checks.append((os.path.isfile(self.lookup_cache_static),
                           f"lookup cache {self.lookup_cache_static}: no such file"))
        for ok, message in checks:
            if not ok:
                raise LlogosError(message)

    @property
    def on(self) -> bool:
        return self.most > 0

    @property
    def most(self) -> int:
        """Tokens drafted a step, at most: each kind's own limit, as in llama.cpp (--draft-max is the
        draft model's)."""
        if self.spec_draft_model is not None:
            return self.draft_max
        return {"ngram-simple": self.spec_ngram_simple_size_m, "ngram-map-k": self.spec_ngram_map_k_size_m,
                "ngram-map-k4v": self.spec_ngram_map_k4v_size_m, "ngram-mod": self.spec_ngram_mod_n_max,
                "ngram-cache": NGRAM_CACHE_DRAFT}.get(self.spec_type, 0)


@dataclass(slots=True)
class Drafting:
    """One row's speculation: tokens drafted and kept so far, and its back-off."""
    n_drafted: int = 0
    n_accepted: int = 0
    wait: int = 0        # steps to skip before the next draft
    backoff: int = 0     # the wait after the next draft of which nothing is kept
    indexed: int = 0     # ngram-mod: where the row's windows not yet in the shared table start (0: none are)
    low: int = 0         # ngram-mod: drafts in a row that kept under a quarter of their tokens
    index: object = None  # the other n-gram kinds: the kind's record of the row's tokens, made at its first draft

    def kept(self, n_drafted: int, n_accepted: int) -> None:
        """Count what a step kept of a draft, and back off after a draft wholly rejected."""
        self.n_drafted += n_drafted
        self.n_accepted += n_accepted
        self.backoff = 0 if n_accepted else min(max(2 * self.backoff, BACKOFF_FIRST), BACKOFF_MAX)
        self.wait = self.backoff


def ngram_simple(tokens: list[int], n: int, m: int, index: NgramIndex | None = None) -> list[int]:
    """llama.cpp's ngram-simple draft for a sequence whose last token was just chosen: the last n
    tokens looked for earlier in the sequence, the most recent occurrence first (the sequence's
    first token never starts one, and the occurrence must end two tokens before the current one);
    the draft is up to m of the tokens that followed it, none when fewer than n did or the sequence
    is not longer than n + m + 1 before its last token. index: the row's n-grams of n tokens so
    far, extended here (a fresh one when None)."""
    history = len(tokens) - 1   # llama.cpp's cur_len: the tokens before the one just chosen
    if history <= n + m + 1:
        return []
    index = NgramIndex(n) if index is None else index
    index.extend(tokens, history - n)   # matches start at 1 .. history - n - 1
    starts = index.find(tuple(tokens[-n:]))
    if not starts:
        return []
    start = starts[-1]
    copy = min(m, history - (start + n))
    return tokens[start + n:start + n + copy] if copy >= n else []


class Speculator:
    """Drafts tokens for the engine's decoding rows."""

    def __init__(self, params: SpecParams):
        self.params = params

    def draft(self, row) -> list[int]:
        """What the row may be about to write, as many tokens as it still wants past the next one."""
        p, state, completion = self.params, row.drafting, row.completion
        if state.wait:
            state.wait -= 1
            return []
        n_predict = completion.criteria.n_predict
        limit = completion.room if n_predict < 0 else min(completion.room, n_predict)
        n = min(p.most, limit - len(completion.generated) - 1)
        tokens = self.propose(row, n) if n >= max(p.draft_min, 1) else []
        return tokens if len(tokens) >= max(p.draft_min, 1) else []

    def kept(self, row, n_drafted: int, n_accepted: int) -> None:
        """What the row's step kept of its draft."""
        row.drafting.kept(n_drafted, n_accepted)

    def finished(self, row, last: bool) -> None:
        """The row ended (its last token chosen, or cancelled); last: no other row runs or waits."""

    def forget(self, row) -> None:
        """The row's tokens changed other than by growing (a context shift): what was recorded of
        them is made again at its next draft."""
        row.drafting.index, row.drafting.indexed = None, 0

    def propose(self, row, n: int) -> list[int]:
        """Up to n tokens that may follow the row's tokens."""
        p, state = self.params, row.drafting
        if state.index is None:
            state.index = NgramIndex(p.spec_ngram_simple_size_n)
        return ngram_simple(row.tokens, p.spec_ngram_simple_size_n, p.spec_ngram_simple_size_m, state.index)[:n]


def verified(draft: tuple[int, ...], choose):
    """The tokens a row's step writes, given its draft and choose(i), the token the target chooses
    at position i (called only after the tokens before i are folded into the row): the draft's
    tokens while the choice is the drafted token, then the first choice that is not, or the one
    after the whole draft. Yields (token id, top logprobs)."""
    for i, drafted in enumerate(draft):
        chosen = choose(i)
        yield chosen
        if chosen[0] != drafted:
            return
    yield choose(len(draft))
