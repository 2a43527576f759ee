"""Token sampling with llama.cpp's flags, defaults and order of operations.

A row's logits take the logit biases, then the grammar's mask, then llama.cpp's chain of
samplers in `samplers` order (by default penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p,
xtc, temperature), then the draw. Truncation comes before temperature, so top-p and min-p see
the untempered distribution. Mirostat replaces the chain: llama.cpp keeps only the temperature
before it. The samplers themselves are in engine/samplers.py, DRY in engine/dry.py.
"""

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from llogos_cli.engine import samplers
from llogos_cli.engine.samplers import DEFAULT_SAMPLERS, sampler_order
from llogos_cli.engine.dry import Dry, sequence_breakers
from llogos_cli.errors import LlogosError


# llama.cpp's spelling of "draw a seed" (its default), which scripts and clients written for it pass.
DRAW_SEED = -1
DRY_BREAKERS = ("\n", ":", "\"", "*")
# Samplers that never drop the most likely token: a greedy row need not run them.
_KEEP_BEST = frozenset({"top_n_sigma", "top_k", "top_p", "min_p"})
# XTC draws its chances from a generator of its own (the seed and this), as llama.cpp's XTC does,
# so that turning it on leaves the other draws as they were.
_XTC_STREAM = 1
# A request's sampling fields, as the OpenAI API and llama-server spell them (a server request, a
# line of `llogos batch`) -> the SamplingParams field each sets.
REQUEST_FIELDS = {"temperature": "temp", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                  "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                  "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n", "seed": "seed",
                  "typical_p": "typical_p", "mirostat": "mirostat", "mirostat_tau": "mirostat_tau",
                  "mirostat_eta": "mirostat_eta", "dry_multiplier": "dry_multiplier", "dry_base": "dry_base",
                  "dry_allowed_length": "dry_allowed_length", "dry_penalty_last_n": "dry_penalty_last_n",
                  "dry_sequence_breakers": "dry_sequence_breakers", "xtc_probability": "xtc_probability",
                  "xtc_threshold": "xtc_threshold", "top_n_sigma": "top_n_sigma", "min_keep": "min_keep",
                  "samplers": "samplers"}


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
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, added to its logit); -inf bans the token
    typical_p: float = 1.0           # locally typical sampling; 1: off
    mirostat: int = 0                # 0: off, 1: Mirostat, 2: Mirostat 2.0
    mirostat_tau: float = 5.0        # target surprise (--mirostat-ent)
    mirostat_eta: float = 0.1        # learning rate (--mirostat-lr)
    dry_multiplier: float = 0.0      # 0: DRY off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1     # -1: the whole context, 0: DRY off
    dry_sequence_breakers: tuple[str, ...] = DRY_BREAKERS
    xtc_probability: float = 0.0     # 0: XTC off
    xtc_threshold: float = 0.1       # above 0.5: XTC off
    top_n_sigma: float = -1.0        # 0 or below: off
    min_keep: int = 0                # top-p, min-p, typical and XTC leave at least this many tokens
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS   # the chain's order (a string: --sampling-seq letters)

    def __post_init__(self):
        # models.toml and requests give lists; the chain's order may come as letters.
        object.__setattr__(self, "samplers", sampler_order(self.samplers))
        object.__setattr__(self, "dry_sequence_breakers", tuple(self.dry_sequence_breakers))
        finite = (self.temp, self.presence_penalty, self.frequency_penalty, self.mirostat_tau, self.mirostat_eta,
                  self.dry_multiplier, self.top_n_sigma)
        checks = [
            (all(math.isfinite(v) for v in finite), "sampling parameters must be finite numbers"),
            (0.0 <= self.top_p <= 1.0, "--top-p must be between 0 and 1"),
            (0.0 <= self.min_p <= 1.0, "--min-p must be between 0 and 1"),
            (0.0 <= self.typical_p <= 1.0, "--typical must be between 0 and 1"),
            (self.repeat_penalty > 0.0, "--repeat-penalty must be greater than 0"),
            (self.repeat_last_n >= -1, "--repeat-last-n must be -1, 0 or a positive count"),
            (self.seed is None or 0 <= self.seed < 2 ** 64, "--seed must be between 0 and 2^64-1"),
            (all(not math.isnan(bias) and bias != math.inf for _, bias in self.logit_bias),
             "logit biases must be finite numbers (or -inf, which bans the token)"),
            (self.mirostat in (0, 1, 2), "--mirostat must be 0 (off), 1 (Mirostat) or 2 (Mirostat 2.0)"),
            (self.dry_multiplier >= 0.0, "--dry-multiplier must be 0 (off) or more"),
            (self.dry_base >= 1.0, "--dry-base must be at least 1"),
            (self.dry_allowed_length >= 0, "--dry-allowed-length must be 0 or more"),
            (self.dry_penalty_last_n >= -1, "--dry-penalty-last-n must be -1, 0 or a positive count"),
            (all(isinstance(s, str) for s in self.dry_sequence_breakers), "DRY sequence breakers must be strings"),
            (0.0 <= self.xtc_probability <= 1.0, "--xtc-probability must be between 0 and 1"),
            (0.0 <= self.xtc_threshold <= 1.0, "--xtc-threshold must be between 0 and 1"),
            (self.min_keep >= 0, "--min-keep must be 0 or more"),
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

    def acts(self, name: str) -> bool:
        """Whether a sampler of the chain changes anything with these settings."""
        return {"penalties": self.penalized,
                "dry": self.dry_multiplier != 0.0 and self.dry_penalty_last_n != 0,
                "top_n_sigma": self.top_n_sigma > 0.0,
                "top_k": self.top_k > 0,
                "typ_p": self.typical_p < 1.0,
                "top_p": self.top_p < 1.0,
                "min_p": self.min_p > 0.0,
                "xtc": samplers.xtc_applies(self.xtc_probability, self.xtc_threshold, 2),
                "temperature": True}[name]


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
    logit_bias: tuple[tuple[int, float], ...] | None = None
    typical_p: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: tuple[str, ...] | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    top_n_sigma: float | None = None
    min_keep: int | None = None
    samplers: tuple[str, ...] | None = None   # --samplers
    sampling_seq: str | None = None           # --sampling-seq: the same order in letters

    def params(self, model_defaults: dict) -> SamplingParams:
        """The flags over the model's [models.X.sampling] defaults over SamplingParams' own."""
        if self.samplers is not None and self.sampling_seq is not None:
            raise LlogosError("give the samplers' order with --samplers or with --sampling-seq, not both")
        given = {name: getattr(self, name, None) for name in SamplingParams.__slots__}
        if self.sampling_seq is not None:
            given["samplers"] = self.sampling_seq
        values = {}
        for name, value in given.items():
            if value is not None:
                values[name] = value
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
    """One sequence's sampling: its seeded draws, the tokens so far (for the penalties and DRY),
    and Mirostat's target surprise mu, which moves after every draw."""

    def __init__(self, params: SamplingParams, n_ctx: int, tokenizer=None):
        self.params = params
        self.seed = params.seed if params.seed is not None else draw_seed()
        self.rng = np.random.default_rng(self.seed)
        self.xtc_rng = np.random.default_rng([self.seed, _XTC_STREAM])
        self.mu = 2.0 * params.mirostat_tau
        self.window = n_ctx if params.repeat_last_n == -1 else params.repeat_last_n
        self.history: list[int] = []
        if tokenizer is not None:
            bad = next((t for t, _ in params.logit_bias if not 0 <= t < tokenizer.n_vocab), None)
            if bad is not None:
                raise LlogosError(f"logit bias: token id {bad} is not in the vocabulary (0..{tokenizer.n_vocab - 1})")
        self.chain = () if params.mirostat else tuple(name for name in params.samplers if params.acts(name))
        # Without a temperature step, llama.cpp draws from the untempered distribution even at --temp 0.
        self.greedy = params.greedy and "temperature" in self.chain
        # Greedy takes the best token the steps before temperature leave; those that keep it can be skipped.
        self.greedy_steps = self.chain[:self.chain.index("temperature")] if self.greedy else ()
        self.greedy_steps = tuple(name for name in self.greedy_steps if name not in _KEEP_BEST)
        self.dry = None
        if "dry" in self.chain:
            breakers = sequence_breakers(tokenizer, params.dry_sequence_breakers) if tokenizer is not None else {}
            self.dry = Dry(params, n_ctx, breakers)

    @property
    def plain_greedy(self) -> bool:
        """The token is the argmax of the raw logits: greedy, and nothing before it changes them."""
        return self.greedy and not self.greedy_steps and not self.params.logit_bias

    def accept(self, token_id: int) -> None:
        """Record a prompt or generated token for the penalties and DRY."""
        self.history.append(token_id)

    def sample(self, logits: np.ndarray, allowed: np.ndarray | None = None) -> int:
        """The next token. `allowed` (bools, one per logit) leaves only those tokens in the running,
        before the chain, so a grammar binds greedy and sampled rows alike."""
        ids, probs = self.distribution(logits, allowed)
        chosen = int(self.rng.choice(len(ids), p=probs)) if len(ids) > 1 else 0
        if self.params.mirostat:   # mu moves by how far the draw's surprise was off the target
            self.mu -= self.params.mirostat_eta * (-math.log2(probs[chosen]) - self.params.mirostat_tau)
        return int(ids[chosen])

    def distribution(self, logits: np.ndarray, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The tokens the next draw is among, and their probabilities: what the chain leaves of the
        logits. XTC's chance is drawn here, once per token."""
        p = self.params
        logits = logits.astype(np.float32, copy=True)
        for token_id, bias in p.logit_bias:
            logits[token_id] += bias
        if allowed is not None:
            logits[~allowed] = -np.inf
        ids = np.flatnonzero(logits > -np.inf)
        if not ids.size:   # everything banned: llama.cpp would draw among -inf alike
            return np.array([np.argmax(logits)]), np.ones(1)
        n_vocab, logits = len(logits), logits[ids]
        if p.mirostat:
            ids, logits = samplers.mirostat(*samplers.temperature(ids, logits, p.temp), p.mirostat, self.mu, n_vocab)
            return ids, samplers.softmax(logits)
        for name in self.greedy_steps if self.greedy else self.chain:
            ids, logits = self._step(name, ids, logits)
        if self.greedy:
            best = int(np.argmax(logits))
            return ids[best:best + 1], np.ones(1)
        return ids, samplers.softmax(logits)

    def _step(self, name: str, ids: np.ndarray, logits: np.ndarray):
        p = self.params
        if name == "penalties":
            recent = self.history[-self.window:]
            return ids, samplers.penalize(ids, logits, Counter(recent), p.repeat_penalty, p.frequency_penalty,
                                          p.presence_penalty)
        if name == "dry":
            return ids, samplers.subtract(ids, logits, self.dry.penalties(self.history))
        if name == "xtc":
            if samplers.xtc_applies(p.xtc_probability, p.xtc_threshold, len(ids)) \
                    and self.xtc_rng.random() <= p.xtc_probability:
                return samplers.xtc(ids, logits, p.xtc_threshold, p.min_keep)
            return ids, logits
        step = {"top_n_sigma": lambda: samplers.top_n_sigma(ids, logits, p.top_n_sigma),
                "top_k": lambda: samplers.top_k(ids, logits, p.top_k),
                "typ_p": lambda: samplers.typical(ids, logits, p.typical_p, p.min_keep),
                "top_p": lambda: samplers.top_p(ids, logits, p.top_p, p.min_keep),
                "min_p": lambda: samplers.min_p(ids, logits, p.min_p, p.min_keep),
                "temperature": lambda: samplers.temperature(ids, logits, p.temp)}[name]
        return step()

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
