"""Recurrent ops on the NumPy backend: the causal convolution and gated delta rule of Gated DeltaNet.

The delta-rule state of a value head is a (dv, dk) matrix S, laid out like a weight (out, in):
reading it with a key gives a value, S @ k. One token t with log-decay g, strength beta does

    S <- exp(g) S                          decay
    S <- S + beta (v - S k) k^T            move S k towards v (the delta rule)
    o  = S q

Decode takes that step. Prefill solves a chunk of tokens at once with matrix products (_chunk),
twice as fast as stepping for 512 tokens through 16 heads of 128 x 128, and equal to it in float32.
"""

import numpy as np

# Prefill solves this many tokens at a time (llama.cpp's size): a (C, C) triangular system per head.
_CHUNK = 64


class RecurrentOps:
    """Mixed into NumpyBackend."""

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape, np.float32)

    def softplus(self, x: np.ndarray) -> np.ndarray:
        return np.logaddexp(np.float32(0), x)  # log(1 + e^x) without overflow for large x

    def ssm_conv(self, x: np.ndarray, conv_state: np.ndarray, w, layout) -> np.ndarray:
        """Causal depthwise convolution of x (T, C), each run continuing its slot's conv_state
        (n_slots, K-1, C), the inputs before it; w holds the (C, K) kernel. Advances the state in
        place; -> (T, C)."""
        out = np.empty_like(x)
        rows = layout.rows
        if len(rows):   # decode rows: one token each, all at once
            slots = layout.slots[rows]
            xs = np.concatenate([conv_state[slots], x[rows, None]], axis=1)   # (R, K, C)
            out[rows] = _taps(xs, w.dense, 1)
            conv_state[slots] = xs[:, 1:]
        for slot, t0, t1 in layout.runs:
            out[t0:t1] = _conv(x[t0:t1], conv_state[slot], w.dense)
        return out

    def delta_net(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                  state: np.ndarray, layout) -> np.ndarray:
        """Gated delta rule. q, k (T, Hk, dk); v (T, Hv, dv); g (log-decay, <= 0) and beta (T, Hv);
        state (n_slots, Hv, dv, dk), each run advancing its slot's in place. Value head h reads key
        head h % Hk (tiled, as ggml broadcasts; llama.cpp's converter orders the value heads to
        match). -> (T, Hv, dv)."""
        T, n_k = q.shape[:2]
        n_v, dv = v.shape[1:]
        tiles = (1, n_v // n_k, 1)
        q, k = np.tile(q, tiles), np.tile(k, tiles)                   # (T, Hv, dk)
        out = np.empty(v.shape, np.float32)
        rows = layout.rows
        if len(rows):   # decode rows: rows x heads stepped as one stack of heads
            slots = layout.slots[rows]
            R, dk = len(rows), q.shape[2]
            S = state[slots].reshape(R * n_v, dv, dk)
            o = _step(q[rows].reshape(-1, dk), k[rows].reshape(-1, dk), v[rows].reshape(-1, dv),
                      g[rows].reshape(-1), beta[rows].reshape(-1), S)
            state[slots] = S.reshape(R, n_v, dv, dk)
            out[rows] = o.reshape(R, n_v, dv)
        for slot, t0, t1 in layout.runs:
            c = slice(t0, t1)
            out[c] = _sequence(q[c].transpose(1, 0, 2), k[c].transpose(1, 0, 2), v[c].transpose(1, 0, 2),
                               g[c].T, beta[c].T, state[slot]).transpose(1, 0, 2)
        return out


def _conv(x: np.ndarray, conv_state: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """One sequence: x (T, C) after conv_state (K-1, C), advanced in place; -> (T, C)."""
    xs = np.concatenate([conv_state, x])                              # (K-1+T, C)
    conv_state[:] = xs[x.shape[0]:]
    return _taps(xs, kernel, 0)


def _taps(xs: np.ndarray, kernel: np.ndarray, axis: int) -> np.ndarray:
    """out[t] = sum_j kernel[:, j] * xs[t + j] along `axis` of xs, tap by tap in the same order for
    every row, so a row's result does not depend on what else is in the batch."""
    K = kernel.shape[1]
    T = xs.shape[axis] - K + 1
    take = (lambda j: xs[j:j + T]) if axis == 0 else (lambda j: xs[:, j])
    out = take(0) * kernel[:, 0]
    for j in range(1, K):
        out += take(j) * kernel[:, j]
    return out


def _sequence(q, k, v, g, beta, S):
    """One sequence of T tokens: q, k (H, T, dk); v (H, T, dv); g, beta (H, T); S (H, dv, dk) in
    place. -> (H, T, dv)."""
    out = np.empty(v.shape, np.float32)
    for t0 in range(0, q.shape[1], _CHUNK):
        c = slice(t0, t0 + _CHUNK)
        out[:, c] = _chunk(q[:, c], k[:, c], v[:, c], g[:, c], beta[:, c], S)
    return out


def _step(q, k, v, g, beta, S):
    """One token: q, k (H, dk); v (H, dv); g, beta (H,); S (H, dv, dk) in place. -> (H, dv)."""
    S *= np.exp(g)[:, None, None]
    u = beta[:, None] * (v - np.einsum("hvk,hk->hv", S, k))          # (H, dv)
    S += u[:, :, None] * k[:, None, :]
    return np.einsum("hvk,hk->hv", S, q)


def _chunk(q, k, v, g, beta, S):
    """C tokens at once: q, k (H, C, dk); v (H, C, dv); g, beta (H, C); S (H, dv, dk) in place.

    With G the running sum of g, the state after token t is
        S_t = e^{G_t} S + sum_{s<=t} e^{G_t - G_s} u_s k_s^T,
    where u_s is token s's correction beta_s (v_s - e^{g_s} S_{s-1} k_s). Each u depends on the
    earlier ones through a unit lower-triangular system, so the loop over tokens becomes one solve
    and a few (C, C) products. -> (H, C, dv).
    """
    C = q.shape[1]
    G = np.cumsum(g, axis=1)                                          # (H, C)
    causal = np.tril(np.ones((C, C), bool))
    # e^{G_t - G_s} for s <= t, 0 above the diagonal; masking before exp keeps it from overflowing.
    decay = np.exp(np.where(causal, G[:, :, None] - G[:, None, :], -np.inf))   # (H, C, C)
    kk = beta[:, :, None] * decay * (k @ k.transpose(0, 2, 1))        # (H, C, C)
    system = np.eye(C, dtype=np.float32) + np.tril(kk, -1)            # (H, C, C) unit lower
    rhs = beta[:, :, None] * (v - np.exp(G)[:, :, None] * (k @ S.transpose(0, 2, 1)))  # (H, C, dv)
    u = np.linalg.solve(system, rhs)                                  # (H, C, dv)
    out = np.exp(G)[:, :, None] * (q @ S.transpose(0, 2, 1)) + (decay * (q @ k.transpose(0, 2, 1))) @ u
    to_end = np.exp(G[:, -1:] - G)                                    # (H, C) decay to the chunk's end
    S *= np.exp(G[:, -1])[:, None, None]
    S += u.transpose(0, 2, 1) @ (to_end[:, :, None] * k)              # (H, dv, dk)
    return out                                                        # (H, C, dv)
