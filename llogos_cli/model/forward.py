"""The transformer forward pass, written once for every supported family.

Family differences are flags in ModelConfig; tensors are looked up by their GGUF names.
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from gguf import GGMLQuantizationType

from llogos_cli.backends import resolve_cache_types
from llogos_cli.backends.backend import Backend
from llogos_cli.errors import LlogosError
from llogos_cli.gguf import quants
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model import deltanet, shortconv
from llogos_cli.model.batch import Batch
from llogos_cli.model.cache import Cache, Context
from llogos_cli.model.config import ModelConfig
from llogos_cli.model.yarn import yarn_rotation


# Projections that share their input: multiplied together (matmuls), and joined at load where the
# backend gains by holding them as one matrix.
QKV = ("attn_q", "attn_k", "attn_v")
GATE_UP = ("ffn_gate", "ffn_up")


class Model:
    def __init__(self, f: GGUFFile, backend: Backend):
        self.cfg = ModelConfig.from_gguf(f)
        self.backend = backend
        if self.cfg.encoder and not backend.encoders:
            raise LlogosError(f"{f.path.name}: the {backend.name} backend cannot run encoder models "
                              f"({self.cfg.arch}) yet; use --backend cpu")
        for name, info in f.tensors.items():
            quants.check_supported(info.ggml_type, name)

        def load(names: tuple[str, ...]) -> list:
            if len(names) > 1:   # products that share an input, loaded together (the backend may join them)
                return backend.matrices([f.raw(name) for name in names], f.tensors[names[0]].ggml_type)
            return [load_one(names[0])]

        def load_one(name: str):
            info, raw = f.tensors[name], f.raw(name)
            if name.endswith("_inp_shexp.weight"):   # one row, also when written as a vector
                return backend.matrix(raw.reshape(1, -1), info.ggml_type, matmul=True)
            if len(info.shape) == 1 or name.endswith(".bias"):   # experts' biases (n_expert, out) too
                return backend.vector(raw, info.ggml_type)
            in_products = name != "token_embd.weight" or self.cfg.output == name
            return backend.matrix(raw, info.ggml_type, matmul=in_products)

        # NumPy releases the GIL while it dequantizes: loading on every core halves start-up.
        with ThreadPoolExecutor(backend.load_threads) as pool:
            jobs = self._load_groups(f)
            loaded = {name: w for names, ws in zip(jobs, pool.map(load, jobs)) for name, w in zip(names, ws)}
        self.w = {name: loaded[name] for name in f.tensors}
        # What one decode step streams from memory: the basis of the bandwidth figure.
        self.weight_bytes = sum(w.nbytes for w in self.w.values())
        # YaRN: each layer's scaled rotation as per-pair frequency divisors and a scale.
        self._yarn = [self._yarn_rotation(il) for il in range(self.cfg.n_layer)] if self.cfg.rope_yarn else None

    def _load_groups(self, f: GGUFFile) -> list[tuple[str, ...]]:
        """The tensors to load, one at a time but for each layer's q, k and v and its gate and up,
        which are loaded together where they are of one type; where only v's type differs (as
        llama.cpp's Q4_K_M makes it Q6_K), q and k together."""
        grouped = []
        for il in range(self.cfg.n_layer):
            for names in (QKV, GATE_UP):
                group = tuple(f"blk.{il}.{name}.weight" for name in names)
                if not all(name in f.tensors for name in group):
                    continue
                types = [f.tensors[name].ggml_type for name in group]
                same = next((i for i, t in enumerate(types) if t != types[0]), len(types))   # the leading run of one type
                if same > 1:
                    grouped.append(group[:same])
        in_groups = {name for group in grouped for name in group}
        return grouped + [(name,) for name in f.tensors if name not in in_groups]

    def new_cache(self, n_slots: int, n_ctx: int, type_k: str | None = None, type_v: str | None = None,
                  n_blocks: int = 0, block_size: int = 0) -> Cache:
        """KV cache and recurrent state for n_slots sequences of up to n_ctx tokens each, plus one
        scratch slot (pad_slot) that padding rows of a fixed-size decode step may write to. The
        cache types default to DEFAULT_CACHE_TYPE (f16). With n_blocks (the batch
        engine's paged cache), each attention layer's KV is one pool of n_blocks blocks of block_size
        positions that a slot reaches through its row of block_tables, instead of n_ctx per slot."""
        c = self.cfg
        type_k, type_v = resolve_cache_types((type_k, type_v))
        n = n_slots + 1
        tables = None
        if n_blocks:   # (n, blocks per row); pad_slot's row all at one more block, the scratch
            tables = self.backend.block_tables(n, -(-n_ctx // block_size))
            tables[n_slots] = n_blocks
        kv = [None if c.recurrent[il] else
              self.backend.paged_kv_cache(tables, n_blocks + 1, block_size, c.n_head_kv, c.head_dim_k, c.head_dim_v,
                                    type_k, type_v) if n_blocks else
              self.backend.kv_cache(n, n_ctx, c.n_head_kv, c.head_dim_k, c.head_dim_v, type_k, type_v)
              for il in range(c.n_layer)]
        state = [self._recurrent.new_state(self.backend, c, n) if c.recurrent[il] else None for il in range(c.n_layer)]
        return Cache(n_slots, n_ctx, kv, state, tables)

    def new_context(self, n_ctx: int, type_k: str | None = None, type_v: str | None = None) -> Context:
        """One sequence: slot 0 of a cache of its own."""
        return Context(self.new_cache(1, n_ctx, type_k, type_v))

    # ------------------------------------------------------------------ forward
    def forward(self, cache: Cache, batch: Batch):
        """Run a batch of tokens, each at its own (slot, position) of the cache; return the logits of
        the tokens batch.logits lists (the LM head is the costly part), (len(batch.logits), n_vocab)."""
        c, b = self.cfg, self.backend
        if not c.output:
            raise LlogosError(f"a {c.arch} model has no LM head: it makes embeddings (llogos embed), not text")
        x = self.hidden(cache, batch)                                   # (T', n_embd)
        logits = b.matmul(x, self.w[c.output])                          # (T', n_vocab)
        if c.logit_scale != 1.0:
            logits = b.scale(logits, c.logit_scale)                     # (T', n_vocab)
        return b.softcap(logits, c.final_softcap) if c.final_softcap else logits  # (T', n_vocab)

    def hidden(self, cache: Cache, batch: Batch):
        """The final hidden states (normed where the family norms them before its LM head) of the
        tokens batch.logits lists, (len(batch.logits), n_embd): what embeddings are pooled from."""
        c, b, w = self.cfg, self.backend, self.w
        layout = b.batch_layout(batch.slots, batch.pos)
        if c.encoder:
            x = self._encode(batch, cache, layout)                      # (T, n_embd)
        else:
            x = self._decode(batch, cache, layout)                      # (T, n_embd)
        if len(batch.logits) < len(batch.tokens):   # a gather inside a captured decode graph would not replay
            x = x[batch.logits]                                         # (T', n_embd)
        return b.rmsnorm(x, w[c.output_norm], c.norm_eps) if c.output_norm else x  # (T', n_embd)

    def _decode(self, batch: Batch, cache: Cache, layout):
        """A decoder's layers over the batch: -> (T, n_embd), before the final norm."""
        c, b, w = self.cfg, self.backend, self.w
        factors = self.rope_factors(cache.n_ctx)                       # (rope_dims / 2,) or None
        x = b.embed(w["token_embd.weight"], batch.tokens)               # (T, n_embd)
        if c.embed_scale != 1.0:
            x = b.scale(x, c.embed_scale)                               # (T, n_embd)
        for il in range(c.n_layer):
            p = f"blk.{il}."
            # Each sublayer's input norm (pre_norms) is named, not applied: the products after it
            # may normalize their input themselves (rmsnorm_matmuls).
            attn_norm, ffn_norm = (p + "attn_norm.weight", p + c.ffn_norm + ".weight") if c.pre_norms else (None, None)
            if c.recurrent[il]:
                h = self._recurrent.block(b, c, w, p, self._rmsnorm(attn_norm, x), cache.state[il], layout)  # (T, n_embd)
                x = self._residual(p + "post_attention_norm.weight", x, h)  # (T, n_embd)
            else:
                x = self._attention(il, p, x, cache.kv[il], layout, factors, x, attn_norm)  # (T, n_embd): x + attention
            x = self._ffn(p, x, ffn_norm)                               # (T, n_embd): x + the FFN
        return x

    def _rmsnorm(self, norm: str | None, x):
        """x normed by the RMSNorm weight named norm; x itself where norm is None."""
        return x if norm is None else self.backend.rmsnorm(x, self.w[norm], self.cfg.norm_eps)

    def _encode(self, batch: Batch, cache: Cache, layout):
        """BERT's layers over the batch (its tokens of type 0, as llama.cpp gives them all, unless the
        batch says otherwise): -> (T, n_embd)."""
        c, b, w = self.cfg, self.backend, self.w
        x = b.add(b.embed(w["token_embd.weight"], batch.tokens),
                  b.embed(w["position_embd.weight"], batch.pos))        # (T, n_embd)
        if batch.types is None:   # every token type 0: its row, which every backend's add repeats
            x = b.add(x, b.embed(w["token_types.weight"], np.zeros(1, np.int32))[0])   # (T, n_embd)
        else:
            x = b.add(x, b.embed(w["token_types.weight"], batch.types))              # (T, n_embd)
        x = self._layernorm("token_embd_norm", x)                       # (T, n_embd)
        for il in range(c.n_layer):
            p = f"blk.{il}."
            h = self._attention(il, p, x, cache.kv[il], layout, None)  # (T, n_embd)
            x = self._layernorm(p + "attn_output_norm", b.add(x, h))   # (T, n_embd)
            h = self._linear(p + "ffn_down", b.gelu(self._linear(p + "ffn_up", x)))  # (T, n_embd)
            x = self._layernorm(p + "layer_output_norm", b.add(x, h))  # (T, n_embd)
        return x

    def _layernorm(self, name: str, x):
        return self.backend.layernorm(x, self.w[name + ".weight"], self.w[name + ".bias"], self.cfg.norm_eps)

    def _residual(self, post_norm: str, x, h):
        """x + h, h first normed (post_norms) and scaled (residual_scale) as the family does."""
        c, b = self.cfg, self.backend
        if c.post_norms:
            h = b.rmsnorm(h, self.w[post_norm], c.norm_eps)
        if c.residual_scale != 1.0:
            h = b.scale(h, c.residual_scale)
        return b.add(x, h)

    def _residual_product(self, name: str, h, x, post_norm: str):
        """x + the projection `name` of h, as _residual adds it. With nothing between the product
        and the add (no post-norm, residual scale or bias), one op: the backend adds x in the
        product's epilogue (matmul_add), where it would otherwise launch an add of its own."""
        c = self.cfg
        if c.post_norms or c.residual_scale != 1.0 or name + ".bias" in self.w:
            return self._residual(post_norm, x, self._linear(name, h))
        return self.backend.matmul_add(h, self.w[name + ".weight"], x)

    def forward_rows(self, cache: Cache, tokens, slots, pos):
        """Decode rows, one token each (the engine's decode step): -> logits (R, n_vocab)."""
        return self.forward(cache, Batch(np.asarray(tokens, np.int32), np.asarray(slots, np.int32),
                                         np.asarray(pos, np.int32), np.arange(len(tokens))))

    def forward_seq(self, ctx: Context, tokens: np.ndarray, all_logits: bool = False, logits_from: int = 0):
        """One sequence: run `tokens` at positions ctx.n_past...; return logits for the last token,
        or with all_logits for every token from index logits_from on."""
        T = len(tokens)
        if ctx.n_past + T > ctx.n_ctx:
            raise LlogosError(f"context is full: {ctx.n_past} + {T} tokens exceed --ctx-size {ctx.n_ctx}")
        batch = Batch.run(tokens, 0, ctx.n_past, np.arange(logits_from, T) if all_logits else np.array([T - 1]))
        logits = self.forward(ctx.cache, batch)
        ctx.n_past += T
        return logits

    def _yarn_rotation(self, il: int) -> tuple:
        c = self.cfg
        divisors, scale = yarn_rotation(c.rope_dims, c.rope_base[il], c.rope_freq_scale[il], c.n_ctx_orig)
        return self.backend.vector(divisors.view(np.uint8), GGMLQuantizationType.F32), c.rope_attn_factor * scale

    @property
    def _recurrent(self):
        """The module of this family's recurrent layers: LFM2's short convolutions or Gated DeltaNet."""
        return shortconv if self.cfg.conv_kernel else deltanet

    def rope_args(self, il: int, factors) -> tuple:
        """Layer il's rotation as the backend's rope takes it: (dims, base, freq_scale, neox,
        per-pair divisors or None, attn_factor); factors from rope_factors."""
        c = self.cfg
        if self._yarn:
            return c.rope_dims, c.rope_base[il], 1.0, c.rope_neox, *self._yarn[il]
        return c.rope_dims, c.rope_base[il], c.rope_freq_scale[il], c.rope_neox, factors, c.rope_attn_factor

    def rope_factors(self, n_ctx: int):
        """Each rotated pair's frequency divisor, or None: Llama 3.1+'s rope_freqs, or Phi-3's long-context
        factors for contexts past the trained one and its short ones otherwise, as llama.cpp chooses."""
        w = self.w
        if "rope_freqs.weight" in w:
            return w["rope_freqs.weight"]
        return w.get("rope_factors_long.weight" if n_ctx > self.cfg.n_ctx_orig else "rope_factors_short.weight")

    def _attention(self, il: int, p: str, x, kv, layout, factors, residual=None, norm: str | None = None):
        """Layer il's attention over x (normed first by the weight named norm, where given), through
        its output projection; plus the residual where given."""
        c, b, w = self.cfg, self.backend, self.w
        T = x.shape[0]
        if c.fused_qkv:
            qkv = self._linear(p + "attn_qkv", x, norm)    # (T, (n_head + n_head_kv) * dk + n_head_kv * dv)
            q_end = c.n_head * c.head_dim_k
            k_end = q_end + c.n_head_kv * c.head_dim_k
            q, k, v = qkv[:, :q_end], qkv[:, q_end:k_end], qkv[:, k_end:]
        else:
            q, k, v = self._linears([p + name for name in QKV], x, norm)
            # q (T, n_head * dk), doubled when gated; k (T, n_head_kv * dk); v (T, n_head_kv * dv)
        if c.qk_norm == "all":   # over each token's whole projection (OLMo 2)
            q = b.rmsnorm(q, w[p + "attn_q_norm.weight"], c.norm_eps)  # (T, n_head * dk)
            k = b.rmsnorm(k, w[p + "attn_k_norm.weight"], c.norm_eps)  # (T, n_head_kv * dk)
        if c.attn_gate:   # each head's query is followed by its output gate
            qg = q.reshape(T, c.n_head, 2 * c.head_dim_k)
            q, gate = qg[..., :c.head_dim_k], qg[..., c.head_dim_k:]    # (T, n_head, dk) each
        q = q.reshape(T, c.n_head, c.head_dim_k)           # (T, n_head, dk)
        k = k.reshape(T, c.n_head_kv, c.head_dim_k)        # (T, n_head_kv, dk)
        v = v.reshape(T, c.n_head_kv, c.head_dim_v)        # (T, n_head_kv, dv)
        if c.qk_norm == "head":
            q = b.rmsnorm(q, w[p + "attn_q_norm.weight"], c.norm_eps)  # (T, n_head, dk)
            k = b.rmsnorm(k, w[p + "attn_k_norm.weight"], c.norm_eps)  # (T, n_head_kv, dk)
        if c.rope_layers[il]:
            q = b.rope_kv_store(kv, q, k, v, layout, *self.rope_args(il, factors))   # (T, n_head, dk); k turned and stored, v stored
        else:
            b.kv_store(kv, k, v, layout)
        o = b.attention(q, kv, layout, c.attn_scale, c.window[il], c.attn_softcap,
                        w.get(p + "attn_sinks.weight"), c.causal)   # (T, n_head, dv)
        if c.attn_gate:
            o = b.mul(o, b.sigmoid(gate))                 # (T, n_head, dv)
        o = o.reshape(T, c.n_head * c.head_dim_v)         # (T, n_head * dv)
        if residual is None:
            return self._linear(p + "attn_output", o)     # (T, n_embd)
        return self._residual_product(p + "attn_output", o, residual, p + "post_attention_norm.weight")  # (T, n_embd)

    def _ffn(self, p: str, x, norm: str | None):
        """x + the feed-forward block of x normed by the weight named norm (not normed if None)."""
        b, w, n_ff = self.backend, self.w, self.cfg.n_ff
        if self.cfg.n_expert:
            return self._residual(p + "post_ffw_norm.weight", x, self._experts(p, self._rmsnorm(norm, x)))
        if self.cfg.fused_ffn:
            gate_up, = self._products(x, [w[p + "ffn_up.weight"]], norm)  # (T, 2 * n_ff)
            h = b.glu(gate_up[:, :n_ff], gate_up[:, n_ff:], self.cfg.gelu_ffn)  # (T, n_ff)
        else:
            h = b.glu_matmuls(x, *[w[p + name + ".weight"] for name in GATE_UP], self.cfg.gelu_ffn,
                              w[norm] if norm else None, self.cfg.norm_eps)  # (T, n_ff)
        return self._residual_product(p + "ffn_down", h, x, p + "post_ffw_norm.weight")  # (T, n_embd)

    def _experts(self, p: str, x):
        """Mixture of experts: each token through the n_expert_used experts its router picks, their
        outputs weighted by the router's probabilities (renormalised over the chosen ones unless
        the family keeps them), plus a shared expert where the family has one."""
        c, b, w = self.cfg, self.backend, self.w
        experts, weights = b.route(self._linear(p + "ffn_gate_inp", x), c.n_expert_used, c.expert_norm)  # (T, k) each

        def product(name: str, h, weights=None):   # with each expert's bias where the file has them
            return b.matmul_experts(h, w[p + name + ".weight"], experts, c.n_expert, weights, w.get(p + name + ".bias"))

        gate, up = product("ffn_gate_exps", x), product("ffn_up_exps", x)              # (T, k, n_ff_exp) each
        h = (b.swiglu_oai(gate, up, c.swiglu_alpha, c.swiglu_limit) if c.swiglu_limit
             else b.glu(gate, up, c.gelu_ffn))                                           # (T, k, n_ff_exp)
        out = product("ffn_down_exps", h, weights)                                       # (T, n_embd)
        if c.n_ff_shexp:   # the shared expert, which every token takes, behind a sigmoid gate
            gate, up = b.matmuls(x, [w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"]])  # (T, n_ff_shexp)
            shared = b.matmul(b.glu(gate, up, c.gelu_ffn), w[p + "ffn_down_shexp.weight"])        # (T, n_embd)
            out = b.add(out, b.scale_rows(shared, b.sigmoid(b.matmul(x, w[p + "ffn_gate_inp_shexp.weight"]))))
        return out

    def _linear(self, name: str, x, norm: str | None = None):
        return self._linears([name], x, norm)[0]

    def _linears(self, names: list[str], x, norm: str | None = None) -> list:
        """x (normed by the weight named norm, where given) through each named projection (its
        weight, then its bias if the file has one)."""
        ys = self._products(x, [self.w[name + ".weight"] for name in names], norm)
        biases = [self.w.get(name + ".bias") for name in names]
        return [y if bias is None else self.backend.add(y, bias) for y, bias in zip(ys, biases)]

    def _products(self, x, ws: list, norm: str | None) -> list:
        """x, normed first by the weight named norm where given, times each of ws."""
        if norm is None:
            return self.backend.matmuls(x, ws)
        return self.backend.rmsnorm_matmuls(x, self.w[norm], self.cfg.norm_eps, ws)
