"""Model hyper-parameters read from GGUF metadata, with each family's fixed traits."""

import math
from dataclasses import dataclass

from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.gguf.layout import printable
from llogos_cli.model.families import FAMILIES, SUPPORTED_ARCHS

_OPTIONAL = (".attn_q.bias", ".attn_k.bias", ".attn_v.bias", ".attn_qkv.bias", ".attn_output.bias",
             ".attn_sinks.weight", ".ffn_gate_inp.bias", "_exps.bias", "rope_freqs.weight",
             "rope_factors_long.weight", "rope_factors_short.weight")
_MAX_COUNT = 1 << 31                                 # sizes and counts are int32 on every backend
# How a sequence's hidden states become one embedding, by the number <arch>.pooling_type holds
# (llama.cpp's llama_pooling_type); "rank" is a reranker's classification head.
POOLING_TYPES = ("none", "mean", "cls", "last", "rank")


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape[1:] if len(shape) > 1 and shape[0] == 1 else shape


def _show(value) -> str:
    """A metadata value for an error message, cut short: it may be a 262k-entry list."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True, slots=True)
class SSMConfig:
    """Gated DeltaNet (qwen35 linear-attention layers)."""
    conv_kernel: int   # width of the causal depthwise convolution
    head_k_dim: int    # ssm.state_size
    n_k_heads: int     # ssm.group_count
    n_v_heads: int     # ssm.time_step_rank
    head_v_dim: int    # ssm.inner_size / n_v_heads

    @property
    def conv_channels(self) -> int:
        """Channels through the convolution: queries, keys and values side by side."""
        return 2 * self.n_k_heads * self.head_k_dim + self.n_v_heads * self.head_v_dim

    @property
    def state_floats(self) -> int:
        """Recurrent state per layer: the delta-rule matrices and the convolution's last inputs."""
        return self.n_v_heads * self.head_v_dim * self.head_k_dim + (self.conv_kernel - 1) * self.conv_channels


def _kv_heads(f: GGUFFile, arch: str, n_head: int, n_layer: int) -> tuple[int, list[bool]]:
    """The KV head count of the attention layers, and which layers have none: LFM2 writes one count
    per layer, 0 for its convolution layers."""
    name = f"{arch}.attention.head_count_kv"
    value = f.meta.get(name, n_head)
    per_layer = value if isinstance(value, list) else [value] * n_layer
    counts = {v for v in per_layer if v != 0}
    if (len(per_layer) != n_layer or any(type(v) is not int or not 0 <= v < _MAX_COUNT for v in per_layer)
            or len(counts) != 1):
        raise LlogosError(f"{f.path}: metadata {name} is {_show(value)}, not one KV head count "
                          f"(from 1) for the attention layers")
    return counts.pop(), [v == 0 for v in per_layer]


def _sliding(f: GGUFFile, arch: str, il: int, n_layer: int, period: int) -> bool:
    """Whether layer il attends through the sliding window: the file's pattern (one flag per layer,
    or a period), else the family's period, as llama.cpp's set_swa_pattern reads it."""
    pattern = f.meta.get(f"{arch}.attention.sliding_window_pattern", period)
    if isinstance(pattern, list):
        if len(pattern) != n_layer or any(type(v) not in (bool, int) for v in pattern):
            raise LlogosError(f"{f.path}: metadata {arch}.attention.sliding_window_pattern is {_show(pattern)}, "
                              f"not one flag for each of the {n_layer} layers")
        return bool(pattern[il])
    if type(pattern) is not int or not 0 <= pattern < _MAX_COUNT:
        raise LlogosError(f"{f.path}: metadata {arch}.attention.sliding_window_pattern is {_show(pattern)}, "
                          "not a list of flags or a period")
    return pattern == 0 or il % pattern < pattern - 1


def _token_types(f: GGUFFile) -> int:
    """Rows of an encoder's token_types (BERT's sentence A and B), which the tokenizer's metadata counts."""
    value = f.meta.get("tokenizer.ggml.token_type_count", 2)
    if type(value) is not int or not 1 <= value < _MAX_COUNT:
        raise LlogosError(f"{f.path}: metadata tokenizer.ggml.token_type_count is {_show(value)}, not a count from 1")
    return value


@dataclass(frozen=True, slots=True)
class ModelConfig:
    arch: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_expert: int                     # experts per MoE layer (ffn_*_exps); 0 for a dense feed-forward
    n_expert_used: int                # experts each token is routed to
    n_ff_exp: int                     # each expert's hidden size
    expert_norm: bool                 # the chosen experts' router probabilities renormalised to sum to 1
    n_ff_shexp: int                   # the shared expert's hidden size (ffn_*_shexp); 0: none
    n_ctx_train: int
    norm_eps: float
    rope_dims: int                    # leading dims of each head that are rotated
    rope_neox: bool
    rope_base: tuple[float, ...]      # per layer (sliding-window layers may use their own)
    rope_freq_scale: tuple[float, ...]
    rope_layers: tuple[bool, ...]     # per layer: queries and keys rotated (SmolLM3 leaves some unrotated)
    rope_attn_factor: float           # rotated features times this (Phi-3's long-context RoPE)
    rope_yarn: bool                   # frequencies scaled by YaRN (model/yarn.py), not linearly
    n_ctx_orig: int                   # contexts past this take rope_factors_long, the rest rope_factors_short
    window: tuple[int, ...]           # per layer: sliding-window size, 0 for global attention
    recurrent: tuple[bool, ...]       # per layer: a recurrent sublayer (see ssm, conv_kernel) instead of attention
    embed_scale: float
    attn_scale: float
    residual_scale: float             # each sublayer's output times this before the residual add
    logit_scale: float                # the LM head's output times this
    attn_softcap: float               # attention scores s become c * tanh(s / c); 0: not capped
    final_softcap: float              # the same for the logits
    gelu_ffn: bool
    swiglu_limit: float               # experts' SwiGLU clamped as gpt-oss's (see Family); 0: plain
    swiglu_alpha: float
    pre_norms: bool
    post_norms: bool
    qk_norm: str                      # "", "head" or "all" (see Family)
    fused_qkv: bool                   # queries, keys and values from one attn_qkv product
    fused_ffn: bool                   # ffn_up holds the gate's rows, then the up rows
    attn_gate: bool                   # attention output gated by sigmoid(part of attn_q)
    ffn_norm: str                     # tensor holding the pre-FFN norm
    output_norm: str                  # tensor holding the final norm
    output: str                       # LM head tensor (token_embd when tied)
    ssm: SSMConfig | None             # recurrent layers are Gated DeltaNet (qwen35)
    conv_kernel: int                  # recurrent layers are short convolutions of this width (lfm2); else 0
    encoder: bool = False             # BERT's layout (see Family.encoder): no LM head, output and output_norm ""
    causal: bool = True               # each token attends only those before it
    n_token_types: int = 0            # rows of token_types (encoders)
    pooling: str = "last"             # the file's pooling_type (POOLING_TYPES), else the family's usual one

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "ModelConfig":
        arch = f.arch
        if arch not in FAMILIES:
            raise LlogosError(f"unsupported architecture '{printable(str(arch))}' (supported: {', '.join(SUPPORTED_ARCHS)})")

        def key(name, default=None):
            value = f.meta.get(f"{arch}.{name}", default)
            if value is None:
                raise LlogosError(f"{f.path}: metadata key {arch}.{name} is missing")
            return value

        def count(name, default=None, least=1) -> int:
            # Sizes and counts end up as array shapes and loop bounds: each must be a sane integer.
            value = key(name, default)
            if type(value) is not int or not least <= value < _MAX_COUNT:
                raise LlogosError(f"{f.path}: metadata {arch}.{name} is {_show(value)}, "
                                  f"not an integer from {least} to {_MAX_COUNT - 1}")
            return value

        def real(name, default=None) -> float:
            value = key(name, default)
            if type(value) not in (int, float) or not 0 < value < math.inf:
                raise LlogosError(f"{f.path}: metadata {arch}.{name} is {_show(value)}, not a positive number")
            return float(value)

        def optional(name, default: float) -> float:
            return real(name) if f"{arch}.{name}" in f.meta else default

        def flags(name) -> list[bool]:
            value = key(name, [])
            if not isinstance(value, list) or len(value) not in (0, n_layer) or any(type(v) not in (bool, int) for v in value):
                raise LlogosError(f"{f.path}: metadata {arch}.{name} is {_show(value)}, "
                                  f"not one flag for each of the {n_layer} layers")
            return [bool(v) for v in value]

        n_embd, n_layer, n_head = count("embedding_length"), count("block_count"), count("attention.head_count")
        if n_layer > len(f.tensors):  # every layer has tensors of its own; checked before lists of n_layer are built
            raise LlogosError(f"{f.path}: {n_layer} layers, but the file has only {len(f.tensors)} tensors")
        head_dim_k = count("attention.key_length", n_embd // n_head)
        n_vocab = count("vocab_size", 0, least=0) or len(f.meta.get("tokenizer.ggml.tokens", ()))
        if not n_vocab and "token_embd.weight" in f.tensors:
            n_vocab = f.tensors["token_embd.weight"].shape[0]
        base = real("rope.freq_base", 10000.0)
        scaling = key("rope.scaling.type", "none")
        if scaling not in ("none", "linear", "yarn"):
            raise LlogosError(f"{f.path}: unsupported rope scaling {_show(scaling)} (supported: none, linear, yarn)")
        scale = 1.0 / real("rope.scaling.factor", 1.0) if scaling != "none" else 1.0

        fam = FAMILIES[arch]
        window, rope_base, freq_scale = [0] * n_layer, [base] * n_layer, [scale] * n_layer
        n_swa = count("attention.sliding_window", 0, least=0)
        if fam.swa_period is not None and n_swa > 0:
            swa_base = real("rope.freq_base_swa", fam.swa_rope_base or base)
            for il in range(n_layer):
                if _sliding(f, arch, il, n_layer, fam.swa_period):
                    window[il], rope_base[il] = n_swa, swa_base
                    freq_scale[il] = scale if fam.swa_rope_scaled else 1.0

        n_head_kv, no_kv = _kv_heads(f, arch, n_head, n_layer)
        recurrent = [False] * n_layer
        ssm, conv_kernel = None, 0
        if fam.recurrent == "shortconv":
            recurrent, conv_kernel = no_kv, count("shortconv.l_cache", least=2)
        elif any(no_kv):
            raise LlogosError(f"{f.path}: metadata {arch}.attention.head_count_kv gives layer {no_kv.index(True)} "
                              "no KV heads")
        if fam.recurrent == "deltanet":
            recurrent = flags("attention.recurrent_layers") or [
                (il + 1) % count("full_attention_interval") != 0 for il in range(n_layer)]
            n_k_heads, n_v_heads = count("ssm.group_count"), count("ssm.time_step_rank")
            inner = count("ssm.inner_size")
            if n_v_heads % n_k_heads or inner % n_v_heads:
                raise LlogosError(f"{f.path}: {n_v_heads} value heads of {inner} channels do not tile "
                                  f"over {n_k_heads} key heads")
            ssm = SSMConfig(conv_kernel=count("ssm.conv_kernel"), head_k_dim=count("ssm.state_size"),
                            n_k_heads=n_k_heads, n_v_heads=n_v_heads, head_v_dim=inner // n_v_heads)

        if n_layer == fam.wide_query_layers:
            # Gemma 2 27B and Gemma 3 27B scale queries by the model width per head, not the head size.
            attn_scale = 1.0 / math.sqrt(n_embd / n_head)
        else:
            attn_scale = 1.0 / math.sqrt(head_dim_k)
        n_ctx_train = count("context_length")
        n_expert = count("expert_count", 0, least=0)
        n_expert_used = count("expert_used_count") if n_expert else 0
        if n_expert_used > n_expert:
            raise LlogosError(f"{f.path}: {n_expert_used} experts used of {n_expert}")
        n_ff_exp = count("expert_feed_forward_length") if n_expert else 0
        first_attention = next((il for il in range(n_layer) if not recurrent[il]), 0)
        period = fam.no_rope_period
        pooling = count("pooling_type", POOLING_TYPES.index("mean" if fam.encoder else "last"), least=0)
        if pooling >= len(POOLING_TYPES):
            raise LlogosError(f"{f.path}: metadata {arch}.pooling_type is {pooling}, not one of 0-{len(POOLING_TYPES) - 1}")
        causal = key("attention.causal", not fam.encoder)

        cfg = cls(
            arch=arch, n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim_k=head_dim_k, head_dim_v=count("attention.value_length", head_dim_k),
            n_ff=count("feed_forward_length", n_ff_exp or None), n_ctx_train=n_ctx_train,
            n_expert=n_expert, n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, expert_norm=fam.expert_norm,
            n_ff_shexp=count("expert_shared_feed_forward_length", n_ff_exp) if fam.shared_expert and n_expert else 0,
            norm_eps=real("attention.layer_norm_epsilon" if fam.encoder else "attention.layer_norm_rms_epsilon"),
            rope_dims=count("rope.dimension_count", head_dim_k, least=0), rope_neox=fam.rope_neox,
            rope_base=tuple(rope_base), rope_freq_scale=tuple(freq_scale),
            rope_layers=tuple(not fam.encoder and (not period or (il + 1) % period != 0) for il in range(n_layer)),
            rope_attn_factor=real("rope.scaling.attn_factor", 1.0), rope_yarn=scaling == "yarn",
            n_ctx_orig=count("rope.scaling.original_context_length", n_ctx_train),
            window=tuple(window), recurrent=tuple(recurrent),
            embed_scale=optional("embedding_scale", math.sqrt(n_embd) if fam.embed_scaled else 1.0),
            attn_scale=optional("attention.scale", attn_scale),
            residual_scale=optional("residual_scale", 1.0), logit_scale=1.0 / optional("logit_scale", 1.0),
            attn_softcap=optional("attn_logit_softcapping", fam.attn_softcap),
            final_softcap=optional("final_logit_softcapping", fam.final_softcap),
            gelu_ffn=fam.gelu_ffn, swiglu_limit=fam.swiglu_limit, swiglu_alpha=fam.swiglu_alpha, pre_norms=fam.pre_norms, post_norms=fam.post_norms, qk_norm=fam.qk_norm,
            fused_qkv=f"blk.{first_attention}.attn_qkv.weight" in f.tensors and not recurrent[first_attention],
            fused_ffn="blk.0.ffn_gate.weight" not in f.tensors and "blk.0.ffn_up.weight" in f.tensors,
            attn_gate=fam.attn_gate, ffn_norm=fam.ffn_norm,
            output_norm="" if fam.encoder else fam.output_norm,
            output="" if fam.encoder else "output.weight" if "output.weight" in f.tensors else "token_embd.weight",
            ssm=ssm, conv_kernel=conv_kernel, encoder=fam.encoder, causal=bool(causal),
            n_token_types=_token_types(f) if fam.encoder else 0, pooling=POOLING_TYPES[pooling],
        )
        cfg._validate(f)
        return cfg

    def _validate(self, f: GGUFFile) -> None:
        if self.n_head % self.n_head_kv:
            raise LlogosError(f"{f.path}: {self.n_head} attention heads do not group over {self.n_head_kv} KV heads")
        if self.rope_dims > self.head_dim_k or self.rope_dims % 2:
            raise LlogosError(f"{f.path}: rope dimension {self.rope_dims} does not fit head size {self.head_dim_k}")
        if self.rope_yarn and any(name in f.tensors for name in _OPTIONAL if name.startswith("rope_")):
            raise LlogosError(f"{f.path}: YaRN scaling with per-pair rope factors is not supported")
        if len(self.recurrent) != self.n_layer:
            raise LlogosError(f"{f.path}: recurrent layer pattern has {len(self.recurrent)} entries "
                              f"for {self.n_layer} layers")
        shapes = self.tensor_shapes()
        missing = [name for name in shapes if name not in f.tensors and not name.endswith(_OPTIONAL)]
        if missing:
            raise LlogosError(f"{f.path}: tensor {missing[0]} is missing"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        for name, shape in shapes.items():   # a leading 1 is the same shape (writers keep or drop it)
            if name in f.tensors and _squeezed(f.tensors[name].shape) != _squeezed(shape):
                raise LlogosError(f"{f.path}: tensor {name} has shape {list(f.tensors[name].shape)}, "
                                  f"the metadata implies {list(shape)}")

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape (numpy order: out, in) of every tensor the forward pass reads; those named in
        _OPTIONAL may be absent."""
        d, dk, dv, n_kv = self.n_embd, self.head_dim_k, self.head_dim_v, self.n_head_kv
        q_rows = self.n_head * dk * (2 if self.attn_gate else 1)  # gated heads carry their gate
        if self.encoder:
            return self._encoder_shapes()
        shapes = {"token_embd.weight": (self.n_vocab, d), self.output_norm: (d,),
                  self.output: (self.n_vocab, d), "rope_freqs.weight": (self.rope_dims // 2,),
                  "rope_factors_long.weight": (self.rope_dims // 2,),
                  "rope_factors_short.weight": (self.rope_dims // 2,)}
        for il in range(self.n_layer):
            p = f"blk.{il}."
            layer = {"attn_norm.weight": (d,), self.ffn_norm + ".weight": (d,)} if self.pre_norms else {}
            if self.n_expert:
                n_e, ff = self.n_expert, self.n_ff_exp
                layer |= {"ffn_gate_inp.weight": (n_e, d), "ffn_gate_exps.weight": (n_e, ff, d),
                          "ffn_up_exps.weight": (n_e, ff, d), "ffn_down_exps.weight": (n_e, d, ff),
                          "ffn_gate_inp.bias": (n_e,), "ffn_gate_exps.bias": (n_e, ff),
                          "ffn_up_exps.bias": (n_e, ff), "ffn_down_exps.bias": (n_e, d)}
                if self.n_ff_shexp:
                    sh = self.n_ff_shexp
                    layer |= {"ffn_gate_inp_shexp.weight": (1, d), "ffn_gate_shexp.weight": (sh, d),
                              "ffn_up_shexp.weight": (sh, d), "ffn_down_shexp.weight": (d, sh)}
            elif self.fused_ffn:
                layer |= {"ffn_up.weight": (2 * self.n_ff, d), "ffn_down.weight": (d, self.n_ff)}
            else:
                layer |= {"ffn_gate.weight": (self.n_ff, d), "ffn_up.weight": (self.n_ff, d),
                          "ffn_down.weight": (d, self.n_ff)}
            if self.post_norms:
                layer |= {"post_attention_norm.weight": (d,), "post_ffw_norm.weight": (d,)}
            if self.recurrent[il] and self.conv_kernel:
                layer |= {"shortconv.conv.weight": (d, self.conv_kernel), "shortconv.in_proj.weight": (3 * d, d),
                          "shortconv.out_proj.weight": (d, d)}
            elif self.recurrent[il]:
                s = self.ssm
                value_dim = s.n_v_heads * s.head_v_dim
                layer |= {"attn_qkv.weight": (s.conv_channels, d), "attn_gate.weight": (value_dim, d),
                          "ssm_beta.weight": (s.n_v_heads, d), "ssm_alpha.weight": (s.n_v_heads, d),
                          "ssm_conv1d.weight": (s.conv_channels, s.conv_kernel), "ssm_norm.weight": (s.head_v_dim,),
                          "ssm_out.weight": (d, value_dim), "ssm_a": (s.n_v_heads,), "ssm_dt.bias": (s.n_v_heads,)}
            else:
                if self.fused_qkv:
                    rows = q_rows + n_kv * (dk + dv)
                    layer |= {"attn_qkv.weight": (rows, d), "attn_qkv.bias": (rows,)}
                else:
                    layer |= {"attn_q.weight": (q_rows, d), "attn_k.weight": (n_kv * dk, d),
                              "attn_v.weight": (n_kv * dv, d), "attn_q.bias": (q_rows,),
                              "attn_k.bias": (n_kv * dk,), "attn_v.bias": (n_kv * dv,)}
                layer |= {"attn_output.weight": (d, self.n_head * dv), "attn_output.bias": (d,),
                          "attn_sinks.weight": (self.n_head,)}
                if self.qk_norm == "head":
                    layer |= {"attn_q_norm.weight": (dk,), "attn_k_norm.weight": (dk,)}
                elif self.qk_norm == "all":
                    layer |= {"attn_q_norm.weight": (self.n_head * dk,), "attn_k_norm.weight": (n_kv * dk,)}
            shapes |= {p + name: shape for name, shape in layer.items()}
        return shapes

    def _encoder_shapes(self) -> dict[str, tuple[int, ...]]:
        """BERT's tensors, every one with its bias."""
        d, dk, dv, n_kv = self.n_embd, self.head_dim_k, self.head_dim_v, self.n_head_kv
        shapes = {"token_embd.weight": (self.n_vocab, d), "position_embd.weight": (self.n_ctx_train, d),
                  "token_types.weight": (self.n_token_types, d), "token_embd_norm.weight": (d,),
                  "token_embd_norm.bias": (d,)}
        for il in range(self.n_layer):
            layer = {"attn_q": (self.n_head * dk, d), "attn_k": (n_kv * dk, d), "attn_v": (n_kv * dv, d),
                     "attn_output": (d, self.n_head * dv), "ffn_up": (self.n_ff, d), "ffn_down": (d, self.n_ff)}
            for name, shape in layer.items():
                shapes |= {f"blk.{il}.{name}.weight": shape, f"blk.{il}.{name}.bias": shape[:1]}
            for norm in ("attn_output_norm", "layer_output_norm"):
                shapes |= {f"blk.{il}.{norm}.weight": (d,), f"blk.{il}.{norm}.bias": (d,)}
        return shapes
