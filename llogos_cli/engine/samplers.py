"""llama.cpp's samplers, by name, as transforms of a candidate list: each takes the candidates' token ids and
logits and returns those it keeps (and their logits, changed where it changes them).

Candidates need not be sorted; a transform that needs an order sorts them. Tokens a transform
rules out are dropped, where llama.cpp sets their logits to -inf: the same draw, without zero
probabilities in the entropy sums that follow. `min_keep` is llama.cpp's --min-keep: top-p,
min-p, typical and XTC never leave fewer candidates than that.
"""

import math
from collections.abc import Sequence

import numpy as np

from llogos_cli.errors import LlogosError

# llama.cpp's samplers in its default order, each with its --sampling-seq letter.
SAMPLER_LETTERS = {"penalties": "e", "dry": "d", "top_n_sigma": "s", "top_k": "k", "typ_p": "y", "top_p": "p",
                   "min_p": "m", "xtc": "x", "temperature": "t"}
DEFAULT_SAMPLERS = tuple(SAMPLER_LETTERS)
# The other names llama.cpp takes for them in --samplers and a request's "samplers".
_SAMPLER_ALIASES = {"top-k": "top_k", "top-p": "top_p", "nucleus": "top_p", "top-n-sigma": "top_n_sigma",
                    "typical-p": "typ_p", "typical": "typ_p", "typ-p": "typ_p", "typ": "typ_p", "min-p": "min_p",
                    "temp": "temperature"}
# log(FLT_MAX): llama.cpp caps DRY's exponent so that base ** exponent stays a finite float.
_FLOAT_MAX_LOG = 88.7228391
# Mirostat (v1) estimates Zipf's exponent from the m most likely tokens; llama.cpp's common sampler uses 100.
MIROSTAT_M = 100


def sampler_order(value: str | Sequence[str]) -> tuple[str, ...]:
    """A chain's order from llama.cpp's spellings: names (a list), or --sampling-seq letters (a string)."""
    if isinstance(value, str):
        by_letter = {letter: name for name, letter in SAMPLER_LETTERS.items()}
        unknown = next((c for c in value if c not in by_letter), None)
        if unknown is not None:
            raise LlogosError(f"unknown sampler letter '{unknown}' (llama.cpp's: "
                              + ", ".join(f"{letter} {name}" for name, letter in SAMPLER_LETTERS.items()) + ")")
        return tuple(by_letter[c] for c in value)
    names = tuple(_SAMPLER_ALIASES.get(name, name) for name in value)
    unknown = next((given for given, name in zip(value, names) if name not in SAMPLER_LETTERS), None)
    if unknown is not None:
        raise LlogosError(f"unknown sampler '{unknown}' (llama.cpp's: {', '.join(SAMPLER_LETTERS)})")
    return names


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits.astype(np.float64) - logits.max())
    return e / e.sum()


def _by_logit(ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-logits, kind="stable")
    return ids[order], logits[order]


def _at_least(cut: int, min_keep: int, size: int) -> int:
    return min(max(cut, min_keep), size)


def _among(ids: np.ndarray, tokens: dict) -> np.ndarray:
    """Where the candidates are any of `tokens` (a table over the ids' range: ids are a vocabulary's)."""
    if not tokens:
        return np.empty(0, np.int64)
    return np.flatnonzero(np.isin(ids, np.fromiter(tokens, np.int64, len(tokens)), kind="table"))


def penalize(ids: np.ndarray, logits: np.ndarray, counts: dict[int, int], repeat: float, frequency: float,
             presence: float) -> np.ndarray:
    """Repetition penalties of tokens seen `counts` times: a positive logit divided by `repeat`, a
    negative one multiplied (dividing would favour it), then frequency x count and presence off."""
    hit = _among(ids, counts)
    if not hit.size:
        return logits
    logits = logits.copy()
    n = np.array([counts[int(t)] for t in ids[hit]], np.float32)
    value = logits[hit]
    value = np.where(value <= 0, value * repeat, value / repeat)
    logits[hit] = value - n * frequency - presence
    return logits


def subtract(ids: np.ndarray, logits: np.ndarray, penalties: dict[int, float]) -> np.ndarray:
    """Each token's penalty off its logit (DRY's, computed from the history in engine/dry.py)."""
    hit = _among(ids, penalties)
    if not hit.size:
        return logits
    logits = logits.copy()
    logits[hit] -= np.array([penalties[int(t)] for t in ids[hit]], np.float32)
    return logits


def dry_penalty(multiplier: float, base: float, allowed_length: int, repeat_length: int) -> float:
    """What DRY takes off a token that would extend a repeat of `repeat_length` tokens."""
    exponent = repeat_length - allowed_length
    if base > 1.000001:
        exponent = min(exponent, int(_FLOAT_MAX_LOG / math.log(base)))
    return multiplier * base ** exponent


def top_k(ids, logits, k: int):
    if k <= 0 or k >= len(ids):
        return ids, logits
    keep = np.argpartition(-logits, k - 1)[:k]
    return ids[keep], logits[keep]


def top_p(ids, logits, p: float, min_keep: int):
    """The smallest most-likely prefix whose probability reaches p."""
    if p >= 1.0:
        return ids, logits
    ids, logits = _by_logit(ids, logits)
    reached = np.flatnonzero(np.cumsum(softmax(logits)) >= p)
    cut = int(reached[0]) + 1 if reached.size else len(ids)
    cut = _at_least(cut, min_keep, len(ids))
    return ids[:cut], logits[:cut]


def min_p(ids, logits, p: float, min_keep: int):
    """Tokens at least p times as likely as the best one."""
    if p <= 0.0:
        return ids, logits
    ids, logits = _by_logit(ids, logits)
    cut = int(np.count_nonzero(logits >= logits[0] + np.float32(math.log(p))))
    cut = _at_least(cut, min_keep, len(ids))
    return ids[:cut], logits[:cut]


def typical(ids, logits, p: float, min_keep: int):
    """Locally typical sampling: tokens whose surprise is closest to the distribution's entropy,
    in that order, until their probability passes p (strictly, unlike top-p)."""
    if p >= 1.0:
        return ids, logits
    ids, logits = _by_logit(ids, logits)
    probs = softmax(logits)
    with np.errstate(divide="ignore"):
        surprise = -np.log(probs)
    entropy = float(np.sum(probs * np.where(probs > 0, surprise, 0.0)))
    order = np.argsort(np.abs(surprise - entropy), kind="stable")
    passed = np.flatnonzero(np.cumsum(probs[order]) > p)
    cut = int(passed[0]) + 1 if passed.size else len(ids)
    keep = order[:_at_least(cut, min_keep, len(ids))]
    return ids[keep], logits[keep]


def top_n_sigma(ids, logits, n: float):
    """Tokens within n standard deviations (of all the candidates' logits) of the best logit."""
    if n <= 0.0 or len(ids) <= 1:
        return ids, logits
    x = logits.astype(np.float64)
    keep = x >= x.max() - n * x.std()
    return ids[keep], logits[keep]


def xtc(ids, logits, threshold: float, min_keep: int):
    """Exclude Top Choices: of the tokens at least `threshold` likely, all but the least likely go.
    The caller has drawn whether XTC acts at this step (xtc_applies)."""
    ids, logits = _by_logit(ids, logits)
    above = int(np.count_nonzero(softmax(logits) >= threshold))
    drop = above - 1   # keep the least likely of them, so that some likely token survives
    if drop <= 0 or len(ids) - drop < min_keep:
        return ids, logits
    return ids[drop:], logits[drop:]


def xtc_applies(probability: float, threshold: float, n_candidates: int) -> bool:
    """Whether XTC can act at all; only then does llama.cpp draw its chance."""
    return probability > 0.0 and threshold <= 0.5 and n_candidates >= 2


def temperature(ids, logits, temp: float):
    """Logits over the temperature; at 0 or below, the best token alone (greedy)."""
    if temp <= 0.0:
        best = int(np.argmax(logits))
        return ids[best:best + 1], logits[best:best + 1]
    return ids, logits / np.float32(temp)


def mirostat_k(probs: np.ndarray, mu: float, n_vocab: int) -> float:
    """Mirostat (v1)'s top-k for surprise mu: Zipf's exponent s estimated from the most likely
    tokens' probabilities (`probs`: at least those, sorted, descending), then
    k = (e 2^mu / (1 - N^-e))^(1/s), e = s - 1. Not finite when the estimate fails (one token)."""
    m = min(MIROSTAT_M - 1, len(probs) - 1)
    if m <= 0:
        return math.nan
    i = np.arange(m, dtype=np.float64)
    t = np.log((i + 2) / (i + 1))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        b = np.log(probs[:m] / probs[1:m + 1])
        s = float(np.sum(t * b) / np.sum(t * t))
        e = s - 1.0
        return (e * 2.0 ** mu / (1.0 - float(n_vocab) ** -e)) ** (1.0 / s)


def mirostat(ids, logits, version: int, mu: float, n_vocab: int):
    """The tokens Mirostat's mu allows: v1, the top k its estimate gives; v2, those whose surprise,
    -log2 p, is at most mu (at least the best one)."""
    probs = softmax(logits)
    if version == 2:
        with np.errstate(divide="ignore"):
            keep = np.flatnonzero(-np.log2(probs) <= mu)
        if not keep.size:
            keep = np.array([np.argmax(probs)])
        return ids[keep], logits[keep]
    top = np.argpartition(-probs, min(MIROSTAT_M, len(probs)) - 1)[:MIROSTAT_M]
    k = mirostat_k(np.sort(probs[top])[::-1], mu, n_vocab)
    k = min(max(int(k), 1), len(ids)) if math.isfinite(k) else len(ids)
    return top_k(ids, logits, k)
