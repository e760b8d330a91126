"""The kernels of one MoE layer's MLP on one rank: router, shared expert, grouped expert GEMMs, combine.

In: a ``LayerShape`` (sim.model.layer_shape: the ``ModelSpec``, micro-batch, sequence length, TP split, dtype
size and FP8's casts), the expert-TP split, the rank's local experts and the token-expert pairs they compute
(the Plan's). Out: ``Op`` tuples in four blocks, between which the Plan puts the token dispatch and combine.
"""

from __future__ import annotations

from sim.model.fp8_casts import with_fp8_casts
from sim.model.layer_shape import LayerShape
from sim.model.mlp_ops import mlp_activation
from sim.model.ops import Op, elementwise, gemm, grouped_linear, linear


def moe_forward_ops(shape: LayerShape, etp: int, local_experts: int,
                    routed_tokens: float) -> dict[str, tuple[Op, ...]]:
    """Forward kernels of one MoE layer's MLP on one rank, in four blocks, between which the Plan puts the
    token dispatch and combine (Megatron-Core moe_layer.py MoELayer.forward, token_dispatcher.py):

    - ``moe_router``: post-attention norm; the router GEMM (rank's tokens x E x h: b*s/tp under sequence
      parallelism, all b*s without; replicated weights, not a Transformer Engine module: router.py's
      torch linear, so no FP8); top-k over the scores; the permute (a copy of the rank's tokens x topk x h into
      expert order, moe_utils.permute).
    - ``moe_shared``: the shared expert, a dense MLP of moe_shared_expert_intermediate_size sharded by tp over
      all b*s tokens (empty without one).
    - ``moe_experts``: grouped GEMMs (TEGroupedLinear), one Op per projection with batch = ``local_experts``,
      m = ``routed_tokens`` / ``local_experts`` (the mean tokens per local expert), n = the expert's FFN width
      (x2 for SwiGLU's gate and up) / ``etp``, k = hidden; the activation; the down projection.
    - ``moe_combine``: the unpermute, the top-k weighted sum of each token's expert outputs
      (moe_utils.unpermute: reads tokens x topk x h, writes tokens x h), and the residual add.

    ``routed_tokens``: token-expert pairs this rank's local experts compute for one micro-batch (the Plan
    decides it, imbalance included; uniform routing over ep ranks: b*s x topk / (tp when SP) per rank, since
    each of the ep x etp ranks' experts sees its share). Gives FLOPs of the router, the routed experts and the
    shared expert (``sim.model.flops.moe_mlp_forward_flops`` summed over the ranks).

    Of ``shape`` (sim.model.layer_shape) the model, micro-batch, sequence length, tp, sequence parallelism,
    dtype size and FP8's casts apply; the norm, activations and combine are priced as the fused kernels
    (Megatron-Core's), whatever ``fused_kernels`` and ``fused_norm_rope`` say."""
    spec, tp, elem_bytes, fp8_casts = shape.spec, shape.tp, shape.elem_bytes, shape.fp8_casts
    tokens, replicated_tokens = shape.tokens, shape.replicated_tokens
    h, experts, topk = spec.hidden_size, spec.num_moe_experts or 0, spec.moe_router_topk
    hidden_elems = replicated_tokens * h
    router = (
        elementwise("post_attention_norm", hidden_elems, elem_bytes, reads=1, writes=1),
        gemm("router", replicated_tokens, experts, h, elem_bytes),
        # Softmax (or sigmoid) over the E scores and top-k selection: reads the logits, writes the scores and
        # the top-k probabilities and indices.
        elementwise("router_topk", replicated_tokens * experts, elem_bytes, reads=1, writes=1),
        elementwise("moe_permute", replicated_tokens * topk * h, elem_bytes, reads=1, writes=1),
    )
    shared_width = spec.moe_shared_expert_intermediate_size or 0
    shared: tuple[Op, ...] = ()
    if shared_width:
        shared_local = shared_width / tp
        shared = (
            linear("shared_expert_up", tokens, (2 if spec.gated_mlp else 1) * shared_local, h, elem_bytes),
            mlp_activation(spec, "shared_expert_activation", tokens * shared_local, elem_bytes, True),
            linear("shared_expert_down", tokens, h, shared_local, elem_bytes),
        )
    ffn_local = spec.moe_ffn / etp
    per_expert = routed_tokens / local_experts
    up_width = (2 if spec.gated_mlp else 1) * ffn_local
    grouped = (
        grouped_linear("experts_fc1", local_experts, per_expert, up_width, h, elem_bytes),
        mlp_activation(spec, "experts_activation", routed_tokens * ffn_local, elem_bytes, True),
        grouped_linear("experts_fc2", local_experts, per_expert, h, ffn_local, elem_bytes),
    )
    combine = (
        elementwise("moe_unpermute", hidden_elems, elem_bytes, reads=topk, writes=1),
        elementwise("mlp_dropout_residual", hidden_elems, elem_bytes, reads=2, writes=1, masks=1),
    )
    return {
        "moe_router": router,
        "moe_shared": with_fp8_casts(shared, tp, shape.sequence_parallel, fp8_casts),
        "moe_experts": with_fp8_casts(grouped, etp, False, fp8_casts),
        "moe_combine": combine,
    }
