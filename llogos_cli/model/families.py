"""What each supported family does that its GGUF file does not say, as llama.cpp assigns it: one
row per `general.architecture`, read by ModelConfig.from_gguf."""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Family:
    """Traits fixed by the family rather than stored in the file, as llama.cpp assigns them."""
    rope_neox: bool = False          # half-split pairs; llama's converter permutes to adjacent pairs
    gelu_ffn: bool = False           # GeGLU (tanh GELU) instead of SwiGLU
    pre_norms: bool = True           # RMSNorm on each sublayer's input
    post_norms: bool = False         # RMSNorm on each sublayer's output
    qk_norm: str = ""                # RMSNorm of queries and keys: "head" (each head) or "all" (the whole projection)
    attn_gate: bool = False          # attention output gated by sigmoid(part of attn_q)
    ffn_norm: str = "ffn_norm"       # tensor holding the pre-FFN norm
    embed_scaled: bool = False       # embeddings times sqrt(n_embd)
    # Sliding windows: None, the family has none; else, without a pattern in the file, every
    # swa_period-th layer is global. Their RoPE base defaults to swa_rope_base (0: the global one),
    # and their frequencies are scaled like the global layers' only with swa_rope_scaled.
    swa_period: int | None = None
    swa_rope_base: float = 0.0
    swa_rope_scaled: bool = False
    wide_query_layers: int = 0       # the variant of this depth scales queries by n_embd / n_head, not the head size
    no_rope_period: int = 0          # every no_rope_period-th layer attends without RoPE
    attn_softcap: float = 0.0        # defaults of the soft-caps when the file has none (0: none)
    final_softcap: float = 0.0
    output_norm: str = "output_norm.weight"   # tensor holding the final norm
    # Experts' SwiGLU clamped as gpt-oss's: gate up to limit, up within +-limit, then
    # gate * sigmoid(alpha * gate) * (up + 1); 0: the plain SwiGLU. llama.cpp fixes both in code.
    swiglu_limit: float = 0.0
    swiglu_alpha: float = 1.0
    expert_norm: bool = True         # the chosen experts' probabilities scaled to sum to 1
    shared_expert: bool = False      # beside the routed experts, one every token takes (ffn_*_shexp)
    # Recurrent layers in place of attention in some: "shortconv" (LFM2: where the file gives a
    # layer no KV heads) or "deltanet" (Qwen3.5's Gated DeltaNet: the file's recurrent_layers, else
    # all but every full_attention_interval-th); "": attention everywhere.
    recurrent: str = ""
    # BERT's encoder: absolute position and token-type embeddings (position_embd, token_types),
    # LayerNorm with bias after each residual add, attention over the whole sequence (not causal),
    # a GELU feed-forward without a gate, and no LM head: it makes embeddings only.
    encoder: bool = False


FAMILIES = {
    "llama": Family(),
    "gemma3": Family(rope_neox=True, gelu_ffn=True, post_norms=True, qk_norm="head", embed_scaled=True, swa_period=6,
                     swa_rope_base=10000.0, wide_query_layers=62),
    "qwen2": Family(rope_neox=True),
    "qwen3": Family(rope_neox=True, qk_norm="head"),
    "qwen35": Family(rope_neox=True, qk_norm="head", attn_gate=True, ffn_norm="post_attention_norm",
                     recurrent="deltanet"),
    "gemma2": Family(rope_neox=True, gelu_ffn=True, post_norms=True, embed_scaled=True, swa_period=2,
                     swa_rope_scaled=True, wide_query_layers=46, attn_softcap=50.0, final_softcap=30.0),
    "phi3": Family(rope_neox=True),           # llama.cpp leaves Phi-3's sliding window off, as here
    "granite": Family(),                      # its multipliers are in the file (embedding_scale, residual_scale, ...)
    "olmo2": Family(rope_neox=True, pre_norms=False, post_norms=True, qk_norm="all", swa_period=4),
    "smollm3": Family(no_rope_period=4),
    "lfm2": Family(rope_neox=True, qk_norm="head", output_norm="token_embd_norm.weight", recurrent="shortconv"),
    # Routed experts where the file has an expert count (ModelConfig.n_expert).
    "qwen3moe": Family(rope_neox=True, qk_norm="head"),
    # Its shared expert's output is gated by a sigmoid of ffn_gate_inp_shexp.
    "qwen2moe": Family(rope_neox=True, expert_norm=False, shared_expert=True),
    # Attention sinks where the file has attn_sinks; biases on every projection and expert.
    "gpt-oss": Family(rope_neox=True, ffn_norm="post_attention_norm", swa_period=2, swa_rope_scaled=True,
                      swiglu_limit=7.0, swiglu_alpha=1.702),
    "bert": Family(encoder=True),
}
SUPPORTED_ARCHS = tuple(FAMILIES)
