"""The memory footprint of a step: the bound before simulating (what ``sim check`` prints) and a trace's timeline.

Both read the same rules: the resident states and buffers of a stage (``states_and_buffers``), the bytes each
layer stashes and the layer being rebuilt or the loss head's logits (``Plan.stash_bytes``,
``Plan.transient_bytes``), activation offload's buffers and host copies, FSDP units (``Plan.unit_layers``) and
the allocator's overheads (``sim.model.memory.with_allocator``).

The bound (``stage_memory``, ``memory_plan``). In: a ``Plan``. Out: for each pipeline stage, the bytes of weights,
gradients and optimizer states (ZeRO sharding applied), activations (the schedule's in-flight bound x the bytes
each layer of a chunk stashes), the weights ZeRO-3/FSDP gathers at once (two units: the forward gathers one ahead;
FSDP's root unit, the embedding, final norm and LM head, beside them for the whole pass; all of them for
SHARD_GRAD_OP) and the gradients not yet reduce-scattered (two units or a bucket), the total and
whether it fits. ``sim run`` measures the same quantities from the trace; this is the upper bound a user checks
first.

The timeline (``memory_timeline``). In: a trace DataFrame and its ``Plan``. Out: per simulated rank, the same
parts at the moment their sum peaks, each allocation living from the task that makes it to the task that frees
it; ``sim.output.summary`` reports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sim.model.memory import (
    ModelStates,
    allocator_total,
    comm_buffer_bytes,
    model_state_bytes,
    peak_usage,
    placed,
    with_allocator,
)
from sim.model.params import embedding_params, head_params, layer_params
from sim.plan import Plan
from sim.workload.ir import COMPUTE_KINDS, KINDS, Kind

if TYPE_CHECKING:  # the timeline reads a trace's columns; neither it nor the bound (``sim check``) imports pandas
    import pandas as pd

PARTS = ("weights", "gradients", "optimizer", "activations", "gathered_weights", "unreduced_gradients", "comm_buffers",
         "allocator_overhead", "reserved")


def states_and_buffers(plan: Plan, stage: int) -> tuple[dict[str, float], float]:
    """The resident model states (after ZeRO sharding and CPU offload) and communication buffers of a rank of
    ``stage``, and the bytes it keeps in host memory. Shared by the bound and the timeline below."""
    offload, parallel = plan.scenario.offload, plan.scenario.parallel
    params = plan.stage_trainable_params(stage)
    t = plan.scenario.training  # the optimizer's states per trained parameter: master copy and moments
    states = model_state_bytes(params, plan.dtype, plan.zero_stage_at_rest, plan.zero_shards,
                               plan.grad_storage_dtype, t.master_weights, t.optimizer_dtype)
    if plan.peft.active:  # frozen weights: in their storage dtype, sharded with the rest, no gradient or state
        shards = plan.zero_shards if plan.zero_stage_at_rest >= 3 else 1
        states = ModelStates(states.weights + plan.stage_frozen_bytes(stage) / shards, states.gradients,
                             states.optimizer)
    states, host = placed(states, offload.optimizer, offload.params)
    buffers = comm_buffer_bytes(plan.zero_stage, plan.dp * plan.cp, plan.flat_params,
                                params * plan.grad_bytes_per_param, parallel.dp_bucket_size, parallel.grad_bucket_view,
                                main_grad_buffer=plan.main_grad_buffer)
    if plan.is_moe:  # routed experts: sharded over ep x etp, ZeRO over the expert-data-parallel group
        experts, expert_host = placed(model_state_bytes(plan.stage_expert_params(stage), plan.dtype,
                                                        plan.zero_stage_at_rest, plan.edp, plan.grad_storage_dtype,
                                                        t.master_weights, t.optimizer_dtype),
                                      offload.optimizer, offload.params)
        states = ModelStates(states.weights + experts.weights, states.gradients + experts.gradients,
                             states.optimizer + experts.optimizer)
        host += expert_host
    return {"weights": states.weights, "gradients": states.gradients, "optimizer": states.optimizer,
            "comm_buffers": buffers}, host


def offloaded_host_bytes(plan: Plan, stage: int) -> float:
    """Host memory activation offload takes on a rank of ``stage``: the offloaded layers' stash of every chunk the
    schedule keeps in flight (the same count the bound's GPU activations use)."""
    first_chunk = plan.chunk_layers(plan.stage_chunks[stage][0])
    offloaded = sum(plan.stash_bytes(layer) for layer in first_chunk if plan.offloads(layer))
    return plan.schedule.in_flight(plan.pp, plan.microbatches, plan.vpp, stage) * offloaded if offloaded else 0.0


def offload_buffer_bytes(plan: Plan, stage: int) -> float:
    """GPU memory activation offload keeps for good: Transformer Engine's AsyncDoubleBufferGroupOffloadHandler
    copies each offloaded layer's saved tensors into one of two GPU buffers (``tensor_id_to_tensor_buf_double_bufs``,
    by layer parity, allocated once and reused) and copies that buffer to the host, so min(N, 2) layers' stash
    stays on the GPU (transformer_engine/pytorch/cpu_offload.py, TE 1.x)."""
    first_chunk = plan.chunk_layers(plan.stage_chunks[stage][0])
    offloaded = ([plan.stash_bytes(layer) for layer in first_chunk if plan.offloads(layer)]
                 if plan.scenario.training.cpu_offloading_num_layers else [])  # none offloads: no layer to ask
    return min(len(offloaded), 2) * max(offloaded) if offloaded else 0.0


def root_unit_bytes(plan: Plan) -> float:
    """Bytes per rank of the weights FSDP's root unit keeps unsharded from the forward's start to the backward's
    end: the parameters no per-layer ``fully_shard`` / auto-wrap unit owns (the input embedding, the final norm
    and the LM head, at the compute dtype: QLoRA leaves them in bf16). Both FSDPs skip the reshard after forward
    for the root: FSDP2 ``FSDPState._lazy_init`` ("For the root, do not reshard after forward since for
    training, the parameters would be freed and all-gathered immediately": ``post_forward_mesh_info = None``),
    FSDP1 ``_post_forward_reshard`` (``free_unsharded_flat_param = not state._is_root and ...``); its
    post-backward runs at the end of the backward (the root's inputs, token ids, need no gradient, so FSDP2's
    ``_root_post_backward_final_callback`` reshards it). torchtune's ``shard_model`` and TorchTitan wrap each
    layer and then the whole model, which is this root. 0 where no such unit exists: ZeRO-3 without an ``fsdp``
    section (DeepSpeed gathers and releases the embedding and the head module by module), SHARD_GRAD_OP (every
    unit stays gathered) and FSDP + PP (``Plan.pipelined_fsdp``: everything stays gathered)."""
    if plan.scenario.fsdp is None or plan.zero_stage < 3 or plan.pipelined_fsdp or not plan.data_parallel:
        return 0.0
    return (embedding_params(plan.model) + head_params(plan.model)) / plan.tp * plan.weight_bytes_per_param


def stage_memory(plan: Plan, stage: int) -> dict[str, float]:
    """The bound's parts of a rank of ``stage`` (``PARTS``), their total and its host bytes: the resident states
    and buffers, the activations (``stage_activations``) and ZeRO-3/FSDP's gathered weights and unreduced
    gradients (``sharded_buffers``), with the allocator's overheads."""
    resident, host = states_and_buffers(plan, stage)
    activations, offload_host = stage_activations(plan, stage)
    gathered, unreduced = sharded_buffers(plan, stage)
    return with_parts(plan, resident, activations, gathered, unreduced) | {"host": host + offload_host}


def with_parts(plan: Plan, resident: dict[str, float], activations: float, gathered: float,
               unreduced: float) -> dict[str, float]:
    """The bound's parts in ``PARTS`` order (the resident states and buffers of ``states_and_buffers``, then the
    activations, gathered weights and unreduced gradients) with the allocator's overheads and their total. The
    screen (sim.explore.estimate) adds up parts it keeps per layout shape through here too."""
    parts = resident | {"activations": float(activations), "gathered_weights": gathered,
                        "unreduced_gradients": unreduced}
    memory = plan.scenario.memory
    return with_allocator(parts, memory.reserved, memory.allocator_overhead)


def parts_total(plan: Plan, resident_sum: float, activations: float, gathered: float, unreduced: float) -> float:
    """``with_parts(plan, resident, activations, gathered, unreduced)["total"]`` where ``resident_sum`` is
    ``sum(resident.values())``: the same float (the parts are summed left to right in ``PARTS`` order, the resident
    ones first), without building the parts' dict; the screen (sim.explore.estimate) adds up a stage's bound per
    layout through here."""
    memory = plan.scenario.memory
    return allocator_total(resident_sum + float(activations) + gathered + unreduced, memory.reserved,
                           memory.allocator_overhead)


def largest_chunk_stash(plan: Plan, stage: int) -> float:
    """Bytes the largest of ``stage``'s model chunks stashes per micro-batch (``Plan.stash_bytes`` over its layers):
    it stands for each chunk in flight (a stage's chunks differ with uneven stages under interleaving, the
    embedding's or the loss's chunk one layer short, or dense and MoE layers mixed). It depends on where the
    chunks sit, not on the order the schedule runs them in."""
    return max(sum(plan.stash_bytes(layer) for layer in plan.chunk_layers(chunk)) for chunk in plan.stage_chunks[stage])


def stage_activations(plan: Plan, stage: int, stash: float | None = None) -> tuple[float, float]:
    """(GPU bytes of activations a rank of ``stage`` holds at its peak, host bytes activation offload takes): the
    schedule's chunks in flight x the largest chunk's stash (``largest_chunk_stash``; ``stash``: its value, where
    the caller keeps it), offload's buffers, and the transient rebuild or loss logits (``Plan.transient_bytes``)."""
    host = 0.0
    chunks_in_flight = plan.schedule.in_flight(plan.pp, plan.microbatches, plan.vpp, stage)
    first_chunk = plan.chunk_layers(plan.stage_chunks[stage][0])
    activations = chunks_in_flight * (largest_chunk_stash(plan, stage) if stash is None else stash)
    offloaded = ([plan.stash_bytes(layer) for layer in first_chunk if plan.offloads(layer)]
                 if plan.scenario.training.cpu_offloading_num_layers else [])  # none offloads: no layer to ask
    if offloaded:
        # Activation offload: the offloaded layers' stash is on the host between forward and backward; on the GPU,
        # Transformer Engine's ping-pong copy buffers (``offload_buffer_bytes``) and, in the backward, the layer
        # being copied back beside the kept layers whose backward has not yet freed them: it starts with the next
        # layer's backward (and, at equal times, beside the layer before that), which the kept stash covers when
        # a chunk keeps three layers or more.
        kept_layers = len(first_chunk) - len(offloaded)
        activations -= chunks_in_flight * sum(offloaded)
        activations += offload_buffer_bytes(plan, stage) + max(0, 3 - kept_layers) * max(offloaded)
        host += offloaded_host_bytes(plan, stage)
    activations += plan.transient_bytes(stage)
    return activations, host


def sharded_buffers(plan: Plan, stage: int) -> tuple[float, float]:
    """(gathered weights, unreduced gradients) a rank of ``stage`` holds at its peak under ZeRO-2/3 and FSDP."""
    model, elem = plan.model, plan.elem_bytes
    biggest_extra = max(embedding_params(model), head_params(model)) / plan.tp
    unit_params = plan.unit_layers * layer_params(model).per_tp_rank(plan.tp) + biggest_extra  # the largest unit
    unit, unit_grads = unit_params * elem, unit_params * plan.grad_bytes_per_param
    stage_weights, stage_grads = plan.stage_params(stage) * elem, plan.stage_params(stage) * plan.grad_bytes_per_param
    if plan.peft.active:  # gathered weights in their storage dtype, gradients of the trainable ones only
        layers = [layer for chunk in plan.stage_chunks[stage] for layer in plan.chunk_layers(chunk)]
        layer_units = plan.unit_layers * max(plan.layer_weight_bytes(layer) for layer in layers)
        unit = layer_units + biggest_extra * elem
        # With frozen weights the backward's first gather (of the last unit, with the head) starts while that
        # unit's forward still computes (it waits only for the unit two back, and no gradient reduce-scatter
        # holds the stream): that unit twice, beside the one before it (seen in the timeline of
        # scenarios/llama3-70b_h100-8_lora_fsdp.yaml).
        last_unit = layer_units + head_params(model) / plan.tp * elem
        extra_grads = max(embedding_params(model) * plan.embedding_trains, head_params(model) * plan.head_trains)
        unit_grads = (plan.unit_layers * max(plan.layer_grad_params(layer) for layer in layers)
                      + extra_grads / plan.tp) * plan.grad_bytes_per_param
        stage_weights = plan.stage_trainable_params(stage) * elem + plan.stage_frozen_bytes(stage)
        stage_grads = plan.stage_trainable_params(stage) * plan.grad_bytes_per_param
    gathered = unreduced = 0.0
    if plan.data_parallel and plan.gathers_units:
        # ZeRO-3 / FSDP: the forward gathers one unit ahead (FSDP's rate limiter: two at most); SHARD_GRAD_OP
        # keeps the whole model gathered through the backward. Gradients: the unit whose backward runs and the
        # one before, whose reduce-scatter may still be running on the group's one stream (the timeline holds
        # two there, in the gradient dtype).
        gathered = 2 * unit if plan.zero_stage >= 3 else stage_weights
        if plan.peft.active and plan.zero_stage >= 3:
            gathered = max(gathered, 2 * last_unit + layer_units)
        if root := root_unit_bytes(plan):
            # FSDP: the root unit (embedding, final norm, LM head) stays gathered from the forward's start to the
            # backward's end, beside two layer units: the one computing and the one prefetched (FSDP2: implicit
            # forward prefetch limited by its all-gather state, explicit backward prefetch of one; FSDP1's rate
            # limiter). A unit's backward gather cannot overlap its own forward copy: FSDP2's all-gather stream
            # waits for the reshard event (the timeline's rule too).
            layers = [layer for chunk in plan.stage_chunks[stage] for layer in plan.chunk_layers(chunk)]
            gathered = root + 2 * plan.unit_layers * max(plan.layer_weight_bytes(layer) for layer in layers)
        unreduced = 2 * unit_grads
        if plan.pipelined_fsdp:
            # FSDP + PP: the stage's units stay gathered from micro-batch 0's forward to the last backward, and
            # their gradients accumulate unsharded until the step's reduce-scatters (Plan.pipelined_fsdp).
            gathered, unreduced = stage_weights, stage_grads
    elif plan.data_parallel and plan.zero_stage == 2:  # DeepSpeed ZeRO-2: a bucket filling, one layer beyond
        unreduced = min(plan.scenario.parallel.dp_bucket_size + unit_grads, stage_grads)
    return gathered, unreduced


def memory_plan(plan: Plan) -> list[dict[str, float]]:
    """One row per pipeline stage, with the representative rank and whether it fits in HBM."""
    capacity = plan.scenario.cluster.gpu.hbm_capacity
    rows = []
    for stage in range(plan.pp):
        parts = stage_memory(plan, stage)
        rows.append({"stage": stage, "rank": plan.grid.stage_representative(stage), **parts,
                     "fits": parts["total"] <= capacity})
    return rows


# ------------------------------------------------------------------------------------------------ timeline
# The trace rows the timeline reads: the compute passes, activation offload's copies and the data-parallel
# collectives (ZeRO-3/FSDP weight gathers, gradient reduce-scatters). ``memory_timeline`` keeps these alone, so a
# trace of only these rows gives the same timeline (a sweep's confirmation builds no others: sim.explore.confirm).
TIMELINE_KINDS: tuple[str, ...] = (*COMPUTE_KINDS, Kind.OFFLOAD, Kind.DP)
_CODE = {kind: code for code, kind in enumerate(KINDS)}
_FORWARD, _BACKWARD, _WEIGHT = _CODE[Kind.FORWARD], _CODE[Kind.BACKWARD], _CODE[Kind.WEIGHT]
_COMPUTE = [_CODE[kind] for kind in COMPUTE_KINDS]
_FWD, _BWD = 0, 1  # a unit span's phase: the forward's compute, or the backward's (recompute and W included)


@dataclass(frozen=True)
class TimelineRows:
    """The trace rows the timeline reads (``TIMELINE_KINDS``; others may be there and are ignored), as columns in
    trace order: rank, stage, kind (its index in ``sim.workload.ir.KINDS``), name, micro-batch, layer, start and
    end (s) and the trace's integer bytes. ``of_trace`` reads them from a trace DataFrame; a sweep's confirmation
    builds them from the task graph without one. Names and bytes are read on the offload and data-parallel rows
    only."""

    rank: np.ndarray
    stage: np.ndarray
    kind: np.ndarray
    name: np.ndarray
    microbatch: np.ndarray
    layer: np.ndarray
    start: np.ndarray
    end: np.ndarray
    nbytes: np.ndarray

    @classmethod
    def of_trace(cls, trace: pd.DataFrame) -> TimelineRows:
        rows = trace[trace["kind"].isin(TIMELINE_KINDS)]
        kind = np.fromiter(map(_CODE.__getitem__, rows["kind"].to_numpy()), np.int8, len(rows))
        return cls(rows["rank"].to_numpy(), rows["stage"].to_numpy(), kind, rows["name"].to_numpy(),
                   rows["microbatch"].to_numpy(), rows["layer"].to_numpy(), rows["start_s"].to_numpy(),
                   rows["end_s"].to_numpy(), rows["bytes"].to_numpy())


def _groups(keys: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The rows sorted by ``keys`` (the first the primary, as a pandas groupby sorts its keys; stable) and the
    positions in that order where each group starts."""
    order = np.lexsort(keys[::-1])
    if not len(order):
        return order, order
    new = np.zeros(len(order), dtype=bool)
    new[0] = True
    for key in keys:
        ordered = key[order]
        new[1:] |= ordered[1:] != ordered[:-1]
    return order, np.flatnonzero(new)


def _lookup(table: tuple[np.ndarray, ...], values: np.ndarray, query: tuple[np.ndarray, ...]) -> np.ndarray:
    """``values`` at the row of ``table`` whose key equals each ``query`` key, NaN where none (pandas' reindex on
    a unique index)."""
    found = np.full(len(query[0]), np.nan)
    if not len(values) or not len(found):
        return found
    table_key = np.zeros(len(values), dtype=np.int64)
    query_key = np.zeros(len(found), dtype=np.int64)
    for t, q in zip(table, query, strict=True):  # one integer per key: each part offset to >= 0, mixed radix
        low = min(int(t.min()), int(q.min()))
        span = max(int(t.max()), int(q.max())) - low + 1
        table_key = table_key * span + (t.astype(np.int64) - low)
        query_key = query_key * span + (q.astype(np.int64) - low)
    order = np.argsort(table_key, kind="stable")
    at = np.minimum(np.searchsorted(table_key[order], query_key), len(order) - 1)
    hit = table_key[order[at]] == query_key
    found[hit] = values[order[at[hit]]]
    return found


@dataclass(frozen=True)
class _UnitSpans:
    """First start and last end of each (rank, micro-batch, phase, FSDP unit)'s compute."""

    keys: tuple[np.ndarray, ...]
    first: np.ndarray
    last: np.ndarray

    @classmethod
    def of(cls, rows: TimelineRows, unit_layers: int) -> _UnitSpans:
        layered = np.flatnonzero((rows.layer >= 0) & np.isin(rows.kind, _COMPUTE))
        phase = np.where(rows.kind[layered] == _FORWARD, _FWD, _BWD)
        keys = (rows.rank[layered], rows.microbatch[layered], phase, rows.layer[layered] // unit_layers)
        order, starts = _groups(keys)
        if not len(starts):
            return cls(keys, np.empty(0), np.empty(0))
        return cls(tuple(key[order][starts] for key in keys), np.fmin.reduceat(rows.start[layered][order], starts),
                   np.fmax.reduceat(rows.end[layered][order], starts))

    def at(self, rank: int, mb: np.ndarray, phase: int | np.ndarray, unit: np.ndarray | int
           ) -> tuple[np.ndarray, np.ndarray]:
        """(first, last) of each queried span of ``rank``, NaN where it has no compute."""
        n = len(mb)
        low, high = np.searchsorted(self.keys[0], [rank, rank + 1])  # the spans are sorted by rank first
        table = tuple(key[low:high] for key in self.keys[1:])
        query = (np.asarray(mb), np.broadcast_to(phase, n), np.broadcast_to(unit, n))
        return _lookup(table, self.first[low:high], query), _lookup(table, self.last[low:high], query)


def memory_timeline(trace: pd.DataFrame | TimelineRows, plan: Plan) -> dict[int, dict[str, float]]:
    """The timeline side: per simulated rank of a trace, the resident states and buffers (as the bound's), plus
    the peak of activations, gathered weights (ZeRO-3/FSDP) and not-yet-reduced gradients (ZeRO-2/3) over the
    step, each allocated and freed when the trace's tasks say, with the plan's per-layer stash rule. Reads only
    the rows of ``TIMELINE_KINDS``, as numpy columns (``TimelineRows``): the maxima, minima and lookups pandas'
    groupby and reindex took, in the same order (its filters and MultiIndex lookups were three quarters of a
    175B confirmation's figures, 2026-11-26)."""
    rows = trace if isinstance(trace, TimelineRows) else TimelineRows.of_trace(trace)
    # Per layer, the bytes it stashes (the plan's partial-recompute rule), and the layer being rebuilt.
    stash_bytes = np.array([plan.stash_bytes(layer) for layer in range(plan.model.num_layers)])
    # A layer's activations are stashed at the end of its forward and freed by its last backward pass (the
    # weight-gradient pass W when the schedule splits the backward): the last end per (rank, pass, mb, layer).
    layered = np.flatnonzero((rows.layer >= 0) & np.isin(rows.kind, (_FORWARD, _BACKWARD, _WEIGHT)))
    keys = (rows.rank[layered], (rows.kind[layered] == _FORWARD).astype(np.int8), rows.microbatch[layered],
            rows.layer[layered])  # the pass: 0 backward (W included), 1 forward, in the names' order
    order, starts = _groups(keys)
    rank_of, forward_of, mb_of, layer_of = (key[order][starts] for key in keys)
    last_end = np.fmax.reduceat(rows.end[layered][order], starts) if len(starts) else np.empty(0)
    spans = _UnitSpans.of(rows, plan.unit_layers) if plan.zero_stage >= 2 else None
    group_of = rank_of.astype(np.int64) * 2 + forward_of  # ascending: the groups are sorted by rank, then pass
    ranks, first_row = np.unique(rows.rank, return_index=True)
    by_rank = np.argsort(rows.rank, kind="stable")
    result: dict[int, dict[str, float]] = {}
    for rank, stage, mine in zip(ranks.tolist(), rows.stage[first_row].tolist(),
                                 np.split(by_rank, np.flatnonzero(np.diff(rows.rank[by_rank])) + 1), strict=True):
        resident, host = states_and_buffers(plan, stage)
        # This rank's groups, backward then forward, each by (micro-batch, layer): the stash and its free.
        low, middle, high = np.searchsorted(group_of, [rank * 2, rank * 2 + 1, rank * 2 + 2])
        stashed = slice(middle, high)
        free = last_end[low:middle]
        sizes = stash_bytes[layer_of[stashed]]
        parts = {"activations": _offloaded(rows, mine, (mb_of[stashed], layer_of[stashed]), last_end[stashed], free,
                                           sizes)}
        if spans is not None:
            parts |= _gather_and_grad_buffers(rows, mine, rank, spans, plan)
        dynamic = peak_usage(parts)
        dynamic["activations"] += plan.transient_bytes(stage) + offload_buffer_bytes(plan, stage)
        entry = resident | {name: value for name, value in dynamic.items() if name != "total"}
        memory = plan.scenario.memory
        host += offloaded_host_bytes(plan, stage)
        result[rank] = with_allocator(entry, memory.reserved, memory.allocator_overhead) | {"host": host}
    return result


def _offloaded(rows: TimelineRows, mine: np.ndarray, at: tuple[np.ndarray, np.ndarray], stash: np.ndarray,
               free: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The activations' (alloc, free, bytes) with activation offload: an offloaded layer's stash is freed when
    its copy to the host ends and allocated again when its copy back starts, until its backward ends. ``at``:
    the stashes' (micro-batch, layer), in the order of ``stash``, ``free`` and ``sizes``."""
    names = rows.name[mine]
    offload = mine[names == "activation_offload"]
    if not len(offload):
        return stash, free, sizes
    reload = mine[names == "activation_reload"]
    gone = _lookup((rows.microbatch[offload], rows.layer[offload]), rows.end[offload], at)
    back = _lookup((rows.microbatch[reload], rows.layer[reload]), rows.start[reload], at)
    moved = ~np.isnan(gone) & ~np.isnan(back)
    starts = np.concatenate([stash, back[moved]])
    ends = np.concatenate([np.where(moved, gone, free), free[moved]])
    return starts, ends, np.concatenate([sizes, sizes[moved]])


def _gather_and_grad_buffers(rows: TimelineRows, mine: np.ndarray, rank: int, spans: _UnitSpans,
                             plan: Plan) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Gathered weights live from their all-gather's start until the unit's compute in that phase ends (until
    its backward for SHARD_GRAD_OP's forward gather); a unit's full gradients from the start of its backward
    until their reduce-scatter ends (DeepSpeed ZeRO-2: until its backward ends, see below)."""
    unit_layers = plan.unit_layers
    names = rows.name[mine]
    backward_gather = names == "param_gather_bwd"
    is_gather = (names == "param_gather_fwd") | backward_gather
    gathers, reduces = mine[is_gather], mine[names == "grad_reduce_scatter"]
    gather_bytes, reduce_bytes = rows.nbytes[gathers].astype(float), rows.nbytes[reduces].astype(float)
    if plan.pipelined_fsdp:
        # FSDP + PP: a unit's gathered weights live until its post_backward reshards them as its reduce-scatter is
        # issued; its unsharded gradients from the rank's first backward until that reduce-scatter ends.
        resharded = _lookup((rows.layer[reduces],), rows.start[reduces], (rows.layer[gathers],))
        backward_starts = rows.start[mine[rows.kind[mine] == _BACKWARD]]
        first_backward = backward_starts.min() if len(backward_starts) else np.nan
        return {"gathered_weights": (rows.start[gathers], resharded, gather_bytes),
                "unreduced_gradients": (np.full(len(reduces), first_backward), rows.end[reduces], reduce_bytes)}
    unit = rows.layer[gathers] // unit_layers
    keep_to_backward = plan.zero_stage < 3
    phase = np.where(backward_gather[is_gather] | keep_to_backward, _BWD, _FWD)
    gathered = (rows.start[gathers], spans.at(rank, rows.microbatch[gathers], phase, unit)[1], gather_bytes)
    if root_unit_bytes(plan):
        gathered = _with_root_unit(rows, gathers, rank, unit, phase, spans, plan, gathered)
    first, last = spans.at(rank, rows.microbatch[reduces], _BWD, rows.layer[reduces] // unit_layers)
    freed = rows.end[reduces]
    if plan.zero_stage == 2 and not plan.flat_params:
        # DeepSpeed ZeRO-2 (contiguous_gradients): a gradient is copied into one of the two reduction buckets,
        # counted as comm_buffers, as soon as its layer's backward produces it, and autograd's copy is freed
        # (stage_1_and_2.py, reduce_independent_p_g_buckets_and_remove_grads). However far the reduce-scatters
        # lag, fresh gradients do not pile up.
        freed = np.minimum(freed, last)
    grads = (first, freed, reduce_bytes)
    return {"gathered_weights": gathered, "unreduced_gradients": grads}


def _with_root_unit(rows: TimelineRows, gathers: np.ndarray, rank: int, unit: np.ndarray, phase: np.ndarray,
                    spans: _UnitSpans, plan: Plan, gathered: tuple[np.ndarray, np.ndarray, np.ndarray]
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FSDP's gathered weights with the root unit apart (``root_unit_bytes``): the trace's gathers carry the
    embedding in the first unit and the final norm and head in the last; here those bytes live once per
    micro-batch, from its first gather to the end of its backward, and each gather keeps only its layers. A
    unit's backward copy is allocated no earlier than its forward copy is freed (FSDP2's all-gather stream waits
    for the reshard event, ``FSDPParamGroup`` all-gather state)."""
    model, tp, size = plan.model, plan.tp, plan.weight_bytes_per_param
    starts, ends, sizes = gathered
    units = model.num_layers // plan.unit_layers
    extra = (np.where(unit == 0, embedding_params(model) / tp * size, 0.0)
             + np.where(unit == units - 1, head_params(model) / tp * size, 0.0))
    backward = phase == _BWD
    microbatch = rows.microbatch[gathers]
    forward_copy_freed = spans.at(rank, microbatch, _FWD, unit)[1]
    starts = np.where(backward & ~np.isnan(forward_copy_freed), np.fmax(starts, forward_copy_freed), starts)
    # FSDP issues the gather that waits for a unit's compute after resharding that unit (FSDP2's post_forward /
    # post_backward run before the next pre-forward's unshard; FSDP1's rate limiter frees first), so at equal
    # times the free comes first: the copy is freed an ulp before its compute's end.
    ends = np.nextafter(ends, -np.inf)
    order, first = _groups((microbatch,))  # each micro-batch's first gather, micro-batches ascending
    microbatches = microbatch[order][first]
    first_gather = np.fmin.reduceat(rows.start[gathers][order], first) if len(first) else np.empty(0)
    last_backward = spans.at(rank, microbatches, _BWD, 0)[1]
    return (np.concatenate([starts, first_gather]), np.concatenate([ends, last_backward]),
            np.concatenate([sizes - extra, np.full(len(microbatches), root_unit_bytes(plan))]))
