"""The kernels of one transformer layer's forward pass on one TP rank, as the step reads them.

In: a ``ModelSpec`` (sim.model.transformer), the micro-batch, sequence length, TP split, dtype size and the
kernel options (flash attention, Megatron's fused kernels or eager PyTorch, FP8's cast kernels, causal
attention). Out: a dense layer's two blocks, ``attention`` (sim.model.attention_ops) and ``mlp``
(sim.model.mlp_ops), separated by the tensor-parallel collectives; a MoE layer's MLP is sim.model.moe_ops.
``RECOMPUTE_OPS``: which of these ops each of Megatron-Core's --recompute-modules replays.
"""

from __future__ import annotations

from sim.model.attention_ops import ATTENTION_CORE, attention_forward_ops
from sim.model.fp8_casts import Fp8Casts
from sim.model.mlp_ops import dense_mlp_forward_ops
from sim.model.ops import Op
from sim.model.transformer import ModelSpec

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


def layer_forward_ops(
    spec: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int,
    sequence_parallel: bool,
    elem_bytes: int,
    flash_attention: bool,
    fused_kernels: bool = True,
    fp8_casts: Fp8Casts | None = None,
    causal: bool = False,
    fused_norm_rope: bool | None = None,
) -> dict[str, tuple[Op, ...]]:
    """Forward kernels of one layer on one TP rank, as two blocks (``attention``, ``mlp``) separated by the
    Megatron tensor-parallel collectives. Norm/dropout/residual work is divided by tp only with sequence
    parallelism (without it every TP rank repeats it). ``fused_kernels``: Megatron-LM's fused norm, bias-
    activation and dropout-add kernels (one read and one write per tensor); without it, the unfused element-wise
    kernels of a PyTorch eager Llama (sim.model.ops: ``EAGER_RMSNORM_BYTES``, ``EAGER_ROPE_BYTES``). ``fp8_casts``:
    FP8 training's cast/transpose kernels around each linear GEMM (sim.model.fp8_casts); None: none. ``causal``: flash
    attention skips the score tiles above the diagonal (sim.model.flash_tiles); the unfused path computes the full
    s x s matrix and masks it, as Megatron-LM's fused masked softmax does. ``fused_norm_rope``: the RMSNorm and
    rotary kernels fused (one read, one write) or eager whatever ``fused_kernels`` says (None: as it says), for
    eager modelling code calling flash-attn's fused kernels. A MoE layer's MLP is sim.model.moe_ops.moe_forward_ops."""
    args = (spec, micro_batch, seq_len, tp, sequence_parallel, elem_bytes, flash_attention, fused_kernels,
            fp8_casts, causal, fused_norm_rope)
    return {"attention": attention_forward_ops(*args), "mlp": dense_mlp_forward_ops(*args)}
