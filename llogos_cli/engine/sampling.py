"""Token sampling with llama.cpp's flags, defaults and order of operations.

The chain is llama.cpp's default: logit bias -> penalties -> top-k -> top-p -> min-p -> temperature -> draw.
Truncation happens before temperature, so top-p and min-p see the untempered distribution.
"""

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from llogos_cli.errors import LlogosError


# llama.cpp's spelling of "draw a seed" (its default), which scripts and clients written for it pass.
DRAW_SEED = -1
# A request's sampling fields, as the OpenAI API and llama-server spell them (a server request, a
# line of `llogos batch`) -> the SamplingParams field each sets.
REQUEST_FIELDS = {"temperature": "temp", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                  "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                  "repeat_penalty": "repeat_penalty", "seed": "seed"}

@dataclass(frozen=True, slots=True)
class SamplingParams:
    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64          # -1: the whole context, 0: no penalties
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None          # None: a fresh random seed (DRAW_SEED on a command line or in a request)
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, added to its logit), OpenAI's logit_bias

    def __post_init__(self):
        checks = [
            (math.isfinite(self.temp), "--temp must be a finite number"),
            (0.0 <= self.top_p <= 1.0, "--top-p must be between 0 and 1"),
            (0.0 <= self.min_p <= 1.0, "--min-p must be between 0 and 1"),
            (self.repeat_penalty > 0.0, "--repeat-penalty must be greater than 0"),
            (self.repeat_last_n >= -1, "--repeat-last-n must be -1, 0 or a positive count"),
            (math.isfinite(self.presence_penalty) and math.isfinite(self.frequency_penalty),
             "penalties must be finite numbers"),
            (self.seed is None or 0 <= self.seed < 2 ** 64, "--seed must be between 0 and 2^64-1"),
            (all(math.isfinite(bias) for _, bias in self.logit_bias), "logit biases must be finite numbers"),
        ]
        for ok, message in checks:
            if not ok:
                raise LlogosError(message)

    @property
    def greedy(self) -> bool:
        return self.temp <= 0.0

    @property
    def penalized(self) -> bool:
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0)


@dataclass(frozen=True, slots=True)
class SamplingOverrides:
    """The sampling flags given on a command line (None: not given), named as SamplingParams' fields."""
    temp: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None

    def params(self, model_defaults: dict) -> SamplingParams:
        """The flags over the model's [models.X.sampling] defaults over SamplingParams' own."""
        values = {}
        for name in SamplingParams.__slots__:
            given = getattr(self, name, None)
            if given is not None:
                values[name] = given
            elif name in model_defaults:
                values[name] = model_defaults[name]
        try:
            return SamplingParams(**values)
        except TypeError as e:
            raise LlogosError(f"bad sampling default in models.toml: {e}") from None


def draw_seed() -> int:
    """A fresh random seed, for a run or a request that names none."""
    return int(np.random.SeedSequence().entropy % 2 ** 32)


class Sampler:
    def __init__(self, params: SamplingParams, n_ctx: int):
        self.params = params
        self.seed = params.seed if params.seed is not None else draw_seed()
        self.rng = np.random.default_rng(self.seed)
        self.window = n_ctx if params.repeat_last_n == -1 else params.repeat_last_n
        self.history: list[int] = []

    @property
    def plain_greedy(self) -> bool:
        """Greedy with no penalties or biases: the token is the argmax of the raw logits."""
        return self.params.greedy and not self.params.penalized and not self.params.logit_bias

    def accept(self, token_id: int) -> None:
        """Record a prompt or generated token for the repetition penalties."""
        self.history.append(token_id)

    def sample(self, logits: np.ndarray, allowed: np.ndarray | None = None) -> int:
        """The next token. `allowed` (bools, one per logit) leaves only those tokens in the running,
        after the penalties and before truncation, so a grammar binds greedy and sampled rows alike."""
        p = self.params
        logits = logits.astype(np.float32, copy=True)
        for token_id, bias in p.logit_bias:
            logits[token_id] += bias
        if p.penalized:
            self._penalize(logits)
        if allowed is not None:
            logits[~allowed] = -np.inf
        if p.greedy:
            return int(np.argmax(logits))
        ids = np.arange(len(logits))
        if 0 < p.top_k < len(logits):
            keep = np.argpartition(-logits, p.top_k - 1)[:p.top_k]
            ids, logits = ids[keep], logits[keep]
        order = np.argsort(-logits, kind="stable")
        ids, logits = ids[order], logits[order]
        if p.top_p < 1.0:
            probs = _softmax(logits)
            cut = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1   # smallest prefix reaching top_p
            ids, logits = ids[:cut], logits[:cut]
        if p.min_p > 0.0:
            keep = logits >= logits[0] + math.log(p.min_p)
            ids, logits = ids[keep], logits[keep]
        probs = _softmax(logits, p.temp)
        return int(ids[self.rng.choice(len(ids), p=probs)])

    def _penalize(self, logits: np.ndarray) -> None:
        p = self.params
        recent = self.history[-self.window:] if self.window > 0 else []
        for token_id, count in Counter(recent).items():
            value = logits[token_id]
            value = value * p.repeat_penalty if value <= 0 else value / p.repeat_penalty
            logits[token_id] = value - count * p.frequency_penalty - p.presence_penalty


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max()
    return x - np.log(np.exp(x).sum())


def token_logprobs(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """log p(ids[i]) under each row of logits (rows, vocab), in float64."""
    x = logits.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    return x[np.arange(len(ids)), ids] - np.log(np.exp(x).sum(axis=1))


def top_logprobs(logits: np.ndarray, n: int) -> list[tuple[int, float]]:
    """The n most likely tokens of the full-vocabulary log-softmax, before any sampling transform."""
    lp = log_softmax(logits)
    top = np.argpartition(-lp, min(n, len(lp)) - 1)[:n]
    top = top[np.argsort(-lp[top], kind="stable")]
    return [(int(i), float(lp[i])) for i in top]


def _softmax(x: np.ndarray, temp: float = 1.0) -> np.ndarray:
    # Shifted before dividing, so even a vanishing temperature cannot overflow (inf - inf = NaN).
    e = np.exp((x.astype(np.float64) - x.max()) / temp)
    return e / e.sum()
