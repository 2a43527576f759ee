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

    def ssm_conv(self, x: np.ndarray, conv_state: np.ndarray, w) -> np.ndarray:
        """Causal depthwise convolution of x (T, C), continuing from conv_state (K-1, C), the
        inputs before x; w holds the (C, K) kernel. Advances conv_state in place; -> (T, C)."""
        T, kernel = x.shape[0], w.dense.shape[1]
        xs = np.concatenate([conv_state, x])                          # (K-1+T, C)
        out = xs[0:T] * w.dense[:, 0]
        for j in range(1, kernel):
            out += xs[j:j + T] * w.dense[:, j]
        conv_state[:] = xs[T:]
        return out

    def delta_net(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                  state: np.ndarray) -> np.ndarray:
        """Gated delta rule over T tokens. q, k (T, Hk, dk); v (T, Hv, dv); g (log-decay, <= 0) and
        beta (T, Hv); state (Hv, dv, dk), advanced in place. Value head h reads key head h % Hk
        (tiled, as ggml broadcasts; llama.cpp's converter orders the value heads to match).
        -> (T, Hv, dv)."""
        T, n_k = q.shape[:2]
        tiles = (1, v.shape[1] // n_k, 1)
        q = np.tile(q, tiles).transpose(1, 0, 2)                      # (Hv, T, dk)
        k = np.tile(k, tiles).transpose(1, 0, 2)                      # (Hv, T, dk)
        v = v.transpose(1, 0, 2)                                      # (Hv, T, dv)
        g, beta = g.T, beta.T                                         # (Hv, T)
        if T == 1:
            out = _step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], state)[:, None]
        else:
            out = np.empty(v.shape, np.float32)                       # (Hv, T, dv)
            for t0 in range(0, T, _CHUNK):
                c = slice(t0, t0 + _CHUNK)
                out[:, c] = _chunk(q[:, c], k[:, c], v[:, c], g[:, c], beta[:, c], state)
        return np.ascontiguousarray(out.transpose(1, 0, 2))          # (T, Hv, dv)


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
