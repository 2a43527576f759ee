"""The NumPy backend's recurrence ops (Gated DeltaNet's delta rule, the short convolution, and
their activations) against plain loops: what Qwen3.5's and LFM2's recurrent layers are built of."""

import numpy as np
import pytest

from llogos_cli.backends.cpu.numpy_backend import Matrix, NumpyBackend


def reference_delta_net(q, k, v, g, beta, state):
    """The gated delta rule one token and one head at a time, state as (dv, dk) per head."""
    T, n_k, _ = q.shape
    n_v = v.shape[1]
    S = state.astype(np.float64)
    out = np.zeros(v.shape, np.float64)
    for t in range(T):
        for h in range(n_v):
            qh, kh = q[t, h % n_k].astype(np.float64), k[t, h % n_k].astype(np.float64)
            S[h] *= np.exp(g[t, h])
            S[h] += beta[t, h] * np.outer(v[t, h] - S[h] @ kh, kh)
            out[t, h] = S[h] @ qh
    return out, S


def random_delta_inputs(rng, T, n_k=2, n_v=6, dk=8, dv=5):
    """q, k, v, g, beta, state; dk != dv and n_v = 3 n_k so a transposed state or a wrong head
    mapping shows. Queries and keys are unit vectors, as the model's l2norm makes them."""
    def unit(shape):
        a = rng.standard_normal(shape)
        return (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)
    return (unit((T, n_k, dk)), unit((T, n_k, dk)), rng.standard_normal((T, n_v, dv)).astype(np.float32),
            -rng.exponential(0.5, (T, n_v)).astype(np.float32), rng.uniform(0, 1, (T, n_v)).astype(np.float32),
            rng.standard_normal((n_v, dv, dk)).astype(np.float32))


@pytest.mark.parametrize("pieces", [[150], [1] * 30, [63, 1, 2, 64, 70]], ids=["chunked", "steps", "mixed"])
def test_delta_net_matches_token_by_token_loop(pieces):
    q, k, v, g, beta, state0 = random_delta_inputs(np.random.default_rng(0), sum(pieces))
    expected, expected_state = reference_delta_net(q, k, v, g, beta, state0)
    b, state = NumpyBackend(), state0[None].copy()
    bounds = np.cumsum([0] + pieces)
    out = np.concatenate([b.delta_net(q[s], k[s], v[s], g[s], beta[s], state, one_run(b, s.start, s.stop))
                          for s in (slice(a, e) for a, e in zip(bounds, bounds[1:]))])
    assert out.dtype == np.float32 and out.shape == v.shape
    np.testing.assert_allclose(out, expected, rtol=0, atol=2e-5 * np.abs(expected).max())
    np.testing.assert_allclose(state[0], expected_state, rtol=0, atol=2e-5 * np.abs(expected_state).max())


def one_run(b, pos0: int, pos1: int):
    """The batch layout of one sequence's tokens at positions pos0..pos1-1 in slot 0."""
    return b.batch_layout(np.zeros(pos1 - pos0, np.int32), np.arange(pos0, pos1, dtype=np.int32))


def test_delta_net_survives_strong_decay():
    """Decays summing far below log(float32 tiny) within a chunk must not overflow or give NaN."""
    q, k, v, g, beta, state0 = random_delta_inputs(np.random.default_rng(1), 64)
    g = (g * 100).astype(np.float32)                     # cumulative log-decay near -3000
    expected, expected_state = reference_delta_net(q, k, v, g, beta, state0)
    b, state = NumpyBackend(), state0[None].copy()
    out = b.delta_net(q, k, v, g, beta, state, one_run(b, 0, len(q)))
    np.testing.assert_allclose(out, expected, rtol=0, atol=2e-5 * np.abs(expected).max())
    np.testing.assert_allclose(state[0], expected_state, rtol=0, atol=2e-5 * np.abs(expected_state).max())


def test_ssm_conv_with_carried_state_equals_one_long_convolution():
    rng = np.random.default_rng(2)
    C, K, T = 12, 4, 25
    x = rng.standard_normal((T, C)).astype(np.float32)
    w = rng.standard_normal((C, K)).astype(np.float32)
    # Causal depthwise convolution from zeros, one channel at a time: out[t] = sum_j w[j] x[t + j - (K-1)].
    expected = np.stack([np.convolve(x[:, c], w[c, ::-1])[:T] for c in range(C)], axis=1)
    b, kernel = NumpyBackend(), Matrix(raw=None, qtype=None, dense=w, in_products=True)
    conv_state = b.zeros((1, K - 1, C))
    out = np.concatenate([b.ssm_conv(x[a:e], conv_state, kernel, one_run(b, a, e))
                          for a, e in [(0, 7), (7, 8), (8, 10), (10, T)]])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(conv_state[0], x[-(K - 1):])


def test_softplus_and_silu():
    b = NumpyBackend()
    x = np.array([-100, -3, -0.5, 0, 0.5, 3, 100], np.float32)
    np.testing.assert_allclose(b.softplus(x), np.log1p(np.exp(x.astype(np.float64))), rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(b.silu(x), x / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6, atol=1e-30)
    assert b.softplus(x).dtype == b.silu(x).dtype == np.float32
