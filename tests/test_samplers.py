"""llama.cpp's samplers beyond top-k/top-p/min-p: locally typical, top-n-sigma, XTC, Mirostat v1
and v2, DRY, min-keep and the chain's order. Each is checked on fixed logits against its rule
computed here, step by step in plain Python: the tokens it keeps and their renormalized
probabilities."""

import math
import statistics

import numpy as np
import pytest

from llogos_cli.engine.dry import Dry, repeat_lengths, sequence_breakers
from llogos_cli.engine.samplers import DEFAULT_SAMPLERS, dry_penalty, sampler_order
from llogos_cli.engine.sampling import Sampler, SamplingParams
from llogos_cli.errors import LlogosError

# Every sampler of the default chain off: the draw is from softmax(logits) itself.
OFF = dict(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1)
PROBS = [0.35, 0.25, 0.2, 0.1, 0.06, 0.04]
LOGITS = np.log(np.array(PROBS)).astype(np.float32)


def kept(params: SamplingParams, logits=LOGITS, history=(), allowed=None) -> dict[int, float]:
    sampler = Sampler(params, n_ctx=1000)
    for t in history:
        sampler.accept(t)
    ids, probs = sampler.distribution(logits, allowed)
    return {int(i): float(p) for i, p in zip(ids, probs)}


def renormalized(logits, ids, temp: float = 1.0) -> dict[int, float]:
    weights = {i: math.exp(float(logits[i]) / temp) for i in ids}
    total = sum(weights.values())
    return {i: w / total for i, w in weights.items()}


def assert_distribution(got: dict[int, float], want: dict[int, float]) -> None:
    assert set(got) == set(want)
    for i, p in want.items():
        assert got[i] == pytest.approx(p, rel=1e-5)


def test_all_off_draws_from_the_softmax():
    assert_distribution(kept(SamplingParams(**OFF)), dict(enumerate(PROBS)))


@pytest.mark.parametrize("p", [0.3, 0.5, 0.85, 0.93])
def test_typical_keeps_the_tokens_nearest_the_entropy_until_p_is_passed(p):
    entropy = -sum(q * math.log(q) for q in PROBS)
    by_typicality = sorted(range(len(PROBS)), key=lambda i: abs(-math.log(PROBS[i]) - entropy))
    want, total = [], 0.0
    for i in by_typicality:
        want.append(i)
        total += PROBS[i]
        if total > p:
            break
    assert_distribution(kept(SamplingParams(**OFF, typical_p=p)), renormalized(LOGITS, want))


def test_typical_may_leave_out_the_most_likely_token():
    # Entropy 1.09 nats; surprises 0.92, 1.20, 1.20: the two less likely tokens are nearer it.
    logits = np.log(np.array([0.4, 0.3, 0.3])).astype(np.float32)
    assert_distribution(kept(SamplingParams(**OFF, typical_p=0.5), logits), renormalized(logits, [1, 2]))


def test_min_keep_holds_a_floor_under_typical_top_p_and_min_p():
    for cut in (dict(typical_p=0.01), dict(top_p=0.01), dict(min_p=0.99)):
        assert len(kept(SamplingParams(**(OFF | cut)))) == 1
        assert len(kept(SamplingParams(**(OFF | cut), min_keep=3))) == 3


@pytest.mark.parametrize("n", [0.5, 1.0, 2.0])
def test_top_n_sigma_keeps_logits_within_n_deviations_of_the_best(n):
    logits = np.array([10.0, 9.5, 8.0, 5.0, 1.0, 0.0], np.float32)
    floor = max(logits) - n * statistics.pstdev(logits.tolist())
    want = [i for i, x in enumerate(logits) if x >= floor]
    assert_distribution(kept(SamplingParams(**OFF, top_n_sigma=n), logits), renormalized(logits, want))


def test_top_n_sigma_off_at_zero_or_below():
    assert len(kept(SamplingParams(**OFF, top_n_sigma=-1.0))) == len(PROBS)
    assert len(kept(SamplingParams(**OFF, top_n_sigma=0.0))) == len(PROBS)


def test_xtc_drops_the_likely_tokens_but_the_least_likely_of_them():
    # Above 0.15: 0.35, 0.25, 0.2; the least likely of them, 0.2, stays with those below.
    got = kept(SamplingParams(**OFF, xtc_probability=1.0, xtc_threshold=0.15))
    assert_distribution(got, renormalized(LOGITS, [2, 3, 4, 5]))


def test_xtc_leaves_the_list_alone_when_it_cannot_act():
    whole = set(range(len(PROBS)))
    assert set(kept(SamplingParams(**OFF, xtc_probability=1.0, xtc_threshold=0.3))) == whole   # one above
    assert set(kept(SamplingParams(**OFF, xtc_probability=1.0, xtc_threshold=0.6))) == whole   # over 0.5: off
    assert set(kept(SamplingParams(**OFF, xtc_probability=0.0, xtc_threshold=0.15))) == whole
    # Dropping two of six would leave 4 < min_keep 5.
    assert set(kept(SamplingParams(**OFF, xtc_probability=1.0, xtc_threshold=0.15, min_keep=5))) == whole


def test_xtc_acts_at_the_given_rate_with_its_own_draws():
    params = SamplingParams(**OFF, xtc_probability=0.3, xtc_threshold=0.15)
    sampler = Sampler(params, 100)
    acted = sum(len(sampler.distribution(LOGITS)[0]) == 4 for _ in range(2000))
    assert abs(acted / 2000 - 0.3) < 0.04
    # Its chances come from a stream of their own: drawing them (and never acting) leaves the tokens as they were.
    plain, with_xtc = Sampler(SamplingParams(**OFF), 100), Sampler(SamplingParams(**OFF, xtc_probability=1e-9,
                                                                                   xtc_threshold=0.15), 100)
    assert [plain.sample(LOGITS) for _ in range(50)] == [with_xtc.sample(LOGITS) for _ in range(50)]


def test_greedy_runs_the_chain_before_temperature_as_llama_cpp_does():
    # XTC drops 0 and 1 before temperature 0 picks the best of what is left.
    assert kept(SamplingParams(temp=0.0, xtc_probability=1.0, xtc_threshold=0.15)) == {2: 1.0}
    assert not Sampler(SamplingParams(temp=0.0, xtc_probability=1.0), 10).plain_greedy
    assert Sampler(SamplingParams(temp=0.0, top_n_sigma=1.0), 10).plain_greedy   # keeps the best anyway
    # With temperature out of the chain, --temp 0 does not make it greedy.
    assert len(kept(SamplingParams(**(OFF | dict(temp=0.0)), samplers=["top_k"]))) == len(PROBS)


def test_the_order_decides_what_truncation_sees():
    hot = dict(temp=4.0, top_k=0, min_p=0.0, top_p=0.58, seed=1)
    before = kept(SamplingParams(**hot, samplers=["top_p", "temperature"]))
    after = kept(SamplingParams(**hot, samplers=["temperature", "top_p"]))
    assert_distribution(before, renormalized(LOGITS, [0, 1], temp=4.0))   # 0.35 + 0.25 reaches 0.58
    assert len(after) > len(before)                                       # flattened first: more to reach it


def test_sampler_order_spellings():
    assert SamplingParams().samplers == DEFAULT_SAMPLERS == sampler_order("edskypmxt")
    assert sampler_order(["top-k", "nucleus", "typical", "temp"]) == ("top_k", "top_p", "typ_p", "temperature")
    assert SamplingParams(samplers="kt").samplers == ("top_k", "temperature")
    for bad in (["top_k", "warp"], "kz"):
        with pytest.raises(LlogosError, match="unknown sampler"):
            SamplingParams(samplers=bad)


def mirostat_v1_k(probs: list[float], mu: float, n_vocab: int, m: int = 100) -> int:
    num = den = 0.0
    for i in range(min(m - 1, len(probs) - 1)):
        t = math.log((i + 2) / (i + 1))
        num += t * math.log(probs[i] / probs[i + 1])
        den += t * t
    s = num / den
    e = s - 1
    return max(int((e * 2 ** mu / (1 - n_vocab ** -e)) ** (1 / s)), 1)


def zipf(n: int, s: float = 1.1) -> np.ndarray:
    return np.log(np.arange(1, n + 1, dtype=np.float64) ** -s).astype(np.float32)


@pytest.mark.parametrize("tau", [1.0, 2.0, 3.0])
def test_mirostat_v1_truncates_to_its_estimated_k(tau):
    logits = zipf(500)
    probs = np.exp(logits.astype(np.float64))
    probs = (probs / probs.sum()).tolist()
    k = mirostat_v1_k(probs, 2 * tau, len(logits))
    assert 1 <= k < 500
    assert_distribution(kept(SamplingParams(mirostat=1, mirostat_tau=tau, temp=1.0, seed=1), logits),
                        renormalized(logits, range(k)))


def test_mirostat_v2_keeps_tokens_no_more_surprising_than_mu_and_mu_follows_the_draws():
    params = SamplingParams(mirostat=2, mirostat_tau=1.1, mirostat_eta=0.1, temp=1.0, seed=5)
    # mu starts at 2 tau = 2.2 bits: only probabilities of 2^-2.2 = 0.22 or more.
    assert_distribution(kept(params), renormalized(LOGITS, [0, 1]))
    sampler, mu = Sampler(params, 100), 2.2
    for _ in range(20):
        ids, probs = sampler.distribution(LOGITS)   # only a draw moves mu
        token = sampler.sample(LOGITS)
        chosen = dict(zip(ids.tolist(), probs.tolist()))[token]
        mu -= 0.1 * (-math.log2(chosen) - 1.1)
        assert sampler.mu == pytest.approx(mu)


def test_mirostat_replaces_the_chain():
    # top_k 1 and the penalties are llama.cpp's chain, which Mirostat does without.
    params = SamplingParams(mirostat=2, mirostat_tau=5.0, top_k=1, repeat_penalty=5.0, temp=1.0)
    assert set(kept(params, history=[0, 1])) == set(range(len(PROBS)))


# ---------------------------------------------------------------------------------------------- DRY

def brute_repeat_lengths(window: list[int]) -> list[int]:
    out = []
    for j in range(len(window) - 1):
        n = 0
        while n <= j and window[j - n] == window[-1 - n]:
            n += 1
        out.append(n)
    return out


def test_repeat_lengths_match_the_suffixes_by_brute_force():
    # llama.cpp's own example: the text ends in "a b c", which also ends at the third token.
    abc = "a b c c b c y a b c".split()
    assert repeat_lengths(np.array([ord(c) for c in abc]), 99).tolist() == [0, 0, 3, 1, 0, 2, 0, 0, 0]
    rng = np.random.default_rng(0)
    for _ in range(50):
        window = rng.integers(0, 3, rng.integers(2, 40))
        assert repeat_lengths(window, 99).tolist() == brute_repeat_lengths(window.tolist())
        assert repeat_lengths(window, 2).tolist() == [min(n, 2) for n in brute_repeat_lengths(window.tolist())]


DRY = dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2)


def dry(history, breakers=None, **params) -> dict[int, float]:
    return Dry(SamplingParams(**(DRY | params)), 1000, breakers or {}).penalties(list(history))


def test_dry_penalizes_the_token_that_would_extend_a_repeat():
    # "1 2 3" ends the text and, earlier, was followed by 4: three tokens, one past the allowed two.
    assert dry([1, 2, 3, 4, 7, 1, 2, 3]) == {4: pytest.approx(0.8 * 1.75 ** 1)}
    assert dry([1, 2, 3, 4, 7, 1, 2, 3], dry_allowed_length=3) == {4: pytest.approx(0.8)}
    assert dry([1, 2, 3, 4, 7, 1, 2, 3], dry_allowed_length=4) == {}
    assert dry([1, 2, 3, 4, 7, 8, 2, 3]) == {4: pytest.approx(0.8)}   # only "2 3" repeats
    assert dry([1, 2, 3, 4, 7, 1, 2, 3], dry_penalty_last_n=5) == {}   # the earlier "1 2 3" is out of view


def test_dry_sequence_breakers_stop_a_match():
    history = [1, 2, 3, 4, 7, 1, 8, 2, 3]
    assert dry(history) == {4: pytest.approx(0.8)}
    # 8 breaks: no match reaches back past it, so only "2 3" counts, whatever came before.
    assert dry(history, {8: ((),)}) == {4: pytest.approx(0.8)}
    assert dry(history, {8: ((),)}, dry_allowed_length=3) == {}
    assert dry([1, 2, 3, 4, 7, 1, 2, 3], {1: ((),)}, dry_allowed_length=3) == {}
    # A breaker of two tokens counts only whole: 8 followed by 2.
    assert dry([1, 2, 3, 4, 8, 2, 3], {8: ((2,),)}) == {}
    assert dry([1, 2, 3, 4, 8, 5, 2, 3], {8: ((2,),)}) == {4: pytest.approx(0.8)}
    # A token that is a breaker on its own is never penalized.
    assert dry([1, 2, 8, 1, 2]) == {8: pytest.approx(0.8)}
    assert dry([1, 2, 8, 1, 2], {8: ((),)}) == {}


def test_dry_exponent_is_capped_and_applies_in_the_chain():
    assert math.isfinite(dry_penalty(1.0, 2.0, 0, 10_000))
    assert dry_penalty(1.0, 2.0, 0, 10_000) == 2.0 ** int(88.7228391 / math.log(2.0))
    params = SamplingParams(**(OFF | DRY))
    history = [1, 2, 3, 4, 7, 1, 2, 3]
    logits = np.zeros(8, np.float32)
    shifted = logits.copy()
    shifted[4] -= 0.8 * 1.75
    assert_distribution(kept(params, logits, history), renormalized(shifted, range(8)))


class Vocab:
    """A made-up vocabulary: token texts, and a greedy longest-match encoder over them."""

    def __init__(self, words: list[bytes]):
        self.words, self.n_vocab = words, len(words)

    def token_bytes(self, token_id: int, special: bool = False) -> bytes:
        return self.words[token_id]

    def encode(self, text: str, add_bos=None, parse_special=True) -> list[int]:
        data, ids = text.encode(), []
        while data:
            best = max((i for i, w in enumerate(self.words) if data.startswith(w)), key=lambda i: len(self.words[i]))
            ids.append(best)
            data = data[len(self.words[best]):]
        return ids


def test_breaker_strings_become_token_sequences():
    vocab = Vocab([b"a", b"b", b"\n", b"x\n", b"**", b"ab", b"c", b":", b"Us", b"er", b"User", b"xUs"])
    single = sequence_breakers(vocab, ("\n", "*"))
    assert single == {2: ((),), 3: ((),), 4: ((),)}
    # "User:" is inside no token; tokens ending in its start are heads followed by the rest's tokens.
    user = sequence_breakers(vocab, ("User:",))
    assert user == {8: ((9, 7),), 10: ((7,),), 11: ((9, 7),)}
    assert sequence_breakers(vocab, ("User:",)) is user   # worked out once per vocabulary


@pytest.mark.parametrize("bad", [dict(typical_p=1.5), dict(mirostat=3), dict(dry_multiplier=-1.0),
                                 dict(dry_base=0.5), dict(dry_allowed_length=-1), dict(dry_penalty_last_n=-2),
                                 dict(xtc_probability=2.0), dict(xtc_threshold=-0.1), dict(min_keep=-1),
                                 dict(top_n_sigma=math.nan), dict(mirostat_tau=math.inf),
                                 dict(logit_bias=((1, math.nan),))])
def test_bad_sampler_values_are_rejected(bad):
    with pytest.raises(LlogosError):
        SamplingParams(**bad)


def test_a_banned_token_and_a_grammar_mask_hold_through_the_chain():
    params = SamplingParams(**OFF, logit_bias=((0, -math.inf),), xtc_probability=1.0, xtc_threshold=0.15,
                            typical_p=0.99)
    allowed = np.array([True, True, False, True, True, True])
    got = kept(params, allowed=allowed)
    assert 0 not in got and 2 not in got and got
