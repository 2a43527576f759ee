"""LFM2's short convolutions: gated causal depthwise convolutions in place of attention in most layers.

Per sequence (cache slot) and layer the state is the last conv_kernel-1 gated inputs of the
convolution (the backends' ssm_conv, which Gated DeltaNet uses too); it does not grow with the context.
"""

from dataclasses import dataclass

from llogos_cli.model.config import ModelConfig


@dataclass(slots=True)
class ConvState:
    conv: object  # (n_slots, conv_kernel - 1, n_embd) last gated inputs


def new_state(b, cfg: ModelConfig, n_slots: int) -> ConvState:
    return ConvState(b.zeros((n_slots, cfg.conv_kernel - 1, cfg.n_embd)))


def block(b, cfg: ModelConfig, w: dict, p: str, x, state: ConvState, layout):
    """The convolution sublayer of layer prefix p on normed x (T, n_embd): in_proj gives an input
    gate, an output gate and the input; advances the state of each slot in the batch layout."""
    d = cfg.n_embd
    gates_and_input = b.matmul(x, w[p + "shortconv.in_proj.weight"])      # (T, 3 * n_embd)
    gate_in, gate_out, h = (gates_and_input[:, i * d:(i + 1) * d] for i in range(3))  # (T, n_embd) each
    h = b.ssm_conv(b.mul(gate_in, h), state.conv, w[p + "shortconv.conv.weight"], layout)  # (T, n_embd)
    return b.matmul(b.mul(gate_out, h), w[p + "shortconv.out_proj.weight"])  # (T, n_embd)
