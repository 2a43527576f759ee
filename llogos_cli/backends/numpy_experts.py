"""Mixture-of-experts ops on the NumPy backend: the router's choice, and the grouped expert product.

A layer's experts are one stacked matrix (n_expert * out, in), as the GGUF stores ffn_*_exps. The
product sorts the batch's (token, expert) pairs by expert and multiplies each chosen expert's rows
once, by all the tokens routed to it: a step streams each expert's matrix at most once, however
many of its tokens chose it.
"""

import numpy as np


class ExpertOps:
    """Mixed into NumpyBackend."""

    def route(self, logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Softmax router over logits (T, n_expert): each token's k most probable experts (T, k)
        int32, and their probabilities scaled to sum to 1 (T, k) float32."""
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        experts = np.argsort(-p, axis=1, kind="stable")[:, :k]
        weights = np.take_along_axis(p, experts, axis=1)
        return experts.astype(np.int32), (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)

    def matmul_experts(self, x: np.ndarray, w, experts: np.ndarray, n_expert: int,
                       weights: np.ndarray | None = None) -> np.ndarray:
        """Each token t through each of its experts e = experts[t, j] (T, k): x[t] (x (T, in)) or
        x[t, j] (x (T, k, in)) times expert e's block of the stacked w -> (T, k, out); with weights
        (T, k), the k results weighted and summed -> (T, out)."""
        T, k = experts.shape
        out = w.raw.shape[0] // n_expert
        rows = np.broadcast_to(x[:, None, :], (T, k, x.shape[-1])) if x.ndim == 2 else x
        y = np.empty((T, k, out), np.float32)
        pairs = np.argsort(experts.ravel(), kind="stable")            # (T * k,) grouped by expert
        chosen, starts = np.unique(experts.ravel()[pairs], return_index=True)
        for e, a, b in zip(chosen, starts, np.append(starts[1:], len(pairs))):
            t, j = np.divmod(pairs[a:b], k)
            y[t, j] = self._expert_product(np.ascontiguousarray(rows[t, j]), w, int(e) * out, out)
        if weights is None:
            return y
        return np.einsum("tk,tko->to", weights, y).astype(np.float32, copy=False)

    def _expert_product(self, x: np.ndarray, w, row0: int, n: int) -> np.ndarray:
        """x (R, in) times rows row0..row0+n of w: one expert's matrix, streamed once."""
        if w.dense is not None:
            return x @ w.dense[row0:row0 + n].T
        return self.quant_matmul(x, w.raw[row0:row0 + n], w.qtype)
