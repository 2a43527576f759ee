"""Gated DeltaNet, the linear-attention layers of qwen35: a fixed-size recurrent state in place of a KV cache.

Per sequence (cache slot) and layer the state is the last conv_kernel-1 inputs of a causal convolution and, per
value head, a (head_v_dim, head_k_dim) matrix updated once per token by the gated delta rule (see
backends/cpu/numpy_recurrent.py). Its size does not grow with the context.
"""

import math
from dataclasses import dataclass

from llogos_cli.model.config import ModelConfig


@dataclass(slots=True)
class DeltaState:
    conv: object  # (n_slots, conv_kernel - 1, 2 * n_k_heads * head_k_dim + n_v_heads * head_v_dim) last conv inputs
    ssm: object   # (n_slots, n_v_heads, head_v_dim, head_k_dim) delta-rule state, one matrix per value head


def new_state(b, cfg: ModelConfig, n_slots: int) -> DeltaState:
    s = cfg.ssm
    return DeltaState(b.zeros((n_slots, s.conv_kernel - 1, s.conv_channels)),
                      b.zeros((n_slots, s.n_v_heads, s.head_v_dim, s.head_k_dim)))


def block(b, cfg: ModelConfig, w: dict, p: str, x, state: DeltaState, layout):
    """The linear-attention sublayer of layer prefix p on normed x (T, n_embd); advances the state
    of each slot in the batch layout."""
    s = cfg.ssm
    T = x.shape[0]
    key_dim, value_dim = s.n_k_heads * s.head_k_dim, s.n_v_heads * s.head_v_dim
    qkv, z, beta, alpha = b.matmuls(x, [w[p + name + ".weight"] for name in ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha")])
    # qkv (T, 2 * key_dim + value_dim); z (T, value_dim) the output gate; beta, alpha (T, n_v_heads)
    beta = b.sigmoid(beta)                                                 # (T, n_v_heads) write strength
    dt = b.softplus(b.add(alpha, w[p + "ssm_dt.bias"]))                    # (T, n_v_heads)
    # The file stores ssm_a = -exp(A_log), so this is the log of each head's decay, <= 0.
    g = b.mul(dt, w[p + "ssm_a"])                                          # (T, n_v_heads)

    qkv = b.silu(b.ssm_conv(qkv, state.conv, w[p + "ssm_conv1d.weight"], layout))  # (T, 2 * key_dim + value_dim)
    q = qkv[:, :key_dim].reshape(T, s.n_k_heads, s.head_k_dim)             # (T, n_k_heads, dk)
    k = qkv[:, key_dim:2 * key_dim].reshape(T, s.n_k_heads, s.head_k_dim)  # (T, n_k_heads, dk)
    # Value heads (and z, beta, g, ssm_out's columns) come tiled over the key heads from llama.cpp's
    # converter, which is the order delta_net reads them in.
    v = qkv[:, 2 * key_dim:].reshape(T, s.n_v_heads, s.head_v_dim)         # (T, n_v_heads, dv)
    q = b.scale(b.l2norm(q, cfg.norm_eps), 1.0 / math.sqrt(s.head_k_dim))  # (T, n_k_heads, dk)
    k = b.l2norm(k, cfg.norm_eps)                                          # (T, n_k_heads, dk)

    o = b.delta_net(q, k, v, g, beta, state.ssm, layout)                        # (T, n_v_heads, dv)
    # ssm_norm is stored as trained: the converter folds +1 into qwen35's other norms, not this one.
    o = b.rmsnorm(o, w[p + "ssm_norm.weight"], cfg.norm_eps)               # (T, n_v_heads, dv)
    o = b.mul(o, b.silu(z.reshape(T, s.n_v_heads, s.head_v_dim)))          # (T, n_v_heads, dv)
    return b.matmul(o.reshape(T, value_dim), w[p + "ssm_out.weight"])      # (T, n_embd)
