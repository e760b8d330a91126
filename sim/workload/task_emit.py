"""One simulated rank's emission state and the helpers every task of the stage emitter goes through.

In: the graph being built, the Plan, the rank's cost model, the rank and its pipeline's send table (the stage emitter's
arguments, sim.workload.build). Out: ``TaskEmitter``, the base the stage emitter's classes extend: its state (the
step structure's priced blocks, TP ops and bytes, recorded chains, pending and blocking dependencies, and the
data-parallel, MoE and CP emitters it drives) and the task helpers: add a task with the pending and blocking-TP
dependencies a task on its stream takes (``_add``, ``_blocking``), price a block once (``_price``), a compute task
and a TP collective (``_compute``, ``_tp``), a task with exactly the edges given (``_exact_task``, for the MoE and CP
emitters), the flags of a task whose chain rule is not the default (``_flagged``, for stamping) and a pass's send
route (``_route``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sim.costs.models import ComputePhase, CostModel, Work
from sim.plan import Plan
from sim.spec.variation import jitter_stream
from sim.workload.blocks import blocks, frozen_layer_blocks
from sim.workload.cp_attention import context_attention
from sim.workload.cp_emit import ContextEmitter
from sim.workload.data_parallel import DataParallelEmitter
from sim.workload.ir import EXPERT_DP_STREAM, NCCL_STREAM, OFFLOAD_STREAM, REPLICA_STREAM, Chain, TaskGraph
from sim.workload.moe_emit import MoeLayerEmitter
from sim.workload.tp_collectives import loss_collectives, tp_ops
from sim.workload.tp_overlap import (
    async_tp,
    reduce_partials_bytes,
    reduce_partials_seconds,
    shard_copy_seconds,
    tp_overlap_chunks,
)


class TaskEmitter:
    """One rank's emission state and task helpers (the base of ``sim.workload.build._StageEmitter``)."""

    moe: MoeLayerEmitter  # set for a MoE model

    def __init__(self, graph: TaskGraph, plan: Plan, costs: CostModel, rank: int,
                 sends: dict[tuple[str, int, int], int], stamp: bool = True) -> None:
        grid, scenario = plan.grid, plan.scenario
        here = grid.coord(rank)
        self.stage_rank = [grid.rank(here.tp, here.dp, stage, here.cp) for stage in range(plan.pp)]
        self.g, self.plan, self.costs, self.rank, self.sends = graph, plan, costs, rank, sends
        self.stage = here.pp
        self.p, self.v = plan.pp, plan.vpp
        self.tp_group = grid.tp_group(self.rank)
        self.tp = plan.tp
        self.splits_backward = plan.splits_backward
        self.tp_before, self.tp_after = tp_ops(plan)
        self.tp_chunks = tp_overlap_chunks(plan)  # > 0: TE userbuffers' chunked all-gather / reduce-scatter
        # AsyncTP: the reduction kernel after each chunked reduce-scatter (0: none; tp_overlap.reduce_partials_bytes)
        self.reduce_partials = (reduce_partials_seconds(plan, costs), reduce_partials_bytes(plan))
        self.async_tp = async_tp(plan)  # PyTorch's AsyncTP: its own order of copies and chunk GEMMs (_async_tp_block)
        self.shard_copy = shard_copy_seconds(plan, costs)
        work = blocks(plan)
        self.block_work, self.column_work, self.recompute_work = work.block, work.column, work.recompute
        self.row_work = work.row
        # the forward beside chunked collectives: its GEMMs one per chunk (tp_overlap.chunk_gemms)
        self.chunked_work, self.chunked_row = work.chunked or work.block, work.chunked_row or work.row
        self.chunked_column = work.chunked_column or work.column
        self.modules = plan.recompute_modules  # selective recomputation's submodules (empty: none)
        self.embed_work, self.head_work = work.embedding, work.head
        self.loss_collectives = loss_collectives(plan)  # the unfused loss's TP all-reduces
        self.trained_work = (self.block_work, self.column_work)
        self.frozen_work = frozen_layer_blocks(plan)  # method frozen: its layers' backward skips weight gradients
        self.flags: dict[int, tuple[bool, bool, tuple[int, ...], bool]] = {}  # task -> non-default chain deps
        self.tp_bytes = plan.tp_bytes
        self.p2p_bytes = plan.p2p_bytes
        # Per layer: the task whose end makes that layer's gradients final (the last backward pass seen).
        self.grad_ready: dict[int, int] = {}
        self.pending_deps: list[int] = []  # extra dependencies of the next task (a gathered unit's weights)
        self.priced: dict[tuple[int, str], tuple[float, float]] = {}  # (id(work), phase) -> (seconds, FLOPs)
        self.jitter = jitter_stream(scenario.variation.jitter, scenario.seed, rank)
        self.fixed_durations = stamp and scenario.variation.jitter == 0  # layers can share one recorded chain
        self.chains: dict[str, Chain] = {}  # direction -> one layer's tasks (``_stamp_entry``, see _layer)
        self.chain_keys: dict[str, dict[int, str]] = {"forward": {}, "backward": {}}  # layer -> ``_chain_key``
        self.stamping: dict[tuple[str, bool], bool] = {}  # (direction, micro-batch 0) -> ``_stamping``'s answer
        # A lazy graph's whole passes (``_pass_chain``): (phase, local chunk) -> the pass's chain, its send's entry,
        # each layer's last entry (layer, index); None where a pass of it cannot be one chain.
        self.pass_chains: dict[tuple[str, int], tuple[Chain, int, tuple[tuple[int, int], ...], int] | None] = {}
        # Those stamped at a micro-batch other than 0: every later one of the chunk stamps it at once (forward).
        self.fast_passes: dict[tuple[str, int], tuple[Chain, int, tuple[tuple[int, int], ...], int]] = {}
        # (phase, local chunk, the chunk it feeds) -> (its global chunk, the send's (src, dst) or None, its name)
        self.routes: dict[tuple[str, int, int], tuple[int, tuple[int, int] | None, str]] = {}
        # Megatron issues TP collectives synchronously: the compute stream runs nothing after one until it ends,
        # consumer or not (parallel.tp_comm_overlap: false). blocking_tp: the collective the next compute waits on.
        self.tp_blocks = not scenario.parallel.tp_comm_overlap
        self.p2p_blocks = not scenario.parallel.overlap_p2p_comm  # the next compute waits for this stage's send
        self.blocking_tp: int | None = None
        self.dp = DataParallelEmitter(self)
        # The data-parallel hooks add nothing inside layers (no ZeRO-3/FSDP gathers, no ZeRO-2 buckets).
        self.dp_inert = not self.dp.multi or (not self.dp.sharded_units and self.dp.zero < 2)
        self.waits: list[tuple[int, tuple[str, int, int]]] = []  # (task, (phase, global chunk, microbatch))
        # An issued unit of several passes (Action.with_next, DualPipe's chunks): its first task, which waits for
        # every pass's input, and the sends its passes defer to its end; None outside such a unit.
        self.unit_first: int | None = None
        self.layer_first = -1  # the index of the layer pass's first task (_layer_tasks), for _exact_task's check
        self.unit_sends: list[tuple[str, int, int, int, int | None, int | None]] = []
        self.unit_passes: list[tuple[str, int]] = []  # (phase, first task) of each pass of the open unit
        self.tail: int | None = None  # the last task of the pass just emitted
        # Activation offload (training.cpu_offloading_num_layers): the copy the next layer's forward waits for.
        self.offload = scenario.training.cpu_offloading_num_layers > 0
        self.pending_offload: int | None = None
        self.moe_layers = plan.moe_layers
        self.moe_host = plan.moe_host_seconds  # direction -> the host's issue time of a MoE layer pass (0: none)
        self.cp_attention = context_attention(plan)  # context parallelism's attention core and exchanges
        self.cp = ContextEmitter(self) if self.cp_attention is not None else None
        if plan.is_moe:  # a MoE layer's MLP part (only MoE layers reach it)
            self.moe = MoeLayerEmitter(self)

    def _global_chunk(self, chunk: int) -> int:
        """The model chunk g (layers ``plan.chunk_layers(g)``) this stage's local chunk holds."""
        return self.plan.stage_chunks[self.stage][chunk]

    def _layers(self, chunk: int) -> range:
        return self.plan.chunk_layers(self._global_chunk(chunk))

    def _add(self, stream: str, kind: str, name: str, mb: int, layer: int, after: int | None,
             also: Sequence[int] = (), **extra: Any) -> int:
        """Adds a task after ``after`` (an edge only across streams: a stream runs in order) and the tasks in
        ``also``, taking the pending and blocking-TP dependencies a task on ``stream`` has."""
        deps = [after] if after is not None and self.g.tasks[after].stream != stream else []
        deps += also
        if self.pending_deps and stream not in (NCCL_STREAM, REPLICA_STREAM, OFFLOAD_STREAM, EXPERT_DP_STREAM):
            deps += self.pending_deps
            self.pending_deps = []
        blocking = self._blocking(stream, deps)
        task = self.g.add(self.rank, self.stage, stream, kind, name, mb, layer, deps, **extra)
        if blocking:
            self.blocking_tp = task
        return task

    def _price(self, work: Work, phase: ComputePhase) -> tuple[float, float]:
        # The same few blocks recur for every micro-batch and layer: price each (block, phase) once. Keyed by
        # identity, which is stable because this emitter owns its Work objects for as long as the cache lives.
        key = (id(work), phase)
        if key not in self.priced:
            self.priced[key] = (self.costs.compute_time(work, phase), work.flops(phase))
        return self.priced[key]

    def _compute(self, kind: str, name: str, mb: int, layer: int, work: Work, after: int | None,
                 phase: ComputePhase = "forward", cost: tuple[float, float] | None = None) -> int | None:
        duration, flops = cost or self._price(work, phase)
        if duration <= 0 and work.layer_share == 0:
            return after  # nothing to run (embedding/head under fixed costs)
        duration *= self.jitter()
        if self.pending_deps or after is None or after != self.blocking_tp:
            return self._add("compute", kind, name, mb, layer, after, duration=duration, flops=flops)
        # The hot path: right after the TP collective it consumes, no other dependencies.
        self.blocking_tp = None
        return self.g.add(self.rank, self.stage, "compute", kind, name, mb, layer, [after], duration, "", 0.0, flops)

    def _tp(self, op: str | None, mb: int, layer: int, after: int | None) -> int | None:
        if self.tp == 1 or op is None:
            return after
        if self.pending_deps or after is None or self.g.tasks[after].stream == "tp":
            return self._add("tp", "tp", op, mb, layer, after, op=op, nbytes=self.tp_bytes, group=self.tp_group)
        # The hot path (10^5..10^6 calls): after a compute task, no extra dependencies.
        task = self.g.add(self.rank, self.stage, "tp", "tp", op, mb, layer, [after], None, op, self.tp_bytes, 0.0,
                          self.tp_group)
        if self.tp_blocks:
            self.blocking_tp = task
        return task

    def _blocking(self, stream: str, deps: list[int]) -> bool:
        """Synchronous TP communication: a compute task also waits for the last TP collective issued before
        it. Returns whether the task about to be added is a TP collective that blocks what follows."""
        if stream == "compute" and self.blocking_tp is not None:
            if self.blocking_tp not in deps:
                deps.append(self.blocking_tp)
            self.blocking_tp = None
        return stream == "tp" and self.tp_blocks

    def _flagged(self, task: int | None, prev: bool, touch: bool, extra: tuple[int, ...],
                 consumed: bool = False) -> int | None:
        """Marks a task whose dependencies differ from the chain default, for stamping (see ``_layer``): ``prev``
        depends on the task emitted just before it (other stream), ``touch`` takes or sets the blocking TP
        collective, ``extra`` depends on the tasks that many places earlier in the chain, and a ``consumed`` TP
        collective is one the next compute reads, so it waits for it even with asynchronous TP communication."""
        self.flags[task] = (prev, touch, extra, consumed)  # type: ignore[index]
        return task

    def _exact_task(self, stream: str, kind: str, name: str, mb: int, layer: int, prev: int | None,
                    also: Sequence[int] = (), work: Work | None = None, phase: ComputePhase = "forward",
                    exchange: tuple[str, float, tuple[int, ...], float] | None = None,
                    seconds: float | None = None) -> int:
        """One task of a MoE layer's MLP part or a CP attention core (sim.workload.moe_emit, cp_emit): after
        ``prev`` (the task emitted just before it, None: no edge to it) and the tasks in ``also``; compute priced
        from ``work`` in ``phase``, or an ``exchange`` (op, bytes, group, all-to-all skew), timed by the network
        unless ``seconds`` gives its time (DeepEP's kernels, ``moe_layer.Exchange.seconds``). Flagged for stamping
        with exactly these edges (see ``_layer``)."""
        # ``prev``: the task just before it in the layer's chain, which for the pass's first task is the one the
        # pass follows (Chain.stamp's ``after``), emitted earlier where an activation reload came in between
        assert prev is None or prev == len(self.g.tasks) - 1 or len(self.g.tasks) == self.layer_first
        if exchange is not None:
            op, nbytes, group, skew = exchange
            task = self._add(stream, kind, f"{name}_{op}" if name else op, mb, layer, prev, also, op=op,
                             nbytes=nbytes, group=group, skew=skew, duration=seconds)
        else:
            assert work is not None
            duration, flops = self._price(work, phase)
            task = self._add(stream, kind, name, mb, layer, prev, also, duration=duration * self.jitter(), flops=flops)
        self._flagged(task, prev is not None, True, tuple(task - dep for dep in also))
        return task

    def _route(self, phase: str, chunk: int, to_global_chunk: int) -> tuple[int, tuple[int, int] | None, str]:
        """A pass's send: its global chunk, the send's (src, dst) (None at the turn of a V: the next chunk is on
        this GPU) and its name; the same few per stage, worked out once."""
        route = self.routes.get((phase, chunk, to_global_chunk))
        if route is None:
            to_stage, _ = self.plan.chunk_location(to_global_chunk, chunk)
            route = self.routes[(phase, chunk, to_global_chunk)] = (
                self._global_chunk(chunk), None if to_stage == self.stage else (self.rank, self.stage_rank[to_stage]),
                "send_forward" if phase == "F" else "send_backward")
        return route

