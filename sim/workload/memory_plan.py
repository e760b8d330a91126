"""Per-rank memory of a scenario without simulating it (what ``sim check`` prints).

In: a ``Scenario``. Out: for each pipeline stage, the bytes of weights, gradients and optimizer states (ZeRO
sharding applied), activations (the schedule's in-flight bound x the Korthikanti bytes of a layer x layers
per chunk), the weights ZeRO-3/FSDP gathers at once (two units: the forward gathers one ahead; all of them for
SHARD_GRAD_OP) and the gradients not yet reduce-scattered (one unit or one bucket), the total and whether it
fits. ``sim run`` measures the same quantities from the trace; this is the upper bound a user checks first.
"""

from __future__ import annotations

from sim.spec.scenario import Scenario
from sim.hardware import bytes_per_element
from sim.model.memory import (activation_bytes_per_layer, comm_buffer_bytes, model_state_bytes, placed, rank_params,
                        with_allocator)
from sim.model.transformer import embedding_params, head_params, layer_params
from sim.parallel.schedules import SCHEDULES

PARTS = ("weights", "gradients", "optimizer", "activations", "gathered_weights", "unreduced_gradients", "comm_buffers",
         "allocator_overhead", "reserved")


def stage_params(scenario: Scenario, stage: int) -> float:
    """Parameters held by one TP rank of ``stage``: its own layer count (uneven first/last stages included)."""
    p = scenario.parallel
    return rank_params(scenario.model, stage, p.pp, p.tp, scenario.stage_layers(stage))


def states_and_buffers(scenario: Scenario, stage: int) -> tuple[dict[str, float], float]:
    """The resident model states (after ZeRO sharding and CPU offload) and communication buffers of a rank of
    ``stage``, and the bytes it keeps in host memory. Shared with the trace's memory timeline (sim.output.trace)."""
    t, p = scenario.training, scenario.parallel
    params = stage_params(scenario, stage)
    states, host = placed(model_state_bytes(params, t.dtype, scenario.zero_stage_at_rest, scenario.zero_shards,
                                            scenario.grad_dtype), scenario.offload.optimizer, scenario.offload.params)
    grad_elem = bytes_per_element(scenario.grad_dtype)
    sharded = scenario.zero_stage >= 3 or scenario.fsdp is not None
    buffers = comm_buffer_bytes(scenario.zero_stage, scenario.dp, sharded, params * grad_elem, p.dp_bucket_size,
                                p.grad_bucket_view, main_grad_buffer=grad_elem > bytes_per_element(t.dtype))
    return {"weights": states.weights, "gradients": states.gradients, "optimizer": states.optimizer,
            "comm_buffers": buffers}, host


def stage_memory(scenario: Scenario, stage: int) -> dict[str, float]:
    t, p, model = scenario.training, scenario.parallel, scenario.model
    zero = scenario.zero_stage
    resident, host = states_and_buffers(scenario, stage)
    per_layer = activation_bytes_per_layer(model, t.micro_batch, scenario.seq_len, p.tp, p.sequence_parallel,
                                           t.recompute, t.flash_attention)
    chunks_in_flight = SCHEDULES[scenario.schedule].in_flight(p.pp, scenario.microbatches, p.vpp, stage)
    # Per chunk of this stage (all its chunks have one size): recomputed layers keep their input only (per_layer),
    # the others under recompute_num_layers keep everything.
    whole = activation_bytes_per_layer(model, t.micro_batch, scenario.seq_len, p.tp, p.sequence_parallel, "none",
                                       t.flash_attention)
    chunk = scenario.stage_layers(stage) // p.vpp
    recomputed = scenario.recomputed_layers(stage) // p.vpp if t.recompute == "full" else chunk
    activations = chunks_in_flight * (per_layer * recomputed + whole * (chunk - recomputed))
    if t.recompute == "full" and recomputed > 0:  # the layer being rebuilt in its backward
        activations += whole
    elem = bytes_per_element(t.dtype)
    unit_layers = scenario.fsdp.unit_layers if scenario.fsdp is not None else 1
    biggest_extra = max(embedding_params(model), head_params(model)) / p.tp
    unit = (unit_layers * layer_params(model).per_tp_rank(p.tp) + biggest_extra) * elem
    gathered = unreduced = 0.0
    if scenario.dp > 1 and zero >= 3:
        gathered = 2 * unit  # the forward gathers one unit ahead (FSDP's rate limiter: two at most)
        unreduced = unit
    elif scenario.dp > 1 and zero == 2:
        if scenario.fsdp is not None:  # SHARD_GRAD_OP: the whole model stays gathered through the backward
            gathered = stage_params(scenario, stage) * elem
            unreduced = unit
        else:
            unreduced = min(p.dp_bucket_size + unit, stage_params(scenario, stage) * elem)
    parts = resident | {"activations": float(activations), "gathered_weights": gathered,
                        "unreduced_gradients": unreduced}
    memory = scenario.memory
    return with_allocator(parts, memory.reserved, memory.allocator_overhead) | {"host": host}


def memory_plan(scenario: Scenario) -> list[dict[str, float]]:
    """One row per pipeline stage, with the representative rank and whether it fits in HBM."""
    capacity = scenario.cluster.gpu.hbm_capacity
    rows = []
    for stage in range(scenario.parallel.pp):
        parts = stage_memory(scenario, stage)
        rows.append({"stage": stage, "rank": scenario.grid.stage_representative(stage), **parts,
                     "fits": parts["total"] <= capacity})
    return rows
