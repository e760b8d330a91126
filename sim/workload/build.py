"""Plan -> task graph of one training step.

In: a resolved ``Plan`` (sim.plan). Out: a ``TaskGraph``: every task (compute, TP collective, PP send, DP bucket
all-reduce, optimizer step) with its rank, stream, kind, micro-batch, layer, duration (compute) or bytes and
group (communication), and dependencies; plus each (rank, stream)'s ordered task list, which the engine
replays like a CUDA stream.

Emitters, per simulated rank (``ranks: slice``, the default: rank tp=0, dp=0 of every pipeline stage, with TP
and DP collectives costed for their full groups; ``ranks: all``: every rank, each collective a rendezvous of
its group's members, matched by group and order of issue):
- pipeline: the schedule's actions (forward, backward, and for zero-bubble schedules the separate
  weight-gradient pass) of each micro-batch and model chunk, layer by layer; a layer is two blocks
  (attention, MLP); chunk c of stage s is the model's chunk c*p + s (Megatron's interleaving), or for the
  V-shaped zb-v chunk s (c = 0) and 2p-1-s (c = 1);
- tensor parallel (Megatron, Narayanan et al. SC21 Sec. 2.3): an all-reduce of b*s*h after each block's
  forward and each block's backward (2 + 2 per layer); with sequence parallelism an all-gather before and a
  reduce-scatter after each block instead (Korthikanti et al. 2022 Sec. 4.2.2); forward collectives block the
  compute stream (Megatron's synchronous calls), while in the backward the column-parallel GEMM's
  input-gradient reduction runs under its weight gradient, and SP all-gathers the stored sharded input again
  beside the input-gradient GEMMs (Megatron-LM's asynchronous linear layers); full recomputation replays the
  forward, collectives included, before each layer's backward;
- pipeline parallel: one send per chunk boundary and micro-batch each way, b*s*h/t per rank (Megatron's
  scatter/gather of p2p tensors; the last stage's chunk c feeds stage 0's chunk c+1); the receiver's first task
  of that micro-batch depends on it;
- data parallel (sim.workload.data_parallel, called through hooks): DDP buckets, ZeRO-1/2/3 and FSDP collectives and
  the optimizer step.
The graph's types live in sim.workload.ir (re-exported here).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Literal

from sim.costs.models import ComputePhase, CostModel, ScaledCosts, Work
from sim.hardware.gpus import GPU_PRESETS
from sim.parallel.chunks import upstream
from sim.parallel.schedules import Action, Schedule
from sim.plan import Plan
from sim.spec.variation import jitter_stream
from sim.workload.cp_emit import ContextEmitter
from sim.workload.data_parallel import DataParallelEmitter
from sim.workload.ir import (
    EP_STREAM,
    EXPERT_DP_STREAM,
    HOST_STREAM,
    NCCL_STREAM,
    OFFLOAD_STREAM,
    REPLICA_STREAM,
    Chain,
    Kind,
    Task,
    TaskGraph,
)
from sim.workload.moe_emit import MoeLayerEmitter
from sim.workload.step import (
    activation_copy_seconds,
    async_tp,
    beside_reduce_scatter,
    blocks,
    context_attention,
    frozen_layer_blocks,
    loss_collectives,
    make_costs,
    offload_buffer_copy_seconds,
    overlaps_backward,
    reduce_partials_bytes,
    reduce_partials_seconds,
    shard_copy_seconds,
    tp_ops,
    tp_overlap_chunks,
)


class _StageEmitter:
    """Emits the tasks of one simulated rank (one pipeline stage, all of its model chunks); a MoE layer's MLP part
    through ``moe`` (sim.workload.moe_emit), the attention block under context parallelism through ``cp``
    (sim.workload.cp_emit), data-parallel communication through ``dp`` (sim.workload.data_parallel)."""

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
        # AsyncTP: the reduction kernel after each chunked reduce-scatter (0: none; step.reduce_partials_bytes)
        self.reduce_partials = (reduce_partials_seconds(plan, costs), reduce_partials_bytes(plan))
        self.async_tp = async_tp(plan)  # PyTorch's AsyncTP: its own order of copies and chunk GEMMs (_async_tp_block)
        self.shard_copy = shard_copy_seconds(plan, costs)
        work = blocks(plan)
        self.block_work, self.column_work, self.recompute_work = work.block, work.column, work.recompute
        self.row_work = work.row
        # the forward beside chunked collectives: its GEMMs one per chunk (step.chunk_gemms)
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

    # ------------------------------------------------------------------------------------------ helpers
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

    def _tp_chunk(self, op: str, nbytes: float, mb: int, layer: int, after: int | None) -> int:
        """A part of a chunked TP collective (``_overlapped_gather``, ``_chunked_block``): ``nbytes`` of ``op``."""
        return self._add("tp", "tp", op, mb, layer, after, op=op, nbytes=nbytes, group=self.tp_group)

    def _overlapped_gather(self, mb: int, layer: int, after: int | None) -> int:
        """SP's all-gather before a block as Transformer Engine's userbuffers ring exchange (``tp_chunks`` > 0,
        docs/mechanisms/tp_comm_overlap.md): its first chunk, which the block's first GEMM waits for, then the
        other chunks, which run beside that GEMM on the ``tp`` stream. Returns the first chunk (the consumer's
        dependency; a task that consumes it is flagged to depend on it, not on the task emitted before it)."""
        n, op = self.tp_chunks, self.tp_before
        assert op is not None
        head = self._tp_chunk(op, self.tp_bytes / n, mb, layer, after)
        self._tp_chunk(op, self.tp_bytes * (n - 1) / n, mb, layer, head)
        return head

    def _after_chunk(self, task: int | None, head: int) -> int | None:
        """Flags a compute task that reads the first chunk ``head`` of an overlapped all-gather (not the task
        emitted just before it, the other chunks)."""
        assert task is not None
        return self._flagged(task, False, True, (task - head,))

    def _chunked_block(self, kind: str, block: str, mb: int, layer: int, after: int | None,
                       phase: ComputePhase) -> int | None:
        """A block's forward (or full recomputation's replay) under TE's userbuffers: the all-gather's first chunk,
        then the block's compute up to its row-parallel GEMM beside the gather's other chunks, then the row GEMM
        beside the reduce-scatter's chunks but the last, which follows the GEMM (TE's pipelined reduce-scatter,
        ``split_overlap_rs``). Returns the last chunk."""
        work, row_work = self.chunked_work[block], self.chunked_row[block]
        total, row = self._price(work, phase), self._price(row_work, phase)
        if self.async_tp and row[0] > 0:
            return self._async_tp_block(kind, block, mb, layer, after, phase, total, row)
        head = self._overlapped_gather(mb, layer, after)
        pre = self._after_chunk(self._compute(kind, block, mb, layer, work, head, phase,
                                              cost=(total[0] - row[0], total[1] - row[1])), head)
        row = (beside_reduce_scatter(self.plan, row[0]), row[1])  # on the SMs the reduce-scatter leaves
        n, op = self.tp_chunks, self.tp_after
        assert op is not None
        self._tp_chunk(op, self.tp_bytes * (n - 1) / n, mb, layer, pre)
        last = pre
        if row[0] > 0:  # (fixed costs price a block whole: no row GEMM apart)
            last = self._flagged(self._compute(kind, block, mb, layer, row_work, pre, phase, cost=row),
                                 False, True, ())
        return self._sum_partials(kind, block, mb, layer, self._tp_chunk(op, self.tp_bytes / n, mb, layer, last))

    def _async_tp_block(self, kind: str, block: str, mb: int, layer: int, after: int | None, phase: ComputePhase,
                        total: tuple[float, float], row: tuple[float, float]) -> int | None:
        """A block's forward (or full recomputation's replay) under PyTorch's AsyncTP (torch/distributed/
        _symmetric_memory/__init__.py; docs/mechanisms/tp_comm_overlap.md): the all-gather fused with the
        column-parallel GEMMs (``_fused_gather``), the rest of the block, which reads their whole output, then the
        row-parallel GEMM fused with the reduce-scatter (``_fused_scatter``). Returns the partials' reduction."""
        column = self._price(self.chunked_column[block], phase)
        rest = (total[0] - row[0] - column[0], total[1] - row[1] - column[1])
        after = self._fused_gather(kind, block, mb, layer, after, column)
        after = self._add("compute", kind, block, mb, layer, after, duration=rest[0] * self.jitter(), flops=rest[1])
        return self._fused_scatter(kind, block, mb, layer, after, (beside_reduce_scatter(self.plan, row[0]), row[1]))

    def _async_tp_backward(self, block: str, mb: int, layer: int, after: int | None) -> int | None:
        """A block's backward under AsyncTP: Inductor's micro-pipeline TP pass fuses the compiled backward's
        patterns too (torch/_inductor/fx_passes/micro_pipeline_tp.py, run on every graph post_grad_passes
        compiles): the output gradient's all-gather with the row-parallel GEMM's input gradient
        (``_fused_gather``; the gathered gradient it returns feeds that GEMM's weight gradient), the rest of the
        block's backward with the row GEMM's weight gradient, then the column-parallel GEMMs' input gradient with
        the reduce-scatter of its partial sums (``_fused_scatter``), then their weight gradient, from the input the
        forward's fused gather returned (``return_A``): no input all-gather in the backward. Returns that weight
        gradient."""
        row_dgrad = self._price(self.chunked_row[block], "input_grad")
        column_dgrad = self._price(self.chunked_column[block], "input_grad")
        column_w = self._price(self.column_work[block], "weight_grad")
        # the rest: the block's backward less the column GEMMs' and both GEMMs' input gradients (priced whole)
        pieces = [self._price(self.block_work[block], "backward"), column_w,
                  self._price(self.row_work[block], "input_grad"), self._price(self.column_work[block], "input_grad")]
        rest = tuple(whole - sum(part[k] for part in pieces[1:]) for k, whole in enumerate(pieces[0]))
        after = self._fused_gather("backward", block, mb, layer, after, row_dgrad)
        after = self._add("compute", "backward", block, mb, layer, after, duration=rest[0] * self.jitter(),
                          flops=rest[1])
        after = self._fused_scatter("backward", block, mb, layer, after, column_dgrad)
        return self._add("compute", "backward", block, mb, layer, after, duration=column_w[0] * self.jitter(),
                         flops=column_w[1])

    def _fused_gather(self, kind: str, block: str, mb: int, layer: int, after: int | None,
                      gemm: tuple[float, float]) -> int:
        """AsyncTP's ``fused_all_gather_matmul`` (``_pipelined_all_gather_and_consume``) on ``gemm`` (seconds,
        FLOPs), n = ``tp_chunks``: the rank copies its shard into its symmetric buffer on the compute stream
        (``shard_copy``), then, past a barrier, multiplies its own shard while it pulls the peers' shards one after
        another (copy-engine copies, which do not overlap each other) and multiplies each as it lands: the GEMM's
        first n - 1 chunks beside the n - 1 remote chunks' copies, its last chunk after both. Returns the last."""
        n, op = self.tp_chunks, self.tp_before
        assert op is not None
        copied = self._add("compute", kind, f"{block}_shard_copy", mb, layer, after,
                           duration=self.shard_copy * self.jitter(), nbytes=2 * self.tp_bytes / self.tp)
        pulled = self._tp_chunk(op, self.tp_bytes * (n - 1) / n, mb, layer, copied)
        head = self._flagged(self._add("compute", kind, block, mb, layer, copied, duration=gemm[0] * (n - 1) / n
                                       * self.jitter(), flops=gemm[1] * (n - 1) / n), False, True, ())
        tail = self._add("compute", kind, block, mb, layer, head, (pulled,), duration=gemm[0] / n * self.jitter(),
                         flops=gemm[1] / n)
        self._flagged(tail, True, True, (tail - pulled,))
        return tail

    def _fused_scatter(self, kind: str, block: str, mb: int, layer: int, after: int | None,
                       gemm: tuple[float, float]) -> int:
        """AsyncTP's ``fused_matmul_reduce_scatter`` (``_pipelined_produce_and_all2all``) on ``gemm``: the chunk for
        a peer first, then each peer pulls its chunk while the next is computed, the rank's own chunk last, beside
        the last pull: the reduce-scatter's n - 1 chunks beside the GEMM's other n - 1 chunks, none after it; then
        the reduction of the tp partials (``reduce_partials``). Returns the reduction."""
        n, op = self.tp_chunks, self.tp_after
        assert op is not None
        first = self._add("compute", kind, block, mb, layer, after, duration=gemm[0] / n * self.jitter(),
                          flops=gemm[1] / n)
        pushed = self._tp_chunk(op, self.tp_bytes * (n - 1) / n, mb, layer, first)
        others = self._flagged(self._add("compute", kind, block, mb, layer, first, duration=gemm[0] * (n - 1) / n
                                         * self.jitter(), flops=gemm[1] * (n - 1) / n), False, True, ())
        seconds, nbytes = self.reduce_partials
        summed = self._add("compute", kind, f"{block}_reduce_partials", mb, layer, others, (pushed,),
                           duration=seconds * self.jitter(), nbytes=nbytes)
        self._flagged(summed, True, True, (summed - pushed,))
        return summed

    def _sum_partials(self, kind: str, block: str, mb: int, layer: int, after: int | None) -> int | None:
        """AsyncTP's reduction of the tp partial sums after a chunked reduce-scatter (``after``; sim.workload.step
        ``reduce_partials_bytes``), on the compute stream, which waits for it; ``after`` itself where there is
        none (TE's reduce-scatter reduces as it goes)."""
        seconds, nbytes = self.reduce_partials
        if not seconds:
            return after
        return self._add("compute", kind, f"{block}_reduce_partials", mb, layer, after,
                         duration=seconds * self.jitter(), nbytes=nbytes)

    def _block(self, kind: str, block: str, mb: int, layer: int, after: int | None, phase: ComputePhase) -> int | None:
        """One block with its Megatron collectives: [all-gather] compute [all-reduce | reduce-scatter]."""
        if block == "attention" and self.cp is not None:
            return self.cp.block(kind, mb, layer, after, phase)
        if self.tp_chunks:
            if phase == "forward":
                return self._chunked_block(kind, block, mb, layer, after, phase)
            overlapped = overlaps_backward(self.plan, self._price(self.column_work[block], "weight_grad")[0])
            if overlapped and self.async_tp and self._price(self.row_work[block], "input_grad")[0] > 0:
                return self._async_tp_backward(block, mb, layer, after)
            head = self._overlapped_gather(mb, layer, after)
            if overlapped:
                return self._overlapped_backward(block, mb, layer, head)
            after = self._after_chunk(self._compute(kind, block, mb, layer, self.block_work[block], head, phase),
                                      head)
            return self._sum_partials(kind, block, mb, layer, self._tp(self.tp_after, mb, layer, after))
        if self.tp_before:
            after = self._tp(self.tp_before, mb, layer, after)
        if phase == "backward" and overlaps_backward(self.plan, self._price(self.column_work[block], "weight_grad")[0]):
            return self._overlapped_backward(block, mb, layer, after)
        after = self._compute(kind, block, mb, layer, self.block_work[block], after, phase)
        return self._tp(self.tp_after, mb, layer, after)

    def _overlapped_backward(self, block: str, mb: int, layer: int, after: int | None) -> int | None:
        """A block's fused backward as Megatron-LM runs it (LinearWithGradAccumulationAndAsyncCommunication): the
        column-parallel GEMM's input-gradient all-reduce (reduce-scatter with SP) is issued asynchronously and
        runs while that GEMM's weight gradient is computed; with SP, the layer input, stored sharded, is
        all-gathered again during the input-gradient GEMMs (Korthikanti et al. 2022 Sec. 4.2.2). Returns the
        weight-gradient task; the collective is left as the one the next compute waits for."""
        work, column = self.block_work[block], self.column_work[block]
        total, weight = self._price(work, "backward"), self._price(column, "weight_grad")
        gathered = None
        if self.tp_before:  # SP: issued right after the output-gradient all-gather (``after``), which still gates
            self._flagged(after, True, False, (), consumed=True)  # the compute
            gathered = self._flagged(self._tp(self.tp_before, mb, layer, after), False, False, ())
            self.blocking_tp = after  # the gather just issued does not gate it
        dgrad = self._compute("backward", block, mb, layer, work, after,
                              cost=(total[0] - weight[0], total[1] - weight[1]))
        if gathered is not None:
            self._flagged(dgrad, False, True, ())
        reduce = self._flagged(self._tp(self.tp_after, mb, layer, dgrad), True,
                               False, (), consumed=True)
        extra = [gathered] if gathered is not None else []
        wgrad = self.g.add(self.rank, self.stage, "compute", "backward", block, mb, layer, extra,
                           weight[0] * self.jitter(), "", 0.0, weight[1])
        self._flagged(wgrad, False, False, tuple(wgrad - task for task in extra))
        self.blocking_tp = reduce  # the next block consumes the reduced input gradient
        return self._sum_partials("backward", block, mb, layer, wgrad)  # AsyncTP's, taking ``reduce``

    def _flagged(self, task: int | None, prev: bool, touch: bool, extra: tuple[int, ...],
                 consumed: bool = False) -> int | None:
        """Marks a task whose dependencies differ from the chain default, for stamping (see ``_layer``): ``prev``
        depends on the task emitted just before it (other stream), ``touch`` takes or sets the blocking TP
        collective, ``extra`` depends on the tasks that many places earlier in the chain, and a ``consumed`` TP
        collective is one the next compute reads, so it waits for it even with asynchronous TP communication."""
        self.flags[task] = (prev, touch, extra, consumed)  # type: ignore[index]
        return task

    def open_unit(self) -> None:
        """Starts a unit of passes issued together (``Action.with_next``): DualPipe's ``_forward_backward_chunk``
        receives all inputs, then computes, then sends (dualpipe.py, around ``_commit_and_wait_comm``)."""
        self.unit_first = len(self.g.tasks)

    def close_unit(self) -> None:
        """Ends the unit: an F&B pair of MoE layers is interleaved (``_interleave_pair``), then the sends of its
        passes leave, in issue order, after its last task (DualPipe's ``_forward_backward_chunk`` sends after the
        pair). Under Megatron's combined 1F1B (``moe.a2a_overlap``) the forward's send leaves once the forward's
        own last task is done, beside the backward's last block: ``TransformerModelChunkSchedulePlan.run`` issues
        ``post_forward`` (send_forward_recv_forward) on the communication stream waiting only for the forward's
        event, "so the p2p comm could be overlapped with the pre_dispatch backward" (Megatron-LM d98e8a64dd,
        models/common/model_chunk_schedule_plan.py)."""
        passes, self.unit_passes = self.unit_passes, []
        phases = [phase for phase, _ in passes]
        if self.plan.is_moe and phases[:2] == ["F", "B"]:
            end = passes[2][1] if len(passes) > 2 else len(self.g.tasks)
            self._interleave_pair(passes[0][1], passes[1][1], end)
        self.unit_first = None
        sends, self.unit_sends = self.unit_sends, []
        blocking = self.blocking_tp
        for phase, chunk, mb, to_global_chunk, after, owed in sends:
            early = phase == "F" and self.plan.a2a_overlap
            self.blocking_tp = owed if early else blocking
            self._send(phase, chunk, mb, to_global_chunk, after if early else self.tail)
        self.blocking_tp = blocking

    def _interleave_pair(self, forward: int, backward: int, end: int) -> None:
        """DualPipe's overlapped F&B pair (DeepSeek-V3 report Sec. 3.2.1, Fig. 4; the DualPipe repo's
        ``overlapped_forward_backward``): the forward of one micro-batch (tasks ``forward``..``backward``-1) and the
        backward of another (``backward``..``end``-1) take turns on the compute stream, so each one's MoE dispatch
        and combine (stream ``ep``) run under the other's compute. Each pass is cut into blocks at its MoE split
        points, before every compute task that waits for an ``ep`` exchange (forward: attention+router | experts |
        unpermute, next layer's attention+router | ...; backward mirrored), and the blocks alternate, F first as
        the code issues them. The tasks and their edges stay; only each stream's order inside the unit changes
        (F's and B's own orders kept). An edge from a B task to an F task that now comes later (Megatron's
        synchronous TP wait on the last collective issued) moves to the last F task on that stream issued before
        it. A pair of dense layers has no cut and keeps its order (F then B)."""
        tasks = self.g.tasks

        def cut(first: int, last: int) -> list[list[int]]:
            parts: list[list[int]] = [[]]
            for task in tasks[first:last]:
                if (task.stream == "compute" and parts[-1]
                        and any(tasks[dep].stream == EP_STREAM for dep in task.deps if dep >= first)):
                    parts.append([])
                parts[-1].append(task.id)
            return parts

        f_parts, b_parts = cut(forward, backward), cut(backward, end)
        if len(f_parts) == 1 and len(b_parts) == 1:
            return
        order: list[int] = []
        for i in range(max(len(f_parts), len(b_parts))):
            order += (f_parts[i] if i < len(f_parts) else []) + (b_parts[i] if i < len(b_parts) else [])
        position = {task: i for i, task in enumerate(order)}
        last_on: dict[str, int] = {}  # stream -> the last F task on it so far in the new order
        for task_id in order:
            task = tasks[task_id]
            if task_id >= backward:
                moved = [dep for dep in task.deps if forward <= dep < backward and position[dep] > position[task_id]]
                if moved:
                    deps = list(task.deps)  # a stamped task's are a tuple already
                    for dep in moved:
                        deps.remove(dep)
                        earlier = last_on.get(tasks[dep].stream)
                        if earlier is not None and earlier not in deps:
                            deps.append(earlier)
                    task.deps = tuple(deps)
            else:
                last_on[task.stream] = task_id
        for (rank, _), stream_order in self.g.streams.items():
            if rank != self.rank:
                continue
            start = len(stream_order)  # the unit's tasks are the last on each of this rank's streams
            while start and stream_order[start - 1] >= forward:
                start -= 1
            mine = set(stream_order[start:])
            stream_order[start:] = ([task for task in order if task in mine]
                                    + [task for task in stream_order[start:] if task >= end])
        if end == len(tasks):  # no W pass after the pair: the unit ends with the pair's last compute task
            self.tail = max((t for t in order if tasks[t].stream == "compute"), key=position.__getitem__)

    def _send(self, phase: str, chunk: int, mb: int, to_global_chunk: int, after: int | None) -> None:
        if self.unit_first is not None:  # the pass's last task and the TP reduction it owes, for close_unit
            self.unit_sends.append((phase, chunk, mb, to_global_chunk, after, self.blocking_tp))
            return
        g, group, name = self._route(phase, chunk, to_global_chunk)
        if group is None:  # the turn of a V: the next chunk is on this GPU, nothing to send
            self.sends[(phase, g, mb)] = after  # type: ignore[assignment]
            return
        # The send leaves once the pass's output is final: after its last task and the TP reduction that compute
        # still owes (Megatron waits the asynchronous input-gradient reduction before the backward returns).
        also = [self.blocking_tp] if self.blocking_tp is not None else []
        task = self._add("pp", "pp", name, mb, -1, after, also, op="send", nbytes=self.p2p_bytes, group=group)
        self.sends[(phase, g, mb)] = task
        if self.p2p_blocks:
            # Megatron-LM's _communicate waits on every isend/irecv request before returning, so the stage launches
            # nothing more until its send completes (parallel.overlap_p2p_comm: false; docs/mechanisms/p2p_wait.md).
            self.blocking_tp = task

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

    # ---------------------------------------------------------------------------------- tasks with exact edges
    def _exact_task(self, stream: str, kind: str, name: str, mb: int, layer: int, prev: int | None,
                    also: Sequence[int] = (), work: Work | None = None, phase: ComputePhase = "forward",
                    exchange: tuple[str, float, tuple[int, ...], float] | None = None,
                    seconds: float | None = None) -> int:
        """One task of a MoE layer's MLP part or a CP attention core (sim.workload.moe_emit, cp_emit): after
        ``prev`` (the task emitted just before it, None: no edge to it) and the tasks in ``also``; compute priced
        from ``work`` in ``phase``, or an ``exchange`` (op, bytes, group, all-to-all skew), timed by the network
        unless ``seconds`` gives its time (DeepEP's kernels, ``step.Exchange.seconds``). Flagged for stamping
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

    # -------------------------------------------------------------------------------------------- phases
    def forward(self, mb: int, chunk: int) -> None:
        fast = self.fast_passes.get(("F", chunk))
        if fast is not None and mb and not self.pending_deps and self.unit_first is None:
            # What the checks below found for this chunk at an earlier micro-batch other than 0, whose answers
            # hold for every such micro-batch (_stamping, before_chunk), so straight to its chain
            self._fast_pass(fast, "F", mb)
            return
        g, last = self._global_chunk(chunk), self.p * self.v - 1
        self.dp.before_chunk(mb, g)  # FSDP + PP's gathers: not the pass's first task, which waits for its input
        first_task = len(self.g.tasks)
        after: int | None = None
        if g == 0:
            self.dp.before_forward(mb, g, -1, after)
            after = self._compute("forward", "embedding", mb, -1, self.embed_work, after)
        chains, keys = self._stamping(mb, "forward")
        if chains is not None and self.g.lazy and 0 < g < last and not self.pending_deps and self.unit_first is None:
            fused = self._pass_chain("F", chunk, g + 1, chains, keys)
            if fused is not None:  # the whole pass, its send included, as one record
                if mb and _reads_first(fused[0]):
                    self.fast_passes[("F", chunk)] = fused
                self._stamp_pass(fused, "F", g, mb)
                self._wait_upstream(self._first_reading(first_task), "F", g, mb)
                return
        for layer in self._layers(chunk):
            if chains is not None and not self.pending_deps:  # a recorded chain, the layer hooks inert: stamp it
                chain = chains.get(keys.get(layer) or self._key(keys, "forward", layer))
                if chain is not None:
                    after, self.blocking_tp = self.g.stamp(chain, mb, layer, after, self.blocking_tp)
                    continue
            self.dp.before_forward(mb, g, layer, after)
            after = self._layer("forward", mb, layer, after)
        if g == last:
            after = self._compute("forward", "lm_head", mb, -1, self.head_work, after)
            for op, nbytes in self.loss_collectives:  # each waited for by the loss's next kernel
                after = self._add("tp", "tp", op, mb, -1, after, op=op, nbytes=nbytes, group=self.tp_group)
                self.blocking_tp = after
        self.tail = after
        self._wait_upstream(self._first_reading(first_task), "F", g, mb)
        if g < last:
            self._send("F", chunk, mb, g + 1, after)

    def _first_reading(self, first: int) -> int:
        """The first task from ``first`` on that reads the forward pass's input: past the weight all-gathers
        ZeRO-1/2's ``overlap_param_gather`` issues ahead of the pass's compute (``DataParallelEmitter.
        before_forward``): those issued at the step start must not wait for the upstream stage's activations
        (Megatron-Core dispatches bucket 0's in zero_grad_buffer, before any forward), and those the compute
        reaching the chunk dispatches wait for them already (``_reached``)."""
        tasks, gathers = self.g.tasks, (NCCL_STREAM, EXPERT_DP_STREAM)
        while first < len(tasks) - 1 and tasks[first].stream in gathers:
            first += 1
        return first

    def backward(self, mb: int, chunk: int) -> None:
        """The input-gradient pass (and the weight gradients too, unless the schedule splits them off)."""
        fast = self.fast_passes.get(("B", chunk))
        if (fast is not None and mb and not self.pending_deps and self.unit_first is None
                and self.dp.chunk_backward_inert(mb)):  # as in forward
            self._fast_pass(fast, "B", mb)
            return
        g, last = self._global_chunk(chunk), self.p * self.v - 1
        phase: ComputePhase = "input_grad" if self.splits_backward else "backward"
        first_task = len(self.g.tasks)
        after: int | None = None
        if g == last:
            after = self._compute("backward", "lm_head", mb, -1, self.head_work, after, phase)
        chains, keys = self._stamping(mb, "backward")
        if (chains is not None and self.g.lazy and 0 < g < last and not self.pending_deps and self.unit_first is None
                and self.dp.chunk_backward_inert(mb)):
            fused = self._pass_chain("B", chunk, g - 1, chains, keys)
            if fused is not None:  # as in forward
                if mb:
                    self.fast_passes[("B", chunk)] = fused
                self._stamp_pass(fused, "B", g, mb)
                self._wait_upstream(first_task, "B", g, mb)
                return
        for layer in reversed(self._layers(chunk)):
            if chains is not None and not self.pending_deps:  # as in forward: the hooks below do nothing here
                chain = chains.get(keys.get(layer) or self._key(keys, "backward", layer))
                if chain is not None:
                    after, self.blocking_tp = self.g.stamp(chain, mb, layer, after, self.blocking_tp)
                    if not self.splits_backward:
                        self.grad_ready[layer] = after  # type: ignore[assignment]
                    continue
            after = self._layer("backward", mb, layer, after)
            if not self.splits_backward:
                self.grad_ready[layer] = after  # type: ignore[assignment]
            if not (g == 0 and layer == 0):
                self.dp.after_layer_backward(mb, layer, after)  # type: ignore[arg-type]
        if g == 0:
            after = self._compute("backward", "embedding", mb, -1, self.embed_work, after, phase)
            if not self.splits_backward:
                self.grad_ready[-1] = after  # type: ignore[assignment]
            self.dp.after_layer_backward(mb, 0, after)  # type: ignore[arg-type]  # the embedding's grads too
        self.dp.after_chunk_backward(mb, g, after)  # type: ignore[arg-type]
        self.tail = after
        self._wait_upstream(first_task, "B", g, mb)
        if g > 0:
            self._send("B", chunk, mb, g - 1, after)

    def _wait_upstream(self, first_task: int, phase: Literal["F", "B"], g: int, mb: int) -> None:
        """The pass's first task waits for the send of the pass it needs on a neighbouring chunk
        (sim.parallel.chunks.upstream; on its own chunk the stream order already holds it)."""
        needs = upstream(phase, g, mb, self.p * self.v - 1)
        if needs is not None and needs[1] != g:
            self.waits.append((first_task if self.unit_first is None else self.unit_first, needs))

    def _blocking(self, stream: str, deps: list[int]) -> bool:
        """Synchronous TP communication: a compute task also waits for the last TP collective issued before
        it. Returns whether the task about to be added is a TP collective that blocks what follows."""
        if stream == "compute" and self.blocking_tp is not None:
            if self.blocking_tp not in deps:
                deps.append(self.blocking_tp)
            self.blocking_tp = None
        return stream == "tp" and self.tp_blocks

    def _layer(self, direction: str, mb: int, layer: int, after: int | None) -> int | None:
        """One layer's forward or backward with, under activation offload (``Plan.offloads``), its PCIe copies on
        the offload stream, as Transformer Engine's CPU offload handler orders them (transformer_engine/pytorch/
        cpu_offload.py, AsyncDoubleBufferGroupOffloadHandler): a layer's activations are copied to the host after
        its forward, and the compute after the next layer's forward waits for that copy; in the backward a layer's
        activations are copied back from the start of the next layer's backward (its successor in the forward),
        and its own backward waits for them. Before its copy to the host, an offloaded layer's saved tensors are
        copied into TE's GPU ping-pong buffer on the compute stream (``offload_buffer_copy_seconds``; the next
        layer's forward follows it). Returns the layer's last compute or TP task."""
        if not self.offload:
            return self._layer_tasks(direction, mb, layer, after)
        plan = self.plan
        if direction == "forward":
            after = self._layer_tasks(direction, mb, layer, after)
            if plan.offloads(layer):  # its saved tensors copied into TE's ping-pong buffer, on the compute stream
                nbytes = 2 * plan.stash_bytes(layer)
                after = self._add("compute", "forward", "activation_buffer_copy", mb, layer, after,
                                  duration=offload_buffer_copy_seconds(plan, layer, self.costs) * self.jitter(),
                                  nbytes=nbytes)
            if self.pending_offload is not None:
                self.pending_deps.append(self.pending_offload)
                self.pending_offload = None
            if plan.offloads(layer):
                self.pending_offload = self._add(OFFLOAD_STREAM, "offload", "activation_offload", mb, layer, after,
                                                 duration=activation_copy_seconds(plan, layer),
                                                 nbytes=plan.stash_bytes(layer))
            return after
        below = layer - 1  # offloaded layers are never a chunk's last, so ``below`` is in this layer's chunk
        if below < 0 or not plan.offloads(below):
            return self._layer_tasks(direction, mb, layer, after)
        first = len(self.g.tasks)
        tail = self._layer_tasks(direction, mb, layer, after)
        # The reload starts with this layer's backward: after the task before it, or with its first task.
        reload = self._add(OFFLOAD_STREAM, "offload", "activation_reload", mb, below, after,
                           () if after is not None else (first,), duration=activation_copy_seconds(plan, below),
                           nbytes=plan.stash_bytes(below))
        self.pending_deps.append(reload)
        return tail

    def _layer_tasks(self, direction: str, mb: int, layer: int, after: int | None) -> int | None:
        """One layer's forward or backward (with recomputation), returning its last task. Every layer of a
        stage emits the same chain of tasks (durations, collectives, streams) unless ZeRO-3 / FSDP gathers,
        pending dependencies or jitter tell layers apart, so the chain is recorded from the first layer and
        stamped for the others: the same tasks as emitting them one by one, at a third of the cost."""
        stampable = not self.pending_deps and (self.dp_inert or self.dp.inert(mb, direction)) and self.fixed_durations
        keys = self.chain_keys[direction]
        chain_key = keys.get(layer)
        if chain_key is None:
            chain_key = keys[layer] = self._chain_key(direction, layer)
        chain = self.chains.get(chain_key) if stampable else None
        if chain is not None:  # the hot path (10^4..10^5 layers per build): straight to the graph
            after, self.blocking_tp = self.g.stamp(chain, mb, layer, after, self.blocking_tp)
            return after
        recomputes = direction == "backward" and self.plan.recomputes(layer)
        moe = self.moe_layers[layer]
        if self.frozen_work is not None:  # a frozen layer's backward runs its input gradients only
            frozen = direction == "backward" and self.plan.peft.layer_frozen(layer)
            self.block_work, self.column_work = self.frozen_work if frozen else self.trained_work
        first = self.layer_first = len(self.g.tasks)
        if direction == "forward":
            self.dp.before_layer(mb, layer, "forward")
            for block in ("attention", "mlp"):
                if block == "mlp" and moe:
                    after = self.moe.forward("forward", mb, layer, after)
                else:
                    after = self._block("forward", block, mb, layer, after, "forward")
        else:
            phase: ComputePhase = "input_grad" if self.splits_backward else "backward"
            recompute = self.plan.scenario.training.recompute
            self.dp.before_layer(mb, layer, "backward")
            if recomputes:
                for block in ("attention", "mlp"):
                    if block == "mlp" and moe:
                        after = self.moe.forward("recompute", mb, layer, after)
                    else:
                        after = self._block("recompute", block, mb, layer, after, "forward")
            for block in ("mlp", "attention"):
                if recompute == "selective":
                    after = self._selective_recompute(block, moe, mb, layer, after)
                if block == "mlp" and moe:
                    after = self.moe.backward(mb, layer, after, phase)
                else:
                    after = self._block("backward", block, mb, layer, after, phase)
        if moe and self.moe_host[direction] > 0 and after is not None:
            # full recomputation reruns the layer's forward, its host sync and eager ops with it, in the backward
            host = self.moe_host[direction] + (self.moe_host["forward"] if recomputes else 0.0)
            after = self._moe_host(direction, host, mb, layer, first, after)
        self.dp.unit_compute_done(layer, direction, after)  # type: ignore[arg-type]
        if stampable and not self.pending_deps:
            self.chains[chain_key] = self._record(first)
        return after

    def _moe_host(self, direction: str, host: float, mb: int, layer: int, first: int, last: int) -> int:
        """A MoE layer pass issued by the host behind the dispatcher's host sync (``Plan.moe_host_seconds``,
        sim.costs.host; ``host`` seconds in all): the host's issue time on the ``host`` stream, from the end of the
        pass's first task less that task's length where it is a compute task (so from its start; a collective's
        length is the network's, the error then), and a zero-length task on the compute stream after both it and
        the pass's last task, so the pass ends no earlier than the host has issued it. Both take their edges
        inside the layer's chain (stamped like the rest). Returns the compute task."""
        # the host issued the first task before it ran: count the issue time from that task's start where its
        # length is known here (a compute task; a collective's is the network's)
        head = self.g.tasks[first]
        ran = head.duration if head.stream == "compute" and head.duration else 0.0
        issue = self._add(HOST_STREAM, Kind.HOST, "moe_host_issue", mb, layer, None, (first,),
                          duration=max(0.0, host - ran))
        self._flagged(issue, False, False, (issue - first,))
        kind = Kind.FORWARD if direction == "forward" else Kind.BACKWARD
        wait = self._add("compute", kind, "moe_host_wait", mb, layer, issue, (last,), duration=0.0)
        self._flagged(wait, True, True, (wait - last,))
        return wait

    def _stamping(self, mb: int, direction: str) -> tuple[dict[str, Chain] | None, dict[int, str]]:
        """The recorded chains a pass may stamp layer by layer without the per-layer path (``_layer``), and its
        layers' chain keys: chains only where ``_layer_tasks`` would stamp (fixed durations, the data-parallel
        hooks inert inside layers) and every per-layer hook does nothing in this pass (no activation offload,
        ``DataParallelEmitter.layers_inert``); else None."""
        key = (direction, mb == 0)  # what the answer depends on (DataParallelEmitter.inert, layers_inert)
        stamps = self.stamping.get(key)
        if stamps is None:
            dp = self.dp
            stamps = self.stamping[key] = bool(self.fixed_durations and not self.offload
                                               and (self.dp_inert or dp.inert(mb, direction))
                                               and dp.layers_inert(mb, direction))
        return (self.chains if stamps else None), self.chain_keys[direction]

    def _pass_chain(self, phase: Literal["F", "B"], chunk: int, to_global_chunk: int, chains: dict[str, Chain],
                    keys: dict[int, str]) -> tuple[Chain, int, tuple[tuple[int, int], ...], int] | None:
        """A lazy graph's pass of local ``chunk`` (neither the embedding's nor the head's) as one chain: its layers'
        recorded chains end to end, then its send, so a confirmation keeps one record and replays one unit per
        pass instead of a record per layer and a send task (issue 25: on the 175B search's layouts of one to three
        layers per chunk, a pass's send, its Python and its replay were most of a confirmation). The same tasks as
        stamping layer by layer and adding the send (``_send``): each layer's entries with their rules (their
        ``extra`` offsets are within their layer, the blocking TP collective carried from layer to layer as
        ``Chain.stamp`` carries it), and the send after the last one, depending on it and on the TP collective then
        blocking (the ``also`` edge of ``_send``: an entry of the pass, or none), and becoming the blocking one where
        p2p waits (``p2p_blocks``). None, and stamped layer by layer as before, until every layer's chain is recorded
        (micro-batch 0's pass records them), at the turn of a V (nothing is sent), or where the collective blocking
        at the send would be the one given at the pass's start (an edge a chain's offsets cannot name). Returns the
        chain, its send's entry, each layer's last entry and the chunk's global index."""
        direction = "forward" if phase == "F" else "backward"
        cached = self.pass_chains.get((phase, chunk), False)
        if cached is not False:
            return cached  # type: ignore[return-value]
        layers = self._layers(chunk) if phase == "F" else reversed(self._layers(chunk))
        parts = [(layer, chains.get(keys.get(layer) or self._key(keys, direction, layer))) for layer in layers]
        stream = self.g.streams.get((self.rank, "pp"))
        if any(chain is None for _, chain in parts) or stream is None:
            return None  # not yet: recorded by this pass (stamped layer by layer meanwhile)
        _, group, name = self._route(phase, chunk, to_global_chunk)
        entries = [entry for _, chain in parts for entry in chain.entries]  # type: ignore[union-attr]
        state = -1  # the blocking TP collective as Chain.__init__ follows it: -1 the one given, -2 none, k entry k
        for k, entry in enumerate(entries):
            if entry[11] and state != -2:
                state = -2
            if entry[12]:
                state = k
        if group is None or state == -1:
            self.pass_chains[(phase, chunk)] = None
            return None
        send = len(entries)
        entries.append(("pp", "pp", name, None, "send", self.p2p_bytes, 0.0, group, 1.0, True,
                        (send - state,) if state >= 0 else (), False, self.p2p_blocks, False, stream.append))
        protos = [proto for _, chain in parts for proto in chain.protos]  # type: ignore[union-attr]
        protos.append(Task(-1, self.rank, self.stage, "pp", "pp", name, -1, -1, (), None, "send", self.p2p_bytes,
                           0.0, group))
        ends, at = [], 0
        layer_of: list[int] = []
        for layer, chain in parts:
            size = len(chain.entries)  # type: ignore[union-attr]
            layer_of += [layer] * size
            at += size
            ends.append((layer, at - 1))
        chains_list = self.g.chains
        chains_list.append(Chain(entries, protos, self.rank, self.stage, len(chains_list), (*layer_of, -1)))
        fused = self.pass_chains[(phase, chunk)] = (chains_list[-1], send, tuple(ends), self._global_chunk(chunk))
        return fused

    def _stamp_pass(self, fused: tuple[Chain, int, tuple[tuple[int, int], ...], int], phase: Literal["F", "B"],
                    g: int, mb: int) -> None:
        """Stamps a pass's chain (``_pass_chain``) for micro-batch ``mb`` and keeps what ``forward`` / ``backward``
        keep of its tasks: its last compute task (``tail``), its send, the layers' gradients (``grad_ready``,
        backward without split weight gradients)."""
        chain, send, ends, _ = fused
        first = len(self.g.tasks)
        _, self.blocking_tp = self.g.stamp(chain, mb, -1, None, self.blocking_tp)
        self.tail = first + send - 1
        self.sends[(phase, g, mb)] = first + send
        if phase == "B" and not self.splits_backward:
            grad_ready = self.grad_ready
            for layer, end in ends:
                grad_ready[layer] = first + end

    def _fast_pass(self, fused: tuple[Chain, int, tuple[tuple[int, int], ...], int], phase: Literal["F", "B"],
                   mb: int) -> None:
        """``_stamp_pass`` and ``_wait_upstream`` of a pass whose chain ``forward`` / ``backward`` found at an
        earlier micro-batch (not 0): its first task reads the input (no gather before it: ``_first_reading``) and
        waits for the neighbouring chunk's pass of the same phase (``parallel.chunks.upstream`` on a chunk that
        is neither the first nor the last)."""
        chain, send, ends, g = fused
        graph = self.g
        first = len(graph.tasks)
        _, self.blocking_tp = graph.stamp(chain, mb, -1, None, self.blocking_tp)
        self.tail = first + send - 1
        self.sends[(phase, g, mb)] = first + send
        if phase == "B":
            self.waits.append((first, ("B", g + 1, mb)))
            if not self.splits_backward:
                grad_ready = self.grad_ready
                for layer, end in ends:
                    grad_ready[layer] = first + end
        else:
            self.waits.append((first, ("F", g - 1, mb)))

    def _key(self, keys: dict[int, str], direction: str, layer: int) -> str:
        key = keys[layer] = self._chain_key(direction, layer)
        return key

    def _chain_key(self, direction: str, layer: int) -> str:
        """Which recorded chain a layer's pass repeats: its direction, with full recomputation, MoE, frozen."""
        recomputes = direction == "backward" and self.plan.recomputes(layer)
        key = (f"{direction}+recompute" if recomputes else direction) + ("+moe" if self.moe_layers[layer] else "")
        if self.frozen_work is not None and direction == "backward" and self.plan.peft.layer_frozen(layer):
            key += "+frozen"
        return key

    def _stamp(self, chain: Chain, mb: int, layer: int, after: int | None) -> int | None:
        """Emits a recorded chain again for ``layer`` of micro-batch ``mb`` after ``after`` (``Chain.stamp``; a lazy
        graph keeps a record instead). Returns its last task."""
        after, self.blocking_tp = self.g.stamp(chain, mb, layer, after, self.blocking_tp)
        return after

    def _record(self, first: int) -> Chain:
        """The chain of the tasks emitted from task ``first`` on (one layer), to stamp for the next layers."""
        protos, chains = self.g.tasks[first:], self.g.chains
        chains.append(Chain([self._stamp_entry(task) for task in protos], protos, self.rank, self.stage, len(chains)))
        return chains[-1]

    def _stamp_entry(self, task: Task) -> tuple:
        """What stamping repeats of a recorded task: its fields, then its chain rule (``_flagged``; default: after
        the task before it on another stream, takes the blocking TP collective) decided once: ``prev``, the
        ``extra`` offsets, whether it waits for the blocking TP collective (a compute task that ``touch``-es it),
        whether it becomes the blocking one (a consumed collective, or any TP collective when Megatron's are
        synchronous), whether it needs a rendezvous key, and its stream list's ``append``."""
        prev, touch, extra, blocking = self.flags.get(task.id, (True, True, (), False))
        blocks = blocking or (touch and task.stream == "tp" and self.tp_blocks)
        return (task.stream, task.kind, task.name, task.duration, task.op, task.nbytes, task.flops, task.group,
                task.skew, prev, extra, touch and task.stream == "compute", blocks,
                bool(task.op) and self.g.match_collectives, self.g.streams[(self.rank, task.stream)].append)

    def _selective_recompute(self, block: str, moe: bool, mb: int, layer: int, after: int | None) -> int | None:
        """What selective recomputation replays before ``block``'s backward (``training.recompute_modules``,
        Megatron-Core): before attention's, the attention core, input norm and MLA up projections
        (``step.Blocks.recompute``); before a dense MLP's, the pre-MLP norm and, with module ``mlp``, the MLP
        module with its sequence-parallel all-gather and reduce-scatter (tensor_parallel.checkpoint reruns
        the module's forward, collectives included); before a MoE layer's, with module ``moe``, its whole forward,
        dispatch and combine included (moe_layer.py checkpoints custom_forward), else its pre-MLP norm. A MoE
        layer's ``moe_act`` and ``shared_experts`` replay inside its backward (``MoeLayerEmitter.backward``)."""
        if block == "attention":
            work = self.recompute_work["attention"]
            name = "attention_core" if self.modules == {"core_attn"} else "attention_recompute"
            return self._compute("recompute", name, mb, layer, work, after)
        if moe:
            if "moe" in self.modules:
                return self.moe.forward("recompute", mb, layer, after)
            return self._compute("recompute", "moe_router", mb, layer, self.moe.recompute["moe_router"], after)
        if "mlp" not in self.modules:
            return self._compute("recompute", "mlp", mb, layer, self.recompute_work["mlp"], after)
        after = self._tp(self.tp_before, mb, layer, after)
        after = self._compute("recompute", "mlp", mb, layer, self.recompute_work["mlp"], after)
        return self._tp(self.tp_after, mb, layer, after)

    def weight_grad(self, mb: int, chunk: int) -> None:
        """The weight-gradient pass (W) of zero-bubble schedules: GEMMs only, no communication."""
        g, last = self._global_chunk(chunk), self.p * self.v - 1
        after: int | None = None
        if g == last:
            after = self._compute("weight", "lm_head", mb, -1, self.head_work, after, "weight_grad")
        for layer in reversed(self._layers(chunk)):
            after = self.grad_ready[layer] = self._weight_layer(mb, layer, after)  # type: ignore[assignment]
        if g == 0:
            after = self.grad_ready[-1] = self._compute("weight", "embedding", mb, -1, self.embed_work, after,
                                                        "weight_grad")  # type: ignore[assignment]
        self.tail = after

    def _weight_layer(self, mb: int, layer: int, after: int | None) -> int | None:
        """One layer's weight-gradient GEMMs, returning the last. Like a layer's forward and backward
        (``_layer_tasks``), every layer of a kind (MoE or dense, frozen or trained) emits the same chain unless
        pending dependencies or jitter tell layers apart, so the first is recorded and the others stamped (a
        zero-bubble pass is a third of a stage's compute tasks)."""
        moe = self.moe_layers[layer]
        frozen = not moe and self.frozen_work is not None and self.plan.peft.layer_frozen(layer)
        chain_key = "weight" + ("+moe" if moe else "") + ("+frozen" if frozen else "")
        stampable = not self.pending_deps and self.fixed_durations
        chain = self.chains.get(chain_key) if stampable else None
        if chain is not None:
            return self._stamp(chain, mb, layer, after)
        first = len(self.g.tasks)
        if moe:  # the routed and shared experts' and the router's weight gradients
            for name in ("moe_experts", "moe_shared", "moe_router"):
                after = self._compute("weight", name, mb, layer, self.moe.work[name], after, "weight_grad")
            after = self._compute("weight", "attention", mb, layer, self.block_work["attention"], after,
                                  "weight_grad")
        else:
            work = self.frozen_work[0] if self.frozen_work is not None and frozen else self.trained_work[0]
            for block in ("mlp", "attention"):
                after = self._compute("weight", block, mb, layer, work[block], after, "weight_grad")
        if stampable and not self.pending_deps:
            self.chains[chain_key] = self._record(first)
        return after

def _reads_first(chain: Chain) -> bool:
    """Whether a chain's first task is not a weight gather (``_StageEmitter._first_reading`` would pass it)."""
    return chain.stream not in (NCCL_STREAM, EXPERT_DP_STREAM)


def folds_tp(plan: Plan) -> bool:
    """Whether ``ranks: all`` may simulate one process per TP group: its ranks run the same tasks at the same
    times unless something tells them apart: a straggler or jitter on one of them, or a degraded link on one
    member's rail (its DP transfers would then run at their own pace)."""
    scenario = plan.scenario
    v = scenario.variation
    return (scenario.ranks == "all" and scenario.fold_tp and plan.tp > 1 and not v.slowdown
            and not v.jitter and not v.links)


def lazy_builds(plan: Plan) -> bool:
    """Whether ``build(plan, lazy=True)`` keeps stamped chains as records: in slice mode (``ranks: all`` hands out
    rendezvous keys in stamping order) unless a DualPipe F&B pair of MoE layers is interleaved, which reorders
    its tasks in their stream lists after they are emitted (``_StageEmitter._interleave_pair``)."""
    scenario = plan.scenario
    if scenario.ranks == "all":
        return False
    orders = _actions(plan.schedule, plan.pp, plan.microbatches, plan.vpp)
    return not (plan.is_moe and any(action.with_next for actions in orders for action in actions))


@lru_cache(maxsize=64)
def _actions(schedule: Schedule, p: int, m: int, v: int) -> tuple[tuple[Action, ...], ...]:
    """Each stage's ordered actions (``Schedule.actions``), kept per (schedule, p, m, v): a search confirms many
    layouts of one pipeline shape in a process, and ZB-H2's order is a unit-time simulation of its own (about
    0.4 s at p 16, m 96; 175B search, 2026-11-25). Actions are frozen; the tuples keep the orders from being
    changed by a caller."""
    return tuple(tuple(stage) for stage in schedule.actions(p, m, v))


def build(plan: Plan, fold: bool | None = None, stamp: bool = True, lazy: bool = False) -> TaskGraph:
    """The task graph; under ``ranks: all`` TP groups are folded into one process each when ``fold`` (default:
    whenever ``folds_tp``), which gives the same times with 1/tp of the tasks (tested). ``stamp=False`` emits
    every layer one by one instead of stamping the first layer's chain (the same graph; for tests). ``lazy``
    keeps stamped chains as records (``TaskGraph.lazy``; ``materialize`` makes their tasks) where ``lazy_builds``
    allows it, else builds eagerly."""
    scenario = plan.scenario
    fold = folds_tp(plan) if fold is None else fold and folds_tp(plan)
    p, m, v = plan.pp, plan.microbatches, plan.vpp
    orders = _actions(plan.schedule, p, m, v)
    graph = TaskGraph(match_collectives=scenario.ranks == "all", lockstep=plan.tp if fold else 1,
                      lazy=lazy and lazy_builds(plan))
    costs = make_costs(plan)
    grid = plan.grid
    tp_ranks = range(1 if fold else grid.tp)
    replicas = ([(t, d, c) for d in range(grid.dp) for c in range(grid.cp) for t in tp_ranks]
                if scenario.ranks == "all" else [(0, 0, 0)])
    variation = scenario.variation
    priced: dict[tuple[str | None, float], CostModel] = {(None, 1.0): costs}

    def costs_for(rank: int) -> CostModel:
        gpu, scale = key = (variation.gpus.get(grid.node(rank)), variation.compute_scale(rank))
        if key not in priced:
            base = priced.get((gpu, 1.0))
            if base is None:  # a node of another GPU type (the scenario's own, None, is priced above)
                assert gpu is not None
                base = priced[(gpu, 1.0)] = make_costs(plan, GPU_PRESETS[gpu])
            priced[key] = base if scale == 1.0 else ScaledCosts(base, scale)
        return priced[key]

    for tp_rank, dp_rank, cp_rank in replicas:  # one pipeline: its p stages, linked by sends
        sends: dict[tuple[str, int, int], int] = {}
        ranks = [grid.rank(tp_rank, dp_rank, stage, cp_rank) for stage in range(p)]
        emitters = [_StageEmitter(graph, plan, costs_for(rank), rank, sends, stamp) for rank in ranks]
        for emitter, actions in zip(emitters, orders, strict=True):
            run = {"F": emitter.forward, "B": emitter.backward, "W": emitter.weight_grad}
            for action in actions:
                if action.with_next and emitter.unit_first is None:
                    emitter.open_unit()
                if emitter.unit_first is not None:
                    emitter.unit_passes.append((action.phase, len(graph.tasks)))
                run[action.phase](action.microbatch, action.chunk)
                if not action.with_next and emitter.unit_first is not None:
                    emitter.close_unit()
            emitter.dp.finish()
        # Cross-stage dependencies: a micro-batch's first task on a chunk waits for its neighbour chunk's send.
        for emitter in emitters:
            for task_id, key in emitter.waits:
                graph.add_dependency(task_id, sends[key])
            # An emitter and its helpers (dp, moe, cp) point at each other, and it holds the graph: left as they
            # are, the graph of a finished run waits for Python's cycle collector, whose pass over its 10^5 tasks
            # cost a sweep ~0.1 s per point (175B layouts, 2026-11-25). Dropping the emitter's attributes breaks
            # the cycles, so the graph is freed as soon as its last user lets go.
            vars(emitter).clear()
    graph.freeze()  # last, after every edge (the cross-stage ones above included)
    return graph
