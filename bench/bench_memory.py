"""Per-sequence context memory of a hybrid model (Qwen3.5-0.8B) against an all-attention one of its shape.

    python bench/bench_memory.py

Sizes are one sequence's share of the arrays Model.new_cache allocates (NumPy maps their pages
lazily, so nothing is touched). The hybrid keeps a KV cache only in every 4th layer; its DeltaNet
layers hold a float32 state whose size does not depend on the context. Prints a Markdown table for docs/PERF.md.
"""

import dataclasses

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.model.config import ModelConfig, SSMConfig
from llogos_cli.model.families import FAMILIES
from llogos_cli.model.forward import Model

CONTEXTS = (4096, 32768)
CACHE_TYPES = ("f16", "f32")
MiB = 1 << 20


def qwen35_0_8b(hybrid: bool) -> ModelConfig:
    """Qwen/Qwen3.5-0.8B's text hyper-parameters; hybrid=False makes every layer full attention."""
    n_layer = 24
    recurrent = tuple(hybrid and (il + 1) % 4 != 0 for il in range(n_layer))  # full_attention_interval 4
    fam = FAMILIES["qwen35"]
    return ModelConfig(
        arch="qwen35", n_vocab=248320, n_embd=1024, n_layer=n_layer, n_head=8, n_head_kv=2,
        head_dim_k=256, head_dim_v=256, n_ff=3584, n_expert=0, n_expert_used=0, n_ff_exp=0,
        n_ctx_train=262144, norm_eps=1e-6, rope_dims=64, rope_neox=fam.rope_neox, rope_base=(1e7,) * n_layer,
        rope_freq_scale=(1.0,) * n_layer, rope_layers=(True,) * n_layer, rope_attn_factor=1.0,
        n_ctx_orig=262144, window=(0,) * n_layer, recurrent=recurrent, embed_scale=1.0,
        attn_scale=256 ** -0.5, residual_scale=1.0, logit_scale=1.0, attn_softcap=fam.attn_softcap,
        final_softcap=fam.final_softcap, gelu_ffn=fam.gelu_ffn, pre_norms=fam.pre_norms,
        post_norms=fam.post_norms, qk_norm=fam.qk_norm, fused_qkv=False, fused_ffn=False,
        attn_gate=fam.attn_gate, ffn_norm=fam.ffn_norm, output_norm=fam.output_norm,
        output="token_embd.weight",
        ssm=SSMConfig(conv_kernel=4, head_k_dim=128, n_k_heads=16, n_v_heads=16, head_v_dim=128) if hybrid else None,
        conv_kernel=0)


def context_bytes(cfg: ModelConfig, n_ctx: int, cache_type: str) -> tuple[int, int]:
    """(KV cache bytes, recurrent state bytes) of one sequence, as new_cache allocates them: a
    cache of one slot holds a second, the scratch pad slot, which is not the sequence's."""
    model = Model.__new__(Model)   # new_cache needs only the config and a backend, not weights
    model.cfg, model.backend = cfg, NumpyBackend()
    cache = model.new_cache(1, n_ctx, cache_type, cache_type)
    regions = cache.n_slots + 1
    kv = sum(c.k.nbytes + c.v.nbytes for c in cache.kv if c is not None)
    state = sum(getattr(s, f.name).nbytes for s in cache.state if s is not None for f in dataclasses.fields(s))
    return kv // regions, state // regions


def main():
    print("| model (Qwen3.5-0.8B shape) | cache | KV per token | fixed state | "
          + " | ".join(f"at {n // 1024}k: total (per token of context)" for n in CONTEXTS) + " |")
    print("|---|---|---|---|" + "---|" * len(CONTEXTS))
    for hybrid in (True, False):
        cfg = qwen35_0_8b(hybrid)
        n_rec = sum(cfg.recurrent)
        name = (f"hybrid: {n_rec} Gated DeltaNet + {cfg.n_layer - n_rec} attention layers" if n_rec
                else f"all {cfg.n_layer} layers full attention")
        for cache_type in CACHE_TYPES:
            sizes = [context_bytes(cfg, n, cache_type) for n in CONTEXTS]
            per_token = sizes[0][0] / CONTEXTS[0]
            totals = " | ".join(f"{(kv + state) / MiB:.1f} MiB ({(kv + state) / n / 1024:.1f} KiB)"
                                for n, (kv, state) in zip(CONTEXTS, sizes))
            print(f"| {name} | {cache_type} | {per_token / 1024:.0f} KiB | {sizes[0][1] / MiB:.1f} MiB | {totals} |")

if __name__ == "__main__":
    main()
