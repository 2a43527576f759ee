"""The transformer forward pass, written once for every supported family.

Family differences are flags in ModelConfig; tensors are looked up by their GGUF names.
"""

import copy
import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from llogos_cli import deltanet, quants
from llogos_cli.config import ModelConfig
from llogos_cli.errors import LlogosError
from llogos_cli.gguf_file import GGUFFile


class Model:
    def __init__(self, f: GGUFFile, backend):
        self.cfg = ModelConfig.from_gguf(f)
        self.b = backend
        for name, info in f.tensors.items():
            quants.check_supported(info.ggml_type, name)

        def load(name: str):
            info, raw = f.tensors[name], f.raw(name)
            if len(info.shape) == 1:
                return backend.vector(raw, info.ggml_type)
            in_products = name != "token_embd.weight" or self.cfg.output == name
            return backend.matrix(raw, info.ggml_type, matmul=in_products)

        # NumPy releases the GIL while it dequantizes: loading on every core halves start-up.
        with ThreadPoolExecutor(os.cpu_count() if backend.parallel_load else 1) as pool:
            self.w = dict(zip(f.tensors, pool.map(load, f.tensors)))
        # What one decode step streams from memory: the basis of the bandwidth figure.
        self.weight_bytes = sum(w.nbytes for w in self.w.values())

    def new_context(self, n_ctx: int, type_k: str | None = None, type_v: str | None = None) -> "Context":
        """A fresh sequence; the KV cache types default to the backend's (f32 on CPU, f16 on GPU)."""
        c = self.cfg
        type_k, type_v = type_k or self.b.default_cache_type, type_v or self.b.default_cache_type
        kv = [None if c.recurrent[il] else
              self.b.kv_cache(n_ctx, c.n_head_kv, c.head_dim_k, c.head_dim_v, type_k, type_v)
              for il in range(c.n_layer)]
        state = [deltanet.new_state(self.b, c) if c.recurrent[il] else None for il in range(c.n_layer)]
        return Context(n_ctx, kv, state)

    # ------------------------------------------------------------------ forward
    def forward(self, ctx: "Context", tokens: np.ndarray, all_logits: bool = False, logits_from: int = 0):
        """Run `tokens` at positions ctx.n_past...; return logits for the last token, or with
        all_logits for every token from index logits_from on (the LM head is the costly part)."""
        c, b, w = self.cfg, self.b, self.w
        T = len(tokens)
        if ctx.n_past + T > ctx.n_ctx:
            raise LlogosError(f"context is full: {ctx.n_past} + {T} tokens exceed --ctx-size {ctx.n_ctx}")
        pos = np.arange(ctx.n_past, ctx.n_past + T, dtype=np.int32)

        x = b.embed(w["token_embd.weight"], tokens)                     # (T, n_embd)
        if c.embed_scale != 1.0:
            x = b.scale(x, c.embed_scale)                               # (T, n_embd)
        for il in range(c.n_layer):
            p = f"blk.{il}."
            h = b.rmsnorm(x, w[p + "attn_norm.weight"], c.norm_eps)      # (T, n_embd)
            h = (deltanet.block(b, c, w, p, h, ctx.state[il]) if c.recurrent[il]
                 else self._attention(il, p, h, pos, ctx))              # (T, n_embd)
            if c.post_norms:
                h = b.rmsnorm(h, w[p + "post_attention_norm.weight"], c.norm_eps)  # (T, n_embd)
            x = b.add(x, h)                                             # (T, n_embd)
            h = b.rmsnorm(x, w[p + c.ffn_norm + ".weight"], c.norm_eps)  # (T, n_embd)
            h = self._ffn(p, h)                                         # (T, n_embd)
            if c.post_norms:
                h = b.rmsnorm(h, w[p + "post_ffw_norm.weight"], c.norm_eps)  # (T, n_embd)
            x = b.add(x, h)                                             # (T, n_embd)
        ctx.n_past += T

        x = x[logits_from:] if all_logits else x[-1:]                  # (T', n_embd)
        x = b.rmsnorm(x, w["output_norm.weight"], c.norm_eps)           # (T', n_embd)
        return b.matmul(x, w[c.output])                                 # (T', n_vocab)

    def _attention(self, il: int, p: str, x, pos: np.ndarray, ctx: "Context"):
        c, b, w = self.cfg, self.b, self.w
        T = x.shape[0]
        q = self._linear(p + "attn_q", x)                  # (T, n_head * dk), doubled when gated
        k = self._linear(p + "attn_k", x)                  # (T, n_head_kv * dk)
        v = self._linear(p + "attn_v", x)                  # (T, n_head_kv * dv)
        if c.attn_gate:   # each head's query is followed by its output gate
            qg = q.reshape(T, c.n_head, 2 * c.head_dim_k)
            q, gate = qg[..., :c.head_dim_k], qg[..., c.head_dim_k:]    # (T, n_head, dk) each
        q = q.reshape(T, c.n_head, c.head_dim_k)           # (T, n_head, dk)
        k = k.reshape(T, c.n_head_kv, c.head_dim_k)        # (T, n_head_kv, dk)
        v = v.reshape(T, c.n_head_kv, c.head_dim_v)        # (T, n_head_kv, dv)
        if c.qk_norm:
            q = b.rmsnorm(q, w[p + "attn_q_norm.weight"], c.norm_eps)  # (T, n_head, dk)
            k = b.rmsnorm(k, w[p + "attn_k_norm.weight"], c.norm_eps)  # (T, n_head_kv, dk)
        factors = w.get("rope_freqs.weight")              # (rope_dims / 2,) Llama 3.1+ long-context scaling
        q = b.rope(q, pos, c.rope_dims, c.rope_base[il], c.rope_freq_scale[il], c.rope_neox, factors)  # (T, n_head, dk)
        k = b.rope(k, pos, c.rope_dims, c.rope_base[il], c.rope_freq_scale[il], c.rope_neox, factors)  # (T, n_head_kv, dk)
        b.kv_store(ctx.kv[il], k, v, ctx.n_past)
        o = b.attention(q, ctx.kv[il], ctx.n_past, c.attn_scale, c.window[il])  # (T, n_head, dv)
        if c.attn_gate:
            o = b.mul(o, b.sigmoid(gate))                 # (T, n_head, dv)
        return b.matmul(o.reshape(T, c.n_head * c.head_dim_v), w[p + "attn_output.weight"])

    def _ffn(self, p: str, x):
        b, w = self.b, self.w
        gate = b.matmul(x, w[p + "ffn_gate.weight"])       # (T, n_ff)
        up = b.matmul(x, w[p + "ffn_up.weight"])           # (T, n_ff)
        return b.matmul(b.glu(gate, up, self.cfg.gelu_ffn), w[p + "ffn_down.weight"])  # (T, n_embd)

    def _linear(self, name: str, x):
        y = self.b.matmul(x, self.w[name + ".weight"])
        bias = self.w.get(name + ".bias")
        return y if bias is None else self.b.add(y, bias)


@dataclass(slots=True)
class Context:
    """Per-sequence state: the KV cache of attention layers and the recurrent state of the rest."""
    n_ctx: int
    kv: list
    state: list
    n_past: int = 0

    @property
    def recurrent(self) -> bool:
        return any(s is not None for s in self.state)

    def rewind(self, n: int) -> bool:
        """Forget positions n and later. Recurrent state cannot be rewound, only rebuilt."""
        if n != self.n_past and self.recurrent:
            return False
        self.n_past = min(self.n_past, n)
        return True

    def snapshot(self) -> tuple[int, list]:
        """Mark this point (say, before a reply) for restore(), the way back rewind() cannot take for
        recurrent layers. Copies only the recurrent state, whose size does not grow with the context;
        the KV cache below n_past is left alone by later tokens and needs no copy."""
        return self.n_past, copy.deepcopy(self.state)

    def restore(self, snap: tuple[int, list]) -> None:
        """Return to a snapshot, as often as wanted. Valid while the positions before it are unchanged:
        evaluating on from an older snapshot invalidates newer ones. The state is copied into the
        arrays already in place, which a captured CUDA graph keeps reading."""
        self.n_past, state = snap
        for current, saved in zip(self.state, state):
            if current is not None:
                for f in dataclasses.fields(current):
                    getattr(current, f.name)[...] = getattr(saved, f.name)
