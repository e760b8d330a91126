"""The kernels of one dense layer's MLP block on one TP rank, and the MLP activation kernel a MoE layer's
experts share.

In: a ``LayerShape`` (sim.model.layer_shape: the ``ModelSpec``, micro-batch, sequence length, TP split, dtype
size and the kernel options, of which fused or eager kernels and FP8's casts apply). Out: ``Op`` tuples in
forward order: post-attention norm, up projection (gate and up when gated), activation (bias-GeLU, SwiGLU, GeGLU
or squared ReLU), down projection, dropout + residual.
"""

from __future__ import annotations

from sim.model.fp8_casts import with_fp8_casts
from sim.model.layer_shape import LayerShape
from sim.model.ops import EAGER_SWIGLU_KERNELS, Op, elementwise, linear
from sim.model.transformer import ModelSpec


def mlp_activation(spec: ModelSpec, name: str, elements: float, elem_bytes: int, fused_kernels: bool) -> Op:
    """The MLP's activation over ``elements`` (tokens x local FFN width): bias-GeLU, SwiGLU or squared ReLU."""
    activation_reads = 2 if spec.gated_mlp else 1
    activation_kernels = 1
    if not fused_kernels and spec.gated_mlp:  # act(gate) is written out, then multiplied by up
        activation_reads, activation_writes, activation_kernels = 3, 2, EAGER_SWIGLU_KERNELS
    elif spec.mlp == "squared_relu":
        # Megatron-LM's squared_relu is torch.pow(F.relu(x), 2) (megatron/core/activations.py), never fused:
        # two element-wise kernels, each reading and writing the (tokens, ffn) tensor.
        activation_reads, activation_writes, activation_kernels = 2, 2, 2
    else:
        activation_writes = 1
    return elementwise(name, elements, elem_bytes, reads=activation_reads, writes=activation_writes,
                       kernels=activation_kernels)


def dense_mlp_forward_ops(shape: LayerShape) -> tuple[Op, ...]:
    """Forward kernels of one dense layer's MLP block on one TP rank (``layer_forward_ops``'s ``mlp``):
    post-attention norm, up projection (gate and up under SwiGLU), activation, down projection, dropout +
    residual. ``shape``: the rank's shape and kernel options (sim.model.layer_shape; ``flash_attention`` and
    ``causal`` do not apply)."""
    spec, tp, elem_bytes = shape.spec, shape.tp, shape.elem_bytes
    tokens = shape.tokens
    h = spec.hidden_size
    ffn_local = spec.ffn / tp
    hidden_elems = shape.replicated_tokens * h
    up_width = (2 if spec.gated_mlp else 1) * ffn_local
    mlp = (
        shape.norm("post_attention_norm", hidden_elems, elem_bytes, reads=1, writes=1),
        linear("mlp_up", tokens, up_width, h, elem_bytes),
        mlp_activation(spec, "mlp_activation", tokens * ffn_local, elem_bytes, shape.fused_kernels),
        linear("mlp_down", tokens, h, ffn_local, elem_bytes),
        elementwise("mlp_dropout_residual", hidden_elems, elem_bytes, reads=2, writes=1,
                    masks=1 if shape.fused_kernels else 0),
    )
    return with_fp8_casts(mlp, tp, shape.sequence_parallel, shape.fp8_casts)
