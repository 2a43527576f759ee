"""Model hyper-parameters read from GGUF metadata, with each family's fixed traits."""

import math
from dataclasses import dataclass

from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.gguf.layout import printable

SUPPORTED_ARCHS = ("llama", "gemma3", "qwen2", "qwen3", "qwen35")

# Traits fixed by the family rather than stored in the file, as llama.cpp assigns them.
_NEOX_ROPE = {"gemma3", "qwen2", "qwen3", "qwen35"}  # half-split pairs; llama pairs adjacent dims
_GELU_FFN = {"gemma3"}                               # GeGLU (tanh GELU); the rest use SwiGLU
_POST_NORMS = {"gemma3"}                             # norms on each sublayer's output
_QK_NORM = {"gemma3", "qwen3", "qwen35"}             # per-head RMSNorm of queries and keys
_GEMMA3_SWA_PERIOD = 6                               # every 6th gemma3 layer is global
_OPTIONAL = (".attn_q.bias", ".attn_k.bias", ".attn_v.bias", "rope_freqs.weight")
_MAX_COUNT = 1 << 31                                 # sizes and counts are int32 on every backend


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
    n_ctx_train: int
    norm_eps: float
    rope_dims: int                    # leading dims of each head that are rotated
    rope_neox: bool
    rope_base: tuple[float, ...]      # per layer (sliding-window layers may use their own)
    rope_freq_scale: tuple[float, ...]
    window: tuple[int, ...]           # per layer: sliding-window size, 0 for global attention
    recurrent: tuple[bool, ...]       # per layer: Gated DeltaNet instead of attention
    embed_scale: float
    attn_scale: float
    gelu_ffn: bool
    post_norms: bool
    qk_norm: bool
    attn_gate: bool                   # attention output gated by sigmoid(part of attn_q)
    ffn_norm: str                     # tensor holding the pre-FFN norm
    output: str                       # LM head tensor (token_embd when tied)
    ssm: SSMConfig | None

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "ModelConfig":
        arch = f.arch
        if arch not in SUPPORTED_ARCHS:
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
        if scaling not in ("none", "linear"):
            raise LlogosError(f"{f.path}: unsupported rope scaling {_show(scaling)} (supported: none, linear)")
        scale = 1.0 / real("rope.scaling.factor", 1.0) if scaling == "linear" else 1.0

        window, rope_base, freq_scale = [0] * n_layer, [base] * n_layer, [scale] * n_layer
        n_swa = count("attention.sliding_window", 0, least=0)
        if arch == "gemma3" and n_swa > 0:
            pattern = flags("attention.sliding_window_pattern")
            for il in range(n_layer):
                swa = pattern[il] if pattern else il % _GEMMA3_SWA_PERIOD < _GEMMA3_SWA_PERIOD - 1
                if swa:
                    window[il], rope_base[il], freq_scale[il] = n_swa, real("rope.freq_base_swa", 10000.0), 1.0

        recurrent = [False] * n_layer
        ssm = None
        if arch == "qwen35":
            recurrent = flags("attention.recurrent_layers") or [
                (il + 1) % count("full_attention_interval") != 0 for il in range(n_layer)]
            n_k_heads, n_v_heads = count("ssm.group_count"), count("ssm.time_step_rank")
            inner = count("ssm.inner_size")
            if n_v_heads % n_k_heads or inner % n_v_heads:
                raise LlogosError(f"{f.path}: {n_v_heads} value heads of {inner} channels do not tile "
                                  f"over {n_k_heads} key heads")
            ssm = SSMConfig(conv_kernel=count("ssm.conv_kernel"), head_k_dim=count("ssm.state_size"),
                            n_k_heads=n_k_heads, n_v_heads=n_v_heads, head_v_dim=inner // n_v_heads)

        if arch == "gemma3" and n_layer == 62:
            # Gemma 3 27B scales queries by the model width per head, not the head size.
            attn_scale = 1.0 / math.sqrt(n_embd / n_head)
        else:
            attn_scale = 1.0 / math.sqrt(head_dim_k)

        cfg = cls(
            arch=arch, n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
            n_head_kv=count("attention.head_count_kv", n_head),
            head_dim_k=head_dim_k, head_dim_v=count("attention.value_length", head_dim_k),
            n_ff=count("feed_forward_length"), n_ctx_train=count("context_length"),
            norm_eps=real("attention.layer_norm_rms_epsilon"),
            rope_dims=count("rope.dimension_count", head_dim_k, least=0), rope_neox=arch in _NEOX_ROPE,
            rope_base=tuple(rope_base), rope_freq_scale=tuple(freq_scale), window=tuple(window),
            recurrent=tuple(recurrent),
            embed_scale=math.sqrt(n_embd) if arch == "gemma3" else 1.0, attn_scale=attn_scale,
            gelu_ffn=arch in _GELU_FFN, post_norms=arch in _POST_NORMS, qk_norm=arch in _QK_NORM,
            attn_gate=arch == "qwen35",
            ffn_norm="post_attention_norm" if arch == "qwen35" else "ffn_norm",
            output="output.weight" if "output.weight" in f.tensors else "token_embd.weight",
            ssm=ssm,
        )
        cfg._validate(f)
        return cfg

    def _validate(self, f: GGUFFile) -> None:
        if self.n_head % self.n_head_kv:
            raise LlogosError(f"{f.path}: {self.n_head} attention heads do not group over {self.n_head_kv} KV heads")
        if self.rope_dims > self.head_dim_k or self.rope_dims % 2:
            raise LlogosError(f"{f.path}: rope dimension {self.rope_dims} does not fit head size {self.head_dim_k}")
        if len(self.recurrent) != self.n_layer:
            raise LlogosError(f"{f.path}: recurrent layer pattern has {len(self.recurrent)} entries "
                              f"for {self.n_layer} layers")
        shapes = self.tensor_shapes()
        missing = [name for name in shapes if name not in f.tensors and not name.endswith(_OPTIONAL)]
        if missing:
            raise LlogosError(f"{f.path}: tensor {missing[0]} is missing"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        for name, shape in shapes.items():
            if name in f.tensors and f.tensors[name].shape != shape:
                raise LlogosError(f"{f.path}: tensor {name} has shape {list(f.tensors[name].shape)}, "
                                  f"the metadata implies {list(shape)}")

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape (numpy order: out, in) of every tensor the forward pass reads; those named in
        _OPTIONAL may be absent."""
        d, dk, dv, n_kv = self.n_embd, self.head_dim_k, self.head_dim_v, self.n_head_kv
        q_rows = self.n_head * dk * (2 if self.attn_gate else 1)  # gated heads carry their gate
        shapes = {"token_embd.weight": (self.n_vocab, d), "output_norm.weight": (d,),
                  self.output: (self.n_vocab, d), "rope_freqs.weight": (self.rope_dims // 2,)}
        for il in range(self.n_layer):
            p = f"blk.{il}."
            layer = {"attn_norm.weight": (d,), self.ffn_norm + ".weight": (d,), "ffn_gate.weight": (self.n_ff, d),
                     "ffn_up.weight": (self.n_ff, d), "ffn_down.weight": (d, self.n_ff)}
            if self.post_norms:
                layer |= {"post_attention_norm.weight": (d,), "post_ffw_norm.weight": (d,)}
            if self.recurrent[il]:
                s = self.ssm
                value_dim = s.n_v_heads * s.head_v_dim
                layer |= {"attn_qkv.weight": (s.conv_channels, d), "attn_gate.weight": (value_dim, d),
                          "ssm_beta.weight": (s.n_v_heads, d), "ssm_alpha.weight": (s.n_v_heads, d),
                          "ssm_conv1d.weight": (s.conv_channels, s.conv_kernel), "ssm_norm.weight": (s.head_v_dim,),
                          "ssm_out.weight": (d, value_dim), "ssm_a": (s.n_v_heads,), "ssm_dt.bias": (s.n_v_heads,)}
            else:
                layer |= {"attn_q.weight": (q_rows, d), "attn_k.weight": (n_kv * dk, d), "attn_v.weight": (n_kv * dv, d),
                          "attn_output.weight": (d, self.n_head * dv), "attn_q.bias": (q_rows,),
                          "attn_k.bias": (n_kv * dk,), "attn_v.bias": (n_kv * dv,)}
                if self.qk_norm:
                    layer |= {"attn_q_norm.weight": (dk,), "attn_k_norm.weight": (dk,)}
            shapes |= {p + name: shape for name, shape in layer.items()}
        return shapes
