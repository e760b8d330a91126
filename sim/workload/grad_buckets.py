"""Gradient buckets: the bytes that become final together on a stage, and how DDP / ZeRO-1/2 bucket them.

In: a ``Plan`` (the stage's layers, trained parameters, where the embedding and head sit, a tied-embedding copy,
the gradient dtype, ``parallel.dp_bucket_size``) and a stage or a list of (layer, bytes). Out: each layer's
gradient bytes with the head's (and a tied copy's) joining the stage's last layer and the embedding's under key -1
(``gradient_bytes``), a MoE layer's routed-expert gradient bytes reduced over the expert-data-parallel group
(``expert_gradient_bytes``, ``expert_reduces``), the buckets they fill (``group_buckets``, ``fill_buckets``,
``bucket_full``) and, without ``parallel.overlap_grad_reduce``, one bucket per model chunk
(``chunk_gradient_bytes``). The data-parallel emitter and the estimate read them.
"""

from __future__ import annotations

from sim.model.params import embedding_params, head_params
from sim.plan import Plan


def head_gradient_params(plan: Plan, stage: int) -> float:
    """Parameters whose gradients become final with the head's on ``stage`` (0 elsewhere): the head and, with
    tied embeddings on another stage, its copy of the word embeddings (both on ``plan.head_stage``)."""
    if not plan.holds_head(stage):
        return 0.0
    tied = plan.model.vocab_size * plan.model.hidden_size if plan.tied_copy(stage) else 0
    return (head_params(plan.model) + tied) / plan.tp * plan.head_trains


def embedding_gradient_params(plan: Plan, stage: int) -> float:
    """Parameters of the input embedding on ``stage`` (0 elsewhere), per TP rank."""
    return embedding_params(plan.model) / plan.tp * plan.embedding_trains if plan.holds_embedding(stage) else 0.0


def stage_layer_ids(plan: Plan, stage: int) -> list[int]:
    """The transformer layers ``stage`` holds, chunk by chunk in model order."""
    return plan.stage_layer_ids(stage)


def gradient_bytes(plan: Plan, stage: int) -> dict[int, float]:
    """Gradient bytes that become final together on a rank of ``stage``, keyed by layer: each layer's, with the
    head's (and a tied-embedding copy's) joining the stage's last layer (the head's backward runs just before
    it), and the input embedding's under key -1 (its backward runs after layer 0's)."""
    layers = stage_layer_ids(plan, stage)
    if plan.is_moe:  # dense parameters only: a MoE layer's routed experts reduce over edp (expert_gradient_bytes)
        sizes = {layer: plan.layer_params(layer) * plan.grad_bytes_per_param for layer in layers}
    else:  # the parameters that train (all of them in full training; sim.model.peft)
        sizes = {layer: plan.layer_grad_params(layer) * plan.grad_bytes_per_param for layer in layers}
    head = head_gradient_params(plan, stage)
    if head:
        sizes[max(layers)] += head * plan.grad_bytes_per_param
    embedding = embedding_gradient_params(plan, stage)
    if embedding:
        sizes[-1] = embedding * plan.grad_bytes_per_param
    return sizes


def expert_gradient_bytes(plan: Plan, stage: int) -> dict[int, float]:
    """Routed-expert gradient bytes of each MoE layer on a rank of ``stage``, keyed by layer (empty for a dense
    model). Megatron-Core keeps them in their own buffer, bucketed and reduced over the expert-data-parallel
    group (distributed_data_parallel.py: expert_parallel_buffers, with the expert DP group)."""
    if not plan.is_moe:
        return {}
    per_layer = plan.expert_params_per_layer * plan.grad_bytes_per_param
    return {layer: per_layer for layer in stage_layer_ids(plan, stage) if plan.moe_layers[layer]}


def expert_reduces(plan: Plan) -> bool:
    """Whether expert gradients are reduced at all: there is more than one expert-data-parallel rank."""
    return plan.is_moe and plan.edp > 1


def bucket_full(plan: Plan, pending_bytes: float) -> bool:
    """Whether a gradient bucket holding ``pending_bytes`` is reduced now: it reached ``parallel.dp_bucket_size``
    (PyTorch DDP's bucket_cap_mb, DeepSpeed's reduce_bucket_size). The last gradients close a bucket anyway."""
    return pending_bytes >= plan.scenario.parallel.dp_bucket_size


def group_buckets(plan: Plan, ready: list[tuple[int, float]]) -> list[tuple[list[int], float]]:
    """(layer, bytes) in the order gradients become final, grouped until a bucket is full (``bucket_full``) or
    the gradients run out. Returns each bucket's layers, in that order, and its bytes."""
    buckets: list[tuple[list[int], float]] = []
    layers: list[int] = []
    pending = 0.0
    for index, (layer, nbytes) in enumerate(ready):
        layers.append(layer)
        pending += nbytes
        if bucket_full(plan, pending) or index == len(ready) - 1:
            buckets.append((layers, pending))
            layers, pending = [], 0.0
    return buckets


def fill_buckets(plan: Plan, ready: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """DDP / ZeRO-1 gradient buckets (``group_buckets``). Returns (the layer that closes each bucket, its bytes)."""
    return [(layers[-1], nbytes) for layers, nbytes in group_buckets(plan, ready)]


def chunk_gradient_bytes(plan: Plan, stage: int) -> list[tuple[list[int], float]]:
    """Megatron-LM without --overlap-grad-reduce (``parallel.overlap_grad_reduce: false``): DDP's bucket_size is
    None, so each model chunk's gradient buffer is one bucket, reduced after the whole backward (core_r0.8
    distributed_data_parallel.py). Returns, per local chunk in order, its layers (-1: the embedding) and bytes."""
    sizes = gradient_bytes(plan, stage)
    out = []
    for local, chunk in enumerate(plan.stage_chunks[stage]):
        # the embedding with the stage's first chunk (model chunk 0, which holds no layer where the embedding takes
        # a whole pipeline-split slot of its own)
        layers = list(plan.chunk_layers(chunk)) + ([-1] if -1 in sizes and local == 0 else [])
        out.append((layers, sum(sizes[layer] for layer in layers)))
    return out
