"""A reranker's classification head: what llama.cpp's rank pooling makes of one token's final
hidden state, the [CLS] token's for an encoder, the last token's for a decoder.

`cls` (a dense layer with tanh after it: BERT's pooler, RoBERTa's classifier.dense) where the file
has it, then `cls.output` (the classifier's projection onto its labels) where the file has it, each
with its bias if given. Qwen3-Reranker's GGUF holds its LM head's rows of "yes" and "no" as
`cls.output`, and llama.cpp takes their softmax, so that the first label is the probability of
"yes". The head is a few thousand numbers a token: it runs on the host, in float32.
"""

from dataclasses import dataclass

import numpy as np

from llogos_cli.errors import LlogosError
from llogos_cli.gguf import quants
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.config import ModelConfig

SOFTMAX_ARCHS = ("qwen3", "qwen3vl")   # whose head's outputs llama.cpp turns into probabilities


@dataclass(frozen=True)
class RankHead:
    dense: np.ndarray | None        # (n_hidden, n_embd), cls
    dense_bias: np.ndarray | None   # (n_hidden,)
    out: np.ndarray | None          # (n_labels, n_hidden), cls.output
    out_bias: np.ndarray | None     # (n_labels,)
    softmax: bool
    labels: tuple[str, ...]         # a name per output, "0", "1"... where the file names none
    first_token: bool               # an encoder's [CLS] state; else the last token's (a causal decoder)

    @classmethod
    def from_gguf(cls, f: GGUFFile, cfg: ModelConfig) -> "RankHead":
        """The file's head; a file with neither cls nor cls.output cannot rank."""
        def tensor(name: str) -> np.ndarray | None:
            if name not in f.tensors:
                return None
            info = f.tensors[name]
            values = quants.dequantize(f.raw(name), info.ggml_type)
            return values.ravel() if len(info.shape) == 1 or name.endswith(".bias") else values

        dense, out = tensor("cls.weight"), tensor("cls.output.weight")
        if dense is None and out is None:
            raise LlogosError(f"{f.path.name} has no classification head (cls.output): it cannot rank; "
                              "a reranker's GGUF has one")
        dense_bias, out_bias = tensor("cls.bias"), tensor("cls.output.bias")
        width = cfg.n_embd
        for name, w, b in (("cls", dense, dense_bias), ("cls.output", out, out_bias)):
            if w is None:
                continue
            if w.shape[1] != width or (b is not None and b.shape != (w.shape[0],)):
                raise LlogosError(f"{f.path.name}: the classification head's {name} has shape {list(w.shape)}, "
                                  f"which does not take {width} inputs")
            width = w.shape[0]
        n_labels = width
        labels = tuple(f.meta.get(f"{cfg.arch}.classifier.output_labels") or ())
        if len(labels) != n_labels:
            labels = tuple(str(i) for i in range(n_labels))
        return cls(dense, dense_bias, out, out_bias, cfg.arch in SOFTMAX_ARCHS, labels, not cfg.causal)

    def scores(self, states: np.ndarray) -> np.ndarray:
        """(N, n_embd) token states -> (N, n_labels) outputs; the first is the pair's score."""
        x = states.astype(np.float32)
        if self.dense is not None:
            x = x @ self.dense.T
            if self.dense_bias is not None:
                x = x + self.dense_bias
            x = np.tanh(x)
        if self.out is not None:
            x = x @ self.out.T
            if self.out_bias is not None:
                x = x + self.out_bias
        if self.softmax:
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            x = e / e.sum(axis=-1, keepdims=True)
        return x
