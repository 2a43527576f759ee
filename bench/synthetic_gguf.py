"""GGUF files of random weights in real model shapes, for the CPU benchmarks, and random GGUF rows for tests.

    python bench/synthetic_gguf.py llama-1b|llama-8b|qwen3-30b-a3b|gpt-oss-20b [--mix MIX] [--out DIR]

Writes DIR/<shape>-<mix>.gguf (DIR: ~/.cache/llogos/bench) in the shapes and type mixes (Q4_K_M,
Q3_K_M, gpt-oss's MXFP4) of bench/synthetic.py's specs (the CUDA benchmark's), the
mixture-of-experts shapes (qwen3-30b-a3b, gpt-oss-20b) with their experts stacked, streamed a tensor at a time so that the 8B
shape needs no more memory than its largest tensor, with a random float16 scale per block and a
BPE vocabulary llama.cpp accepts. Random weights: what a benchmark needs, not a working model.
"""

import argparse
import dataclasses
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter, RopeScalingType
from gguf import GGMLQuantizationType as QType

from bench.synthetic import SPECS, Spec, expert_matrices, layer_matrices
from llogos_cli.paths import cache_dir

# Byte offsets of the float16 scales in each type's block: random bytes there could be inf or NaN.
_F16_FIELDS = {QType.Q8_0: (0,), QType.Q4_0: (0,), QType.Q4_1: (0, 2), QType.Q5_0: (0,), QType.Q5_1: (0, 2),
               QType.Q2_K: (80, 82), QType.Q3_K: (108,), QType.Q4_K: (0, 2), QType.Q5_K: (0, 2), QType.Q6_K: (208,),
               QType.IQ4_NL: (0,), QType.IQ4_XS: (0,), QType.MXFP4: ()}
# About the largest multiple of the float16 scale d a type's weights reach (sub-block scale times
# quant), so that random d of scale / levels give weights of magnitude ~scale.
_LEVELS = {QType.Q2_K: 32, QType.Q3_K: 128, QType.Q4_K: 64, QType.Q5_K: 64, QType.IQ4_NL: 128, QType.IQ4_XS: 4096}


def random_rows(qtype: QType, rows: int, cols: int, rng: np.random.Generator, scale: float = 0.02) -> np.ndarray:
    """Random GGUF rows (rows, bytes per row) of qtype: weights of magnitude ~scale."""
    if qtype in (QType.F32, QType.F16, QType.BF16):
        w = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        if qtype == QType.BF16:
            return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return w.astype(np.float16 if qtype == QType.F16 else np.float32).view(np.uint8)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for o in _F16_FIELDS[qtype]:
        d = rng.uniform(0.25, 1.0, (rows, cols // block)) * scale / _LEVELS.get(qtype, 32)
        raw[..., o:o + 2] = d.astype(np.float16)[..., None].view(np.uint8)
    if qtype == QType.MXFP4:   # the E8M0 byte e scales by 2^(e - 128), the values up to 12 of it
        raw[..., 0] = 128 + np.floor(np.log2(scale / 12)) - rng.integers(0, 2, (rows, cols // block))
    return raw.reshape(rows, -1)


def _tensors(spec: Spec) -> list[tuple[str, int, int, int, QType]]:
    """(name, stacked, rows, cols, type) of every matrix, in file order (stacked: experts, else 1);
    types by spec's mix."""
    out = [("token_embd.weight", 1, spec.n_vocab, spec.n_embd, spec.qtype("token_embd", 0))]
    if not spec.tied:
        out.append(("output.weight", 1, spec.n_vocab, spec.n_embd, spec.qtype("output", 0)))
    for il in range(spec.n_layer):
        out += [(f"blk.{il}.{name}.weight", 1, rows, cols, spec.qtype(name, il))
                for name, rows, cols in layer_matrices(spec, il)]
        if spec.experts:
            out.append((f"blk.{il}.ffn_gate_inp.weight", 1, spec.experts.n_expert, spec.n_embd, QType.F32))
            out += [(f"blk.{il}.{name}.weight", spec.experts.n_expert, rows, cols, spec.qtype(name, il))
                    for name, rows, cols in expert_matrices(spec)]
    return out


def _vectors(spec: Spec) -> list[tuple[str, tuple[int, ...], float]]:
    """(name, shape, value) of the float32 tensors that are not matrices: norms (ones), and
    gpt-oss's biases and attention sinks (zeros)."""
    e, hd = spec.n_embd, spec.d_head
    if spec.arch == "gpt-oss":
        x = spec.experts
        per_layer = [("attn_norm.weight", (e,), 1.0), ("post_attention_norm.weight", (e,), 1.0),
                     ("attn_q.bias", (spec.n_head * hd,), 0.0), ("attn_k.bias", (spec.n_kv * hd,), 0.0),
                     ("attn_v.bias", (spec.n_kv * hd,), 0.0), ("attn_output.bias", (e,), 0.0),
                     ("attn_sinks.weight", (spec.n_head,), 0.0), ("ffn_gate_inp.bias", (x.n_expert,), 0.0),
                     ("ffn_gate_exps.bias", (x.n_expert, x.n_ff), 0.0), ("ffn_up_exps.bias", (x.n_expert, x.n_ff), 0.0),
                     ("ffn_down_exps.bias", (x.n_expert, e), 0.0)]
    else:
        per_layer = [("attn_norm.weight", (e,), 1.0), ("ffn_norm.weight", (e,), 1.0)]
        if spec.experts:
            per_layer += [("attn_q_norm.weight", (hd,), 1.0), ("attn_k_norm.weight", (hd,), 1.0)]
    return [("output_norm.weight", (e,), 1.0)] + [(f"blk.{il}.{name}", shape, value)
                                                  for il in range(spec.n_layer) for name, shape, value in per_layer]


def write_model(shape: str, out: Path, mix: str | None = None) -> Path:
    """The synthetic GGUF of `shape` (in another type mix than its own if given) in folder out,
    written once; tensors are streamed to the file one at a time, so an 8B model needs no more
    memory than its largest tensor."""
    s = SPECS[shape] if mix is None else dataclasses.replace(SPECS[shape], mix=mix)
    path = out / f"{shape}-{s.mix}.gguf"
    if path.exists():
        return path
    e, hd = s.n_embd, s.d_head
    tmp = path.with_suffix(".tmp")
    w = GGUFWriter(tmp, s.arch)
    w.add_name(f"synthetic {shape} {s.mix.upper()}")
    w.add_context_length(8192)
    w.add_embedding_length(e)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_kv)
    if s.head_dim:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if s.experts:
        w.add_expert_count(s.experts.n_expert)
        w.add_expert_used_count(s.experts.n_used)
        w.add_expert_feed_forward_length(s.experts.n_ff)
    if s.sliding_window:   # gpt-oss: YaRN-scaled RoPE from a 4096-token training context, as it ships
        w.add_sliding_window(s.sliding_window)
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
        w.add_rope_scaling_yarn_beta_fast(32.0)
        w.add_rope_scaling_yarn_beta_slow(1.0)
    else:
        w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(1e-6 if s.arch in ("qwen3moe", "qwen35") else 1e-5)
    w.add_file_type({"q4_k_m": 15, "q3_k_m": 12, "q2_k": 10, "iq4_xs": 30, "mxfp4": 38}[s.mix])   # MOSTLY_Q4_K_M, ...
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(["a", "b", "ab"] + [f"<t{i}>" for i in range(3, s.n_vocab)])
    w.add_token_types([1] * s.n_vocab)
    w.add_token_merges(["a b"])   # llama.cpp refuses a BPE vocabulary without merges
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    norms, matrices = _vectors(s), _tensors(s)
    for name, shape, _ in norms:
        w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
    for name, stacked, rows, cols, qtype in matrices:
        block, size = GGML_QUANT_SIZES[qtype]
        shape = (rows, cols // block * size) if stacked == 1 else (stacked, rows, cols // block * size)
        w.add_tensor_info(name, shape, np.dtype(np.uint8), stacked * rows * cols // block * size, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for _, shape, value in norms:
        w.write_tensor_data(np.full(shape, value, np.float32))
    for _, stacked, rows, cols, qtype in matrices:
        raw = random_rows(qtype, stacked * rows, cols, rng)
        w.write_tensor_data(raw if stacked == 1 else raw.reshape(stacked, rows, -1))
    w.close()
    tmp.rename(path)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", choices=[n for n, s in SPECS.items() if s.arch != "qwen35" and s.mix != "q4_1"])
    ap.add_argument("--mix", choices=["q4_k_m", "q3_k_m", "q2_k", "iq4_xs"], help="another type mix than the shape's own")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    print(write_model(args.shape, args.out or cache_dir("bench"), args.mix))


if __name__ == "__main__":
    main()
