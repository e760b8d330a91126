"""The kernels of one dense layer's MLP block on one TP rank, and the MLP activation kernel a MoE layer's
experts share.

In: a ``ModelSpec`` (sim.model.transformer), the micro-batch, sequence length, TP split, dtype size and the
kernel options (fused or eager kernels, FP8's casts). Out: ``Op`` tuples in forward order: post-attention
norm, up projection (gate and up when gated), activation (bias-GeLU, SwiGLU, GeGLU or squared ReLU), down
projection, dropout + residual.
"""

from __future__ import annotations

from sim.model.fp8_casts import Fp8Casts, with_fp8_casts
from sim.model.ops import EAGER_SWIGLU_KERNELS, Op, eager_norm, elementwise, linear
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


def dense_mlp_forward_ops(
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
) -> tuple[Op, ...]:
    """Forward kernels of one dense layer's MLP block on one TP rank (``layer_forward_ops``'s ``mlp``):
    post-attention norm, up projection (gate and up under SwiGLU), activation, down projection, dropout +
    residual. Arguments as ``layer_forward_ops`` (``flash_attention`` and ``causal`` do not apply)."""
    tokens = micro_batch * seq_len
    h = spec.hidden_size
    ffn_local = spec.ffn / tp
    replicated_tokens = tokens / tp if sequence_parallel else tokens
    hidden_elems = replicated_tokens * h
    fused_norm = fused_kernels if fused_norm_rope is None else fused_norm_rope
    norm = eager_norm if not fused_norm and spec.norm == "rmsnorm" else elementwise
    up_width = (2 if spec.gated_mlp else 1) * ffn_local
    mlp = (
        norm("post_attention_norm", hidden_elems, elem_bytes, reads=1, writes=1),
        linear("mlp_up", tokens, up_width, h, elem_bytes),
        mlp_activation(spec, "mlp_activation", tokens * ffn_local, elem_bytes, fused_kernels),
        linear("mlp_down", tokens, h, ffn_local, elem_bytes),
        elementwise("mlp_dropout_residual", hidden_elems, elem_bytes, reads=2, writes=1,
                    masks=1 if fused_kernels else 0),
    )
    return with_fp8_casts(mlp, tp, sequence_parallel, fp8_casts)
