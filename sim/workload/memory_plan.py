"""Per-rank memory of a plan without simulating it (what ``sim check`` prints): the bound.

In: a ``Plan``. Out: for each pipeline stage, the bytes of weights, gradients and optimizer states (ZeRO
sharding applied), activations (the schedule's in-flight bound x the bytes each layer of a chunk stashes), the
weights ZeRO-3/FSDP gathers at once (two units: the forward gathers one ahead; all of them for SHARD_GRAD_OP)
and the gradients not yet reduce-scattered (one unit or one bucket), the total and whether it fits. ``sim run``
measures the same quantities from the trace (sim.output.trace), with the resident states and buffers from
``states_and_buffers`` here and the per-layer activation bytes from the plan; this is the upper bound a user
checks first.
"""

from __future__ import annotations

from sim.model.memory import comm_buffer_bytes, model_state_bytes, placed, with_allocator
from sim.model.transformer import embedding_params, head_params, layer_params
from sim.plan import Plan

PARTS = ("weights", "gradients", "optimizer", "activations", "gathered_weights", "unreduced_gradients", "comm_buffers",
         "allocator_overhead", "reserved")


def states_and_buffers(plan: Plan, stage: int) -> tuple[dict[str, float], float]:
    """The resident model states (after ZeRO sharding and CPU offload) and communication buffers of a rank of
    ``stage``, and the bytes it keeps in host memory. Shared with the trace's memory timeline (sim.output.trace)."""
    offload, parallel = plan.scenario.offload, plan.scenario.parallel
    params = plan.stage_params(stage)
    states, host = placed(model_state_bytes(params, plan.dtype, plan.zero_stage_at_rest, plan.zero_shards,
                                            plan.grad_dtype), offload.optimizer, offload.params)
    buffers = comm_buffer_bytes(plan.zero_stage, plan.dp, plan.flat_params, params * plan.grad_bytes_per_param,
                                parallel.dp_bucket_size, parallel.grad_bucket_view,
                                main_grad_buffer=plan.main_grad_buffer)
    return {"weights": states.weights, "gradients": states.gradients, "optimizer": states.optimizer,
            "comm_buffers": buffers}, host


def stage_memory(plan: Plan, stage: int) -> dict[str, float]:
    model, elem = plan.model, plan.elem_bytes
    resident, host = states_and_buffers(plan, stage)
    chunks_in_flight = plan.schedule.in_flight(plan.pp, plan.microbatches, plan.vpp, stage)
    # A stage's chunks have one size (uneven stages have one chunk), so its first chunk's stash stands for each.
    first_chunk = plan.chunk_layers(plan.stage_chunks[stage][0])
    activations = chunks_in_flight * sum(plan.stash_bytes(layer) for layer in first_chunk)
    if plan.recomputed_layers(stage) > 0:
        activations += plan.rebuild_bytes
    biggest_extra = max(embedding_params(model), head_params(model)) / plan.tp
    unit = (plan.unit_layers * layer_params(model).per_tp_rank(plan.tp) + biggest_extra) * elem
    gathered = unreduced = 0.0
    if plan.data_parallel and plan.zero_stage >= 3:
        gathered = 2 * unit  # the forward gathers one unit ahead (FSDP's rate limiter: two at most)
        unreduced = unit
    elif plan.data_parallel and plan.zero_stage == 2:
        if plan.gathers_units:  # SHARD_GRAD_OP: the whole model stays gathered through the backward
            gathered = plan.stage_params(stage) * elem
            unreduced = unit
        else:
            unreduced = min(plan.scenario.parallel.dp_bucket_size + unit, plan.stage_params(stage) * elem)
    parts = resident | {"activations": float(activations), "gathered_weights": gathered,
                        "unreduced_gradients": unreduced}
    memory = plan.scenario.memory
    return with_allocator(parts, memory.reserved, memory.allocator_overhead) | {"host": host}


def memory_plan(plan: Plan) -> list[dict[str, float]]:
    """One row per pipeline stage, with the representative rank and whether it fits in HBM."""
    capacity = plan.scenario.cluster.gpu.hbm_capacity
    rows = []
    for stage in range(plan.pp):
        parts = stage_memory(plan, stage)
        rows.append({"stage": stage, "rank": plan.grid.stage_representative(stage), **parts,
                     "fits": parts["total"] <= capacity})
    return rows
