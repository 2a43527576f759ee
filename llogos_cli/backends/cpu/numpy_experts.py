"""Mixture-of-experts ops on the NumPy backend: the router's choice, and the grouped expert product.

A layer's experts are one stacked matrix (n_expert * out, in), as the GGUF stores ffn_*_exps. The
product sorts the batch's (token, expert) pairs by expert and multiplies each chosen expert's rows
once, by all the tokens routed to it: a step streams each expert's matrix at most once, however
many of its tokens chose it.
"""

import numpy as np

from llogos_cli.gguf import quants


class ExpertOps:
    """Mixed into NumpyBackend."""

    def route(self, logits: np.ndarray, k: int, normalize: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Softmax router over logits (T, n_expert): each token's k most probable experts (T, k)
        int32, and their probabilities (T, k) float32, scaled to sum to 1 if normalize."""
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        experts = np.argsort(-p, axis=1, kind="stable")[:, :k]
        weights = np.take_along_axis(p, experts, axis=1)
        if normalize:
            weights = weights / weights.sum(axis=1, keepdims=True)
        return experts.astype(np.int32), weights.astype(np.float32)

    def matmul_experts(self, x: np.ndarray, w, experts: np.ndarray, n_expert: int,
                       weights: np.ndarray | None = None, bias: np.ndarray | None = None) -> np.ndarray:
        """Each token t through each of its experts e = experts[t, j] (T, k): x[t] (x (T, in)) or
        x[t, j] (x (T, k, in)) times expert e's block of the stacked w, plus expert e's row of bias
        (n_expert * out,) if given -> (T, k, out); with weights (T, k), the k results weighted and
        summed -> (T, out)."""
        T, k = experts.shape
        out = w.raw.shape[0] // n_expert
        rows = np.broadcast_to(x[:, None, :], (T, k, x.shape[-1])) if x.ndim == 2 else x
        # One token (a decode step): its k experts in one call where the integer products take them.
        y = None if T > 1 or w.dense is not None else self.quant_matmul.experts(rows.reshape(k, -1), w.blocks, w.qtype,
                                                                                 experts.ravel(), out)
        if y is not None:
            y = y.reshape(T, k, out)
        else:
            y = np.empty((T, k, out), np.float32)
            pairs = np.argsort(experts.ravel(), kind="stable")            # (T * k,) grouped by expert
            chosen, starts = np.unique(experts.ravel()[pairs], return_index=True)
            for e, a, b in zip(chosen, starts, np.append(starts[1:], len(pairs))):
                t, j = np.divmod(pairs[a:b], k)
                y[t, j] = self._expert_product(np.ascontiguousarray(rows[t, j]), w, int(e) * out, out)
        if bias is not None:
            y += bias.reshape(n_expert, out)[experts]
        if weights is None:
            return y
        return np.einsum("tk,tko->to", weights, y).astype(np.float32, copy=False)

    def scale_rows(self, x: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Row t of x (T, n) times s[t] (s (T,) or (T, 1)): a gate per token."""
        return x * s.reshape(-1, 1)

    def swiglu_oai(self, gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
        """gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clip(up, -limit, limit);
        g * sigmoid(alpha * g) * (u + 1)."""
        g = np.minimum(gate, np.float32(limit))
        u = np.clip(up, np.float32(-limit), np.float32(limit))
        with np.errstate(over="ignore"):   # exp overflows to inf for very negative g: the limit, -0
            return g / (np.float32(1) + np.exp(np.float32(-alpha) * g)) * (u + np.float32(1))

    def _expert_product(self, x: np.ndarray, w, row0: int, n: int) -> np.ndarray:
        """x (R, in) times rows row0..row0+n of w: one expert's matrix, streamed once."""
        if w.dense is not None:
            return x @ w.dense[row0:row0 + n].T
        rows = self.quant_matmul.row_range(w.blocks, w.qtype, row0, n)
        if rows is None:   # tiled rows that an expert's part does not begin a tile of: its rows expanded
            return x @ quants.dequantize(w.raw[row0:row0 + n], w.qtype).T
        return self.quant_matmul(x, rows, w.qtype)
