"""Synthetic models for the CUDA benchmark and tests: GGUF files of random weights with the shapes
and tensor types of real ones (SmolLM2-135M as shipped; Llama 3.2 1B, Llama 3.1 8B and the
Qwen3.5-0.8B hybrid in Q4_K_M).

    python bench/synthetic.py smollm2-135m DIR     writes DIR/smollm2-135m-v<FORMAT_VERSION>.gguf
"""

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as Q

FORMAT_VERSION = 2  # bump to regenerate cached files


@dataclass(frozen=True)
class Hybrid:
    """Qwen3.5's Gated DeltaNet layers: three of every four layers, full attention in the fourth."""
    n_k_heads: int
    n_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int = 4
    interval: int = 4       # every interval-th layer is full attention

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_v_dim

    @property
    def conv_channels(self) -> int:
        """Queries, keys and values, as attn_qkv makes them and ssm_conv1d convolves them."""
        return 2 * self.n_k_heads * self.head_k_dim + self.value_dim


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts feed-forward in every layer (qwen3moe): n_used of n_expert experts a
    token, each a SwiGLU of n_ff hidden units, stacked in ffn_{gate,up,down}_exps."""
    n_expert: int
    n_used: int
    n_ff: int


@dataclass(frozen=True)
class Spec:
    name: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_kv: int
    n_ff: int
    rope_base: float
    tied: bool          # the LM head is token_embd
    mix: str            # "q4_1" (SmolLM2 as shipped), "q4_k_m", "q3_k_m", "q2_k", "iq4_xs" or "mxfp4"
    head_dim: int = 0   # 0: n_embd // n_head
    rope_dims: int = 0  # 0: all of head_dim
    hybrid: Hybrid | None = None
    experts: Experts | None = None
    sliding_window: int = 0   # gpt-oss: every other layer attends this far back (its only family here)

    @property
    def arch(self) -> str:
        if self.sliding_window:
            return "gpt-oss"
        return "qwen35" if self.hybrid else "qwen3moe" if self.experts else "llama"

    @property
    def d_head(self) -> int:
        return self.head_dim or self.n_embd // self.n_head

    def recurrent(self, layer: int) -> bool:
        return self.hybrid is not None and (layer + 1) % self.hybrid.interval != 0

    def qtype(self, name: str, layer: int) -> Q:
        if self.mix == "q4_1":
            return Q.Q8_0 if name == "token_embd" else Q.Q4_1
        if self.mix == "mxfp4":   # as gpt-oss ships: its experts in MXFP4, the other matrices in Q8_0
            return Q.MXFP4 if name.endswith("_exps") else Q.Q8_0
        if name == "output" or (name == "token_embd" and self.tied):
            return Q.Q6_K
        if self.mix in ("iq4_xs", "q2_k"):   # every other matrix of the type (llama.cpp's --pure)
            return Q[self.mix.upper()]
        # llama.cpp's Q4_K_M spends 6 bits on attn_v and ffn_down in the first and last eighth of
        # the layers and every third layer between; its Q3_K_M (roughly) 5 bits there, 4 bits on
        # the rest of attn_v, ffn_down and attn_output, 3 bits elsewhere.
        n = self.n_layer
        more_bits = layer < n // 8 or layer >= 7 * n // 8 or (layer - n // 8) % 3 == 2
        wide = name in ("attn_v", "ffn_down", "ffn_down_exps")
        if self.mix == "q3_k_m":
            return Q.Q5_K if wide and more_bits else Q.Q4_K if wide or name == "attn_output" else Q.Q3_K
        return Q.Q6_K if wide and more_bits else Q.Q4_K


SPECS = {
    "smollm2-135m": Spec("smollm2-135m", 49152, 576, 30, 9, 3, 1536, 100000.0, True, "q4_1"),
    "llama-1b": Spec("llama-1b", 128256, 2048, 16, 32, 8, 8192, 500000.0, True, "q4_k_m"),
    "llama-8b": Spec("llama-8b", 128256, 4096, 32, 32, 8, 14336, 500000.0, False, "q4_k_m"),
    # Qwen3.5-0.8B's text model: gated attention of 8 heads of 256 (a quarter of each rotated) in
    # every fourth layer, Gated DeltaNet of 16 heads of 128 in the others.
    "qwen35-0.8b": Spec("qwen35-0.8b", 248320, 1024, 24, 8, 2, 3584, 1e7, True, "q4_k_m",
                        head_dim=256, rope_dims=64, hybrid=Hybrid(16, 16, 128, 128)),
    # Qwen3-30B-A3B: 8 of 128 experts of 768 a token, 3.3B of 30.5B weights active; Q3_K_M, ~14 GB.
    "qwen3-30b-a3b": Spec("qwen3-30b-a3b", 151936, 2048, 48, 32, 4, 768, 1e6, False, "q3_k_m",
                          head_dim=128, experts=Experts(128, 8, 768)),
    # gpt-oss-20b: 4 of 32 experts of 2880 a token, 3.6B of 21B weights active; attention of 64
    # heads of 64 (sinks, biases) windowed to 128 tokens in every other layer; ~12 GB.
    "gpt-oss-20b": Spec("gpt-oss-20b", 201088, 2880, 24, 64, 8, 2880, 150000.0, False, "mxfp4",
                        head_dim=64, experts=Experts(32, 4, 2880), sliding_window=128),
}

# Values of the float16 scale fields per block type (byte offset, value): weights of standard
# deviation ~0.02 centred near 0, like a trained model's, so activations stay finite.
_SCALES = {Q.Q8_0: ((0, 2.7e-4),), Q.Q4_0: ((0, 4.3e-3),), Q.Q4_1: ((0, 4.3e-3), (2, -0.032)),
           Q.Q5_0: ((0, 2.2e-3),), Q.Q5_1: ((0, 2.2e-3), (2, -0.034)), Q.Q4_K: ((0, 1.4e-4), (2, 1.0e-3)),
           Q.Q5_K: ((0, 7e-5), (2, 1.1e-3)), Q.Q6_K: ((208, 1.7e-5),)}


class RandomBytes:
    """Random bytes cut from one 64 MiB pool at random offsets: fast enough for 5 GB of weights."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.size = 64 << 20
        self.pool = np.tile(self.rng.integers(0, 256, self.size, dtype=np.uint8), 2)

    def take(self, n: int) -> np.ndarray:
        """n bytes, a copy (the pool repeats in tensors over 64 MiB)."""
        start = int(self.rng.integers(0, self.size))
        run = self.pool[start:start + min(n, self.size)]
        return run.copy() if n <= self.size else np.resize(run, n)


def random_matrix(src: RandomBytes, qtype: Q, rows: int, cols: int) -> np.ndarray:
    """GGUF bytes (rows, bytes per row) of random weights."""
    if qtype in (Q.F32, Q.F16):
        return (src.rng.standard_normal((rows, cols), np.float32) * 0.02).astype(
            np.float32 if qtype == Q.F32 else np.float16).view(np.uint8)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = src.take(rows * cols // block * size).reshape(-1, size)
    for offset, value in _SCALES[qtype]:
        raw[:, offset:offset + 2] = np.array([value], np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def layer_matrices(spec: Spec, layer: int) -> list[tuple[str, int, int]]:
    """(name, rows, cols) of layer's weight matrices."""
    e, hd = spec.n_embd, spec.d_head
    ffn = [("ffn_gate", spec.n_ff, e), ("ffn_up", spec.n_ff, e), ("ffn_down", e, spec.n_ff)]
    if spec.recurrent(layer):
        h = spec.hybrid
        return [("attn_qkv", h.conv_channels, e), ("attn_gate", h.value_dim, e),
                ("ssm_alpha", h.n_v_heads, e), ("ssm_beta", h.n_v_heads, e), ("ssm_out", e, h.value_dim), *ffn]
    q_rows = spec.n_head * hd * (2 if spec.hybrid else 1)  # qwen35's queries carry their output gate
    attention = [("attn_q", q_rows, e), ("attn_k", spec.n_kv * hd, e), ("attn_v", spec.n_kv * hd, e),
                 ("attn_output", e, spec.n_head * hd)]
    return attention if spec.experts else attention + ffn


def expert_matrices(spec: Spec) -> list[tuple[str, int, int]]:
    """(name, rows, cols) of one expert's matrices, stacked n_expert deep in each layer."""
    x, e = spec.experts, spec.n_embd
    return [("ffn_gate_exps", x.n_ff, e), ("ffn_up_exps", x.n_ff, e), ("ffn_down_exps", e, x.n_ff)]


def write_model(spec: Spec, path: Path) -> Path:
    """Write spec's GGUF of random weights to path (atomically); return path."""
    if spec.experts:
        raise ValueError(f"{spec.name}: mixture-of-experts shapes are written by bench/synthetic_gguf.py")
    hd = spec.d_head
    w = GGUFWriter(str(path) + ".tmp", spec.arch)
    w.add_name(f"synthetic {spec.name}")
    w.add_context_length(8192)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_kv)
    if spec.head_dim:
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_rope_freq_base(spec.rope_base)
    w.add_rope_dimension_count(spec.rope_dims or hd)
    w.add_layer_norm_rms_eps(1e-5 if spec.arch == "llama" else 1e-6)
    if spec.hybrid:
        h = spec.hybrid
        w.add_ssm_conv_kernel(h.conv_kernel)
        w.add_ssm_state_size(h.head_k_dim)
        w.add_ssm_group_count(h.n_k_heads)
        w.add_ssm_time_step_rank(h.n_v_heads)
        w.add_ssm_inner_size(h.value_dim)
        w.add_uint32(f"{spec.arch}.full_attention_interval", h.interval)
        w.add_rope_dimension_sections([11, 11, 10, 0])  # text positions: every section the same
    w.add_vocab_size(spec.n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "ab"] + [f"<t{i}>" for i in range(3, spec.n_vocab)])
    w.add_token_types([1] * spec.n_vocab)
    w.add_token_merges(["a b"])   # llama.cpp refuses a BPE vocabulary without merges
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)

    src = RandomBytes()

    def matrix(name: str, layer: int, rows: int, cols: int, prefix: str = ""):
        qtype = spec.qtype(name, layer)
        w.add_tensor(f"{prefix}{name}.weight", random_matrix(src, qtype, rows, cols), raw_dtype=qtype)

    def vector(name: str, values: np.ndarray):
        w.add_tensor(name, values.astype(np.float32))

    def norm(name: str, n: int = spec.n_embd):
        vector(name, 1 + 0.1 * src.rng.standard_normal(n))

    matrix("token_embd", 0, spec.n_vocab, spec.n_embd)
    norm("output_norm.weight")
    if not spec.tied:
        matrix("output", 0, spec.n_vocab, spec.n_embd)
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight")
        norm(p + ("post_attention_norm.weight" if spec.hybrid else "ffn_norm.weight"))
        for name, rows, cols in layer_matrices(spec, il):
            matrix(name, il, rows, cols, p)
        if spec.recurrent(il):
            h = spec.hybrid
            vector(p + "ssm_conv1d.weight", 0.3 * src.rng.standard_normal((h.conv_channels, h.conv_kernel)))
            vector(p + "ssm_a", -src.rng.uniform(0.5, 4.0, h.n_v_heads))   # decay rates: -exp(A_log)
            vector(p + "ssm_dt.bias", src.rng.uniform(-1.0, 1.0, h.n_v_heads))
            norm(p + "ssm_norm.weight", h.head_v_dim)
        elif spec.hybrid:
            norm(p + "attn_q_norm.weight", hd)
            norm(p + "attn_k_norm.weight", hd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(str(path) + ".tmp", path)
    return path


def model_file(spec: Spec, folder: Path) -> Path:
    """spec's GGUF under folder, written if not there yet."""
    path = folder / f"{spec.name}-v{FORMAT_VERSION}.gguf"
    if not path.is_file():
        t = time.perf_counter()
        write_model(spec, path)
        print(f"wrote {path} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return path


if __name__ == "__main__":
    folder = Path(sys.argv[2])
    folder.mkdir(parents=True, exist_ok=True)
    print(model_file(SPECS[sys.argv[1]], folder))
