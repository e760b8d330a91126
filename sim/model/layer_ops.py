"""The kernels of one transformer layer's forward pass on one TP rank, as the step reads them.

In: a ``LayerShape`` (sim.model.layer_shape: the ``ModelSpec``, micro-batch, sequence length, TP split, dtype
size and the kernel options: flash attention, Megatron's fused kernels or eager PyTorch, FP8's cast kernels,
causal attention). Out: a dense layer's two blocks, ``attention`` (sim.model.attention_ops) and ``mlp``
(sim.model.mlp_ops), separated by the tensor-parallel collectives; a MoE layer's MLP is sim.model.moe_ops.
``RECOMPUTE_OPS``: which of these ops each of Megatron-Core's --recompute-modules replays.
"""

from __future__ import annotations

from sim.model.attention_ops import ATTENTION_CORE, attention_forward_ops
from sim.model.layer_shape import LayerShape
from sim.model.mlp_ops import dense_mlp_forward_ops
from sim.model.ops import Op

# What each of Megatron-Core's --recompute-modules replays in the backward, by op name (transformer_config.py
# recompute_modules; transformer_layer.py, multi_latent_attention.py, moe/experts.py, moe/shared_experts.py).
# ``moe`` (the whole MoE layer under tensor_parallel.checkpoint, moe_layer.py) replays every op of the MoE part and
# its dispatch and combine: the emitters run its forward again rather than a list of ops.
RECOMPUTE_OPS: dict[str, frozenset[str]] = {
    "core_attn": ATTENTION_CORE,
    "layernorm": frozenset({"input_norm", "post_attention_norm"}),  # input_layernorm, pre_mlp_layernorm
    "mla_up_proj": frozenset({"q_proj", "q_up_proj", "kv_up_proj", "rotary_embedding"}),  # and RoPE
    "mlp": frozenset({"mlp_up", "mlp_activation", "mlp_down"}),  # the dense MLP module (its norm is outside)
    "moe_act": frozenset({"experts_activation"}),
    "shared_experts": frozenset({"shared_expert_up", "shared_expert_activation", "shared_expert_down"}),
    "moe": frozenset(),
}


def layer_forward_ops(shape: LayerShape) -> dict[str, tuple[Op, ...]]:
    """Forward kernels of one layer on one TP rank, as two blocks (``attention``, ``mlp``) separated by the
    Megatron tensor-parallel collectives. ``shape``: the rank's shape and kernel options (sim.model.layer_shape,
    whose fields say what each option does: sequence parallelism, fused or eager kernels, FP8's casts, causal
    attention, fused RMSNorm/RoPE). A MoE layer's MLP is sim.model.moe_ops.moe_forward_ops."""
    return {"attention": attention_forward_ops(shape), "mlp": dense_mlp_forward_ops(shape)}
