"""Model hyper-parameters read from GGUF metadata, with each family's fixed traits."""

import math
from dataclasses import dataclass

from llogos_cli.errors import LlogosError
from llogos_cli.gguf_file import GGUFFile

SUPPORTED_ARCHS = ("llama", "gemma3", "qwen2", "qwen3", "qwen35")

# Traits fixed by the family rather than stored in the file, as llama.cpp assigns them.
_NEOX_ROPE = {"gemma3", "qwen2", "qwen3", "qwen35"}  # half-split pairs; llama pairs adjacent dims
_GELU_FFN = {"gemma3"}                               # GeGLU (tanh GELU); the rest use SwiGLU
_POST_NORMS = {"gemma3"}                             # norms on each sublayer's output
_QK_NORM = {"gemma3", "qwen3", "qwen35"}             # per-head RMSNorm of queries and keys
_GEMMA3_SWA_PERIOD = 6                               # every 6th gemma3 layer is global


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
            raise LlogosError(f"unsupported architecture '{arch}' (supported: {', '.join(SUPPORTED_ARCHS)})")

        def key(name, default=None):
            value = f.meta.get(f"{arch}.{name}", default)
            if value is None:
                raise LlogosError(f"{f.path}: metadata key {arch}.{name} is missing")
            return value

        n_embd, n_layer, n_head = int(key("embedding_length")), int(key("block_count")), int(key("attention.head_count"))
        head_dim_k = int(key("attention.key_length", n_embd // n_head))
        n_vocab = int(key("vocab_size", 0)) or len(f.meta.get("tokenizer.ggml.tokens", ()))
        if not n_vocab and "token_embd.weight" in f.tensors:
            n_vocab = f.tensors["token_embd.weight"].shape[0]
        base = float(key("rope.freq_base", 10000.0))
        scaling = key("rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise LlogosError(f"{f.path}: unsupported rope scaling '{scaling}' (supported: none, linear)")
        scale = 1.0 / float(key("rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0

        window, rope_base, freq_scale = [0] * n_layer, [base] * n_layer, [scale] * n_layer
        n_swa = int(key("attention.sliding_window", 0))
        if arch == "gemma3" and n_swa > 0:
            pattern = f.meta.get(f"{arch}.attention.sliding_window_pattern")
            for il in range(n_layer):
                swa = bool(pattern[il]) if isinstance(pattern, list) else il % _GEMMA3_SWA_PERIOD < _GEMMA3_SWA_PERIOD - 1
                if swa:
                    window[il], rope_base[il], freq_scale[il] = n_swa, float(key("rope.freq_base_swa", 10000.0)), 1.0

        recurrent = [False] * n_layer
        ssm = None
        if arch == "qwen35":
            recurrent = [bool(r) for r in key("attention.recurrent_layers", [])] or [
                (il + 1) % int(key("full_attention_interval")) != 0 for il in range(n_layer)]
            n_v_heads = int(key("ssm.time_step_rank"))
            ssm = SSMConfig(conv_kernel=int(key("ssm.conv_kernel")), head_k_dim=int(key("ssm.state_size")),
                            n_k_heads=int(key("ssm.group_count")), n_v_heads=n_v_heads,
                            head_v_dim=int(key("ssm.inner_size")) // n_v_heads)

        if arch == "gemma3" and n_layer == 62:
            # Gemma 3 27B scales queries by the model width per head, not the head size.
            attn_scale = 1.0 / math.sqrt(n_embd / n_head)
        else:
            attn_scale = 1.0 / math.sqrt(head_dim_k)

        cfg = cls(
            arch=arch, n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
            n_head_kv=int(key("attention.head_count_kv", n_head)),
            head_dim_k=head_dim_k, head_dim_v=int(key("attention.value_length", head_dim_k)),
            n_ff=int(key("feed_forward_length")), n_ctx_train=int(key("context_length")),
            norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            rope_dims=int(key("rope.dimension_count", head_dim_k)), rope_neox=arch in _NEOX_ROPE,
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
        missing = [name for name in self.tensor_names() if name not in f.tensors]
        if missing:
            raise LlogosError(f"{f.path}: tensor {missing[0]} is missing"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))

    def tensor_names(self) -> list[str]:
        """Every tensor the forward pass reads (biases and rope_freqs are optional)."""
        names = ["token_embd.weight", "output_norm.weight", self.output]
        for il in range(self.n_layer):
            p = f"blk.{il}."
            layer = ["attn_norm", self.ffn_norm, "ffn_gate", "ffn_up", "ffn_down"]
            layer += ["post_attention_norm", "post_ffw_norm"] if self.post_norms else []
            if self.recurrent[il]:
                layer += ["attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha", "ssm_conv1d", "ssm_norm", "ssm_out"]
                names += [p + "ssm_a", p + "ssm_dt.bias"]
            else:
                layer += ["attn_q", "attn_k", "attn_v", "attn_output"]
                layer += ["attn_q_norm", "attn_k_norm"] if self.qk_norm else []
            names += [p + n + ".weight" for n in layer]
        return names
