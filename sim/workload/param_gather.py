"""ZeRO-1/2's all-gather of the updated weights: once after the step, or per bucket under the next forward.

In: a ``Plan`` (ZeRO stage, data parallelism, ``parallel.overlap_param_gather``, weight and gradient bytes per
parameter, a MoE model's expert-data-parallel group) and a stage. Out: whether the gather overlaps the next forward
(``overlaps_param_gather``), its buckets in the order the forward reads them (``GatherBucket``,
``param_gather_buckets``, ``expert_param_gather_buckets``: the gradient buckets of sim.workload.grad_buckets,
reversed), or the bytes gathered after the step (``final_weight_gather_bytes``, ``expert_weight_gather_bytes``).
docs/mechanisms/distributed_optimizer.md. The data-parallel emitter and the estimate read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.plan import Plan
from sim.workload.grad_buckets import expert_gradient_bytes, expert_reduces, gradient_bytes, group_buckets


def overlaps_param_gather(plan: Plan) -> bool:
    """Whether ZeRO-1/2's weight all-gather runs per bucket under the next step's forward
    (``parallel.overlap_param_gather``: Megatron-LM --overlap-param-gather, NeMo/Apex overlap_param_sync)."""
    return (plan.scenario.parallel.overlap_param_gather and plan.data_parallel and plan.zero_stage in (1, 2)
            and not plan.gathers_units)


@dataclass(frozen=True)
class GatherBucket:
    """One bucket of the distributed optimizer's weight all-gather: its layers in forward order (-1: the input
    embedding; the head's weights go with the last layer), the local model chunk holding them, and its bytes."""

    layers: tuple[int, ...]
    chunk: int
    nbytes: float


def param_gather_buckets(plan: Plan, stage: int) -> list[GatherBucket]:
    """The weight all-gathers of ``stage`` in the order the forward needs them, under ``overlaps_param_gather``
    (else none). Megatron-LM's buckets are the gradient buckets (param_and_grad_buffer.py: one buffer per model
    chunk, parameters taken in reverse order, a bucket closed once it holds bucket_size; Apex
    DistributedFusedAdam the same with bucket_cap_mb), so they are filled in backward order per chunk and
    gathered in reverse (distrib_optimizer.py _get_model_param_buffer_dp_views: "all-gathers to run first for
    the start of the model"): the first bucket the forward reads holds the remainder. Bytes are the updated
    compute-dtype weights of the bucket's parameters, summing to the stage's ``final_weight_gather_bytes``."""
    if not overlaps_param_gather(plan):
        return []
    sizes = gradient_bytes(plan, stage)
    per_grad_byte = plan.weight_bytes_per_param / plan.grad_bytes_per_param
    out = []
    for local, chunk in enumerate(plan.stage_chunks[stage]):
        layers = plan.chunk_layers(chunk)
        ready = [(layer, sizes[layer]) for layer in reversed(layers)]
        if -1 in sizes and local == 0:  # the embedding with model chunk 0 (chunk_gradient_bytes)
            ready.append((-1, sizes[-1]))
        out += [GatherBucket(tuple(reversed(members)), local, nbytes * per_grad_byte)
                for members, nbytes in reversed(group_buckets(plan, ready))]
    return out


def final_weight_gather_bytes(plan: Plan, stage: int) -> float:
    """ZeRO-1/2 (Megatron's distributed optimizer, DeepSpeed): after the sharded step every rank all-gathers the
    updated compute-dtype weights of its stage over the DP group; 0 where nothing is gathered, FSDP's
    SHARD_GRAD_OP included (its weights stay sharded at rest; the next forward gathers them unit by unit), and
    under ``overlaps_param_gather`` (the gather moves to the next forward, bucket by bucket:
    ``param_gather_buckets``)."""
    if plan.data_parallel and plan.zero_stage in (1, 2) and not plan.gathers_units and not overlaps_param_gather(plan):
        return plan.stage_trainable_params(stage) * plan.weight_bytes_per_param
    return 0.0


def expert_weight_gather_bytes(plan: Plan, stage: int) -> float:
    """The distributed optimizer's all-gather of the updated expert weights over the expert-data-parallel group
    after the step (0 without ZeRO-1, a dense model or edp = 1, and under ``overlaps_param_gather``: the gather
    moves to the next forward, bucket by bucket: ``expert_param_gather_buckets``)."""
    if expert_reduces(plan) and plan.zero_stage == 1 and not overlaps_param_gather(plan):
        return plan.stage_expert_params(stage) * plan.weight_bytes_per_param
    return 0.0


def expert_param_gather_buckets(plan: Plan, stage: int) -> list[GatherBucket]:
    """The expert weights' all-gathers over the expert-data-parallel group under ``overlaps_param_gather``, in
    the order the forward needs them (else none). Megatron-Core's DDP chains the expert buffers' bucket groups for
    the overlapped gather exactly as the dense ones (distributed_data_parallel.py: ``for all_bgs in
    [self.bucket_groups, self.expert_parallel_bucket_groups]`` sets ``next_param_gather_bucket_group``;
    ``param_to_bucket_group`` maps expert parameters too, so the forward pre-hook waits for their bucket, and
    ``start_param_sync`` dispatches both lists): per model chunk, expert gradients bucketed in backward order
    (``expert_gradient_bytes``, ``group_buckets``), gathered in reverse. Bytes are the updated compute-dtype
    expert weights, summing to what ``expert_weight_gather_bytes`` gathers after the step without the overlap."""
    if not (overlaps_param_gather(plan) and expert_reduces(plan) and plan.zero_stage == 1):
        return []
    sizes = expert_gradient_bytes(plan, stage)
    per_grad_byte = plan.weight_bytes_per_param / plan.grad_bytes_per_param
    out = []
    for local, chunk in enumerate(plan.stage_chunks[stage]):
        ready = [(layer, sizes[layer]) for layer in reversed(plan.chunk_layers(chunk)) if layer in sizes]
        out += [GatherBucket(tuple(reversed(members)), local, nbytes * per_grad_byte)
                for members, nbytes in reversed(group_buckets(plan, ready))]
    return out
