"""A layer's pieces priced: the estimator's state, and the blocks with their TP and CP collectives.

In: a ``Scenario`` (the cost model and network are made from its Plan unless given) and, per call, a ``Plan``. Out:
``BlockPricing``, the base of the ``Estimator`` stack (sim.explore.estimate): the cost model, the network (and the
flow-level one under ``contention``) and every cache the stack keeps; the seconds of one piece of a layer (a block, its
column- or row-parallel GEMMs, the selective core, the embedding, the head: ``_price``, cached by shape); the loss's TP
collectives; what selective recomputation adds to a dense layer's backward; a frozen layer's backward; context
parallelism's exposed ring (``_cp_exposed``); one pipeline send (``_p2p``); a data-parallel collective, lockstep TP
ranks' groups sharing the fabric on the flow-level network (``_dp_collective``); TE userbuffers' chunked collectives
beside their GEMMs and AsyncTP's fused ones (``_chunked_forward``); Megatron's asynchronous backward
(``_overlapped_backward``). The compute stream waits for Megatron's TP collectives (Narayanan et al. SC21 Sec. 3.3),
except the backward's input-gradient reduction, which hides under the column-parallel weight gradient.
"""

from __future__ import annotations

from typing import Any

from sim.costs.models import ComputePhase, CostModel, Work
from sim.explore.estimate_keys import _fsdp_grad_key
from sim.explore.estimate_records import _LayerTimes, _ShapeParts, _StageShape, _TailShape, _Timing
from sim.explore.stage_replay import StageTimes, Unit
from sim.network import models as network_models
from sim.network.flows import FlowNetwork
from sim.parallel.context import ring_makespan
from sim.parallel.grid import lockstep_groups
from sim.parallel.schedules import Action
from sim.plan import Plan, resolve
from sim.runner import build_topology
from sim.spec.scenario import Scenario
from sim.workload import step


class BlockPricing:
    """The estimator's state and caches, and a layer's pieces priced (the base of sim.explore.estimate's
    ``Estimator``)."""

    def __init__(self, scenario: Scenario, costs: CostModel | None = None,
                 network: network_models.Network | None = None) -> None:
        plan = resolve(scenario)
        self.costs = costs or step.make_costs(plan)
        spec = scenario.network
        contention = spec.model == "contention"
        # the cluster's topology (built once per cluster, sim.runner), only where a network model is made here
        self.net = network or network_models.make("analytic" if contention else spec.model, build_topology(plan),
                                                  spec.algorithm, spec.protocol, plan.deepep_traffic)
        self.flows: network_models.FlowLevelNetwork | None = (
            network_models.ContentionNetwork(build_topology(plan), spec.algorithm, spec.protocol,
                                             plan.deepep_traffic)
            if contention else None)
        self._compute: dict[Any, float] = {}
        self._concurrent: dict[Any, float] = {}
        self._blocks: dict[Any, step.Blocks] = {}
        self._moe_blocks: dict[Any, dict[str, Work]] = {}
        self._orders: dict[tuple[str, int, int, int, bool], tuple[int, list[Unit]]] = {}
        self._trailing: dict[tuple[str, int, int, int, bool], tuple[tuple[tuple[int, int, int], ...], ...]] = {}
        self._schedule_actions: dict[tuple[str, int, int, int, bool], list[list[Action]]] = {}
        self._replays: dict[Any, tuple[float, list[float]]] = {}
        self._stage_times: dict[Any, tuple[list[StageTimes], tuple[float, list[float]], float, _Timing, Any]] = {}
        self._shape_parts: dict[Any, _ShapeParts] = {}
        self._tail_shapes: dict[Any, tuple[_TailShape, Scenario]] = {}
        self._layers: dict[Any, tuple[_LayerTimes, Scenario]] = {}
        self._structures: dict[Any, tuple[tuple[list[_StageShape], list[int]], Scenario]] = {}
        self._sends: dict[tuple[float, int, int], float] = {}
        self._tail_kinds: dict[tuple[Any, ...], int] = {}
        self._flops: dict[Any, tuple[float, int, float, Any]] = {}
        self._unit_gathers: dict[Any, tuple[list[list[list[float]]], Scenario]] = {}
        # per shape, each stage that may peak: (stage, the resident parts' sum (footprint.parts_total), gathered
        # weights, unreduced gradients); per activations key, those stages' activations
        self._memory_states: dict[Any, tuple[list[tuple[int, float, float, float]], Any]] = {}
        self._activations: dict[Any, list[float]] = {}
        self._stashes: dict[Any, float] = {}
        self._peak_stages: dict[Any, tuple[list[int], Any]] = {}  # the stages that may peak, per structure
        self._units: dict[Any, tuple[list[step.ChunkUnit], Scenario]] = {}
        self._shape_of: tuple[Plan | None, tuple[Any, ...]] = (None, ())  # the last plan _price saw, its shape

    def _price(self, plan: Plan, what: str, phase: ComputePhase) -> float:
        """Seconds of one piece of a layer (a block, its column-parallel GEMMs ``<block>_column``, the
        ``selective`` attention core) or the ``embedding`` / ``head`` (sim.workload.step.Blocks), cached by shape."""
        if plan is self._shape_of[0]:  # a layout's pieces are priced one after another: its shape found once
            shape = self._shape_of[1]
        else:
            t = plan.scenario.training
            shape = (plan.micro_batch, plan.seq_len, plan.tp, plan.sequence_parallel, t.flash_attention,
                     t.fused_kernels, t.causal_attention, plan.recompute_modules, plan.cp, plan.cp_comm_type,
                     plan.attention_work, plan.peft.method, plan.dtype, step.fp8_casts(plan), _fsdp_grad_key(plan),
                     step.tp_overlap_chunks(plan), step.tp_overlap_chunk_gemms(plan), t.cross_entropy)
            self._shape_of = (plan, shape)  # holding the plan keeps its id from being reused
        key = (what, phase, shape)
        if key not in self._compute:
            if shape not in self._blocks:  # one layer's ops per shape, for all its pieces and phases
                self._blocks[shape] = step.blocks(plan)
            self._compute[key] = self.costs.compute_time(_work(self._blocks[shape], what), phase)
        return self._compute[key]

    def _loss_comm(self, plan: Plan) -> float:
        """Seconds of the loss's blocking TP collectives after the head's forward (step.loss_collectives; 0 unless
        Megatron's unfused loss runs under TP), on the compute stream's path as the emitter orders them."""
        group = plan.grid.tp_group(0)
        return sum(self.net.collective_time(op, nbytes, group) for op, nbytes in step.loss_collectives(plan))

    def _selective_dense(self, plan: Plan, tp_comm: float) -> float:
        """Seconds selective recomputation adds to a dense layer's backward (the emitter's
        ``_selective_recompute``): the replayed attention-side ops, the pre-MLP norm, and with module ``mlp`` the
        MLP module with its TP collectives."""
        if not plan.recompute_modules:
            return 0.0
        mlp = self._price(plan, "recompute_mlp", "forward") + (tp_comm if "mlp" in plan.recompute_modules else 0.0)
        return self._price(plan, "recompute_attention", "forward") + mlp

    def _frozen_layer(self, plan: Plan, bwd: ComputePhase, tp_comm: float,
                      split: bool) -> tuple[float, float] | None:
        """(backward, weight-gradient pass) of a layer ``training.method: frozen`` freezes: its linears run their
        input gradients only, so no asynchronous reduction hides under a weight gradient (step.frozen_layer_blocks,
        as the emitter runs it). None without such layers."""
        work = step.frozen_layer_blocks(plan)
        if work is None:
            return None
        block, _ = work
        backward = sum(self.costs.compute_time(block[b], bwd) for b in step.BLOCKS) + 2 * tp_comm
        weight = sum(self.costs.compute_time(block[b], "weight_grad") for b in step.BLOCKS) if split else 0.0
        return backward, weight

    def _cp_exposed(self, plan: Plan, bwd: ComputePhase) -> tuple[float, float]:
        """(forward, backward) seconds one layer's context parallelism adds to its attention block's flash kernel,
        as the workload emits it (``_StageEmitter._cp_core``): the ring's makespan (sim.parallel.context.
        ring_makespan: a send is exposed where it outlasts its step; the steps with TE's output corrections) less
        the flash kernel, or the all-gather / all-to-all collectives, which nothing overlaps. (0, 0) without CP."""
        ca = step.context_attention(plan)
        if ca is None:
            return 0.0, 0.0
        group = plan.grid.cp_group(0)
        out = []
        for moves, phase in ((ca.forward, "forward"), (ca.backward, bwd)):
            if plan.cp_comm_type != "p2p":
                out.append(sum(network_models.transfer_time(self.net, m.op, m.nbytes, group) for m in moves))
                continue
            blocks = [self.costs.compute_time(work, phase) for work in ca.steps]  # type: ignore[arg-type]
            sends = [self.net.p2p_time(m.nbytes, group[0], group[1]) for m in moves]
            # The attention block prices the core as one kernel; the ring's steps replace it (their kernels are
            # smaller, so on a measured attention curve they run at a lower rate than the whole one).
            core = self.costs.compute_time(ca.core, phase)  # type: ignore[arg-type]
            out.append(ring_makespan(blocks, sends, backward=phase != "forward") - core)
        return out[0], out[1]

    def _p2p(self, plan: Plan) -> float:
        """One pipeline send between neighbouring stages (0 without pipeline parallelism), priced once per
        (bytes, sender, receiver)."""
        if plan.pp == 1:
            return 0.0
        rank = plan.grid.stage_representative
        key = (plan.p2p_bytes, rank(0), rank(1))
        if key not in self._sends:
            self._sends[key] = self.net.p2p_time(*key)
        return self._sends[key]

    def _dp_collective(self, plan: Plan, op: str, nbytes: float, group: tuple[int, ...],
                       concurrent: tuple[tuple[int, ...], ...] | None = None) -> float:
        """A data-parallel collective's time. On the flow-level network every TP rank's DP group runs the same
        collective at once (they are in lockstep) and may share NICs, leaf uplinks and the spine: one static
        max-min share of all their channels (sim.network.flows) stretches each channel, and the slowest gives the
        time. ``concurrent``: every group that runs it at once, where more than ``group``'s TP peers do."""
        if self.flows is None:  # a step's buckets repeat a few sizes, and layouts share groups: price each once
            alone = (op, nbytes, (group,))
            if alone not in self._concurrent:
                self._concurrent[alone] = self.net.collective_time(op, nbytes, group)
            return self._concurrent[alone]
        groups = concurrent or lockstep_groups(group, plan.tp)
        key = (op, nbytes, groups)
        if key not in self._concurrent:
            seconds = 0.0
            for phases in zip(*(self.flows.transfer(op, nbytes, g) for g in groups), strict=True):
                flows = FlowNetwork(self.flows.capacities)
                channels = [ch for phase in phases for ch in phase.channels]
                for index, channel in enumerate(channels):
                    flows.add(index, channel.loads, channel.nbytes, channel.rate_cap, 0.0)
                slowest = max((ch.nbytes / flows.flows[i].rate for i, ch in enumerate(channels)), default=0.0)
                seconds += max(phase.latency for phase in phases) + slowest
            self._concurrent[key] = seconds
        return self._concurrent[key]

    def _chunked_collectives(self, plan: Plan) -> tuple[tuple[float, float], tuple[float, float]] | None:
        """Under TE's userbuffers (``step.tp_overlap_chunks``): ((first chunk, the other chunks) of the all-gather,
        (last chunk, the other chunks) of the reduce-scatter) in seconds, each chunk priced at its own size;
        None where the TP collectives are not chunked."""
        n = step.tp_overlap_chunks(plan)
        if not n:
            return None
        group = plan.grid.tp_group(0)
        gather, reduce = step.tp_ops(plan)
        assert gather is not None and reduce is not None

        def parts(op: str) -> tuple[float, float]:
            return (self.net.collective_time(op, plan.tp_bytes / n, group),
                    self.net.collective_time(op, plan.tp_bytes * (n - 1) / n, group))

        return parts(gather), parts(reduce)

    def _chunked_forward(self, plan: Plan, block: str, phase: ComputePhase,
                         chunked: tuple[tuple[float, float], tuple[float, float]]) -> float:
        """A block's forward under TE's userbuffers (the workload's ``_chunked_block``): the gather's first chunk,
        the block up to its row-parallel GEMM beside the gather's other chunks, the row GEMM beside the
        reduce-scatter's chunks but the last (which wait for the gather's on the TP stream), then the last."""
        (gather_head, gather_body), (reduce_tail, reduce_body) = chunked
        total, row = self._price(plan, f"{block}_chunked", phase), self._price(plan, f"{block}_chunked_row", phase)
        pre = total - row
        summed = step.reduce_partials_seconds(plan, self.costs)  # AsyncTP's reduction after the last chunk
        if step.async_tp(plan) and row > 0 and not (block == "attention" and plan.cp > 1):
            # the workload's _async_tp_block: shard copy, the fused GEMMs' chunks beside the remote shards' copies
            # and their last after them, the rest of the block, the row GEMM's first chunk, its others beside the
            # reduce-scatter's copies, the reduction
            n = step.tp_overlap_chunks(plan)
            column = self._price(plan, f"{block}_chunked_column", phase)
            row = step.beside_reduce_scatter(plan, row)
            return (step.fused_gather_seconds(step.shard_copy_seconds(plan, self.costs), column, gather_body, n)
                    + (pre - column) + step.fused_scatter_seconds(row, reduce_body, summed, n))
        total = pre + step.beside_reduce_scatter(plan, row)  # the row GEMM on the SMs the reduce-scatter leaves
        return gather_head + max(total, max(pre, gather_body) + reduce_body) + reduce_tail + summed

    def _regather(self, plan: Plan) -> float:
        """SP's second all-gather of a block's input when it runs exposed between the block's input- and
        weight-gradient GEMMs (``step.regathers_after_input_grad``: the workload's ``_serial_backward``), else 0."""
        if not step.regathers_after_input_grad(plan, self._price(plan, "mlp_column", "weight_grad")):
            return 0.0
        return self.net.collective_time("all_gather", plan.tp_bytes, plan.grid.tp_group(0))

    def _overlapped_backward(self, plan: Plan, block: str, times: list[float],
                             chunked: tuple[tuple[float, float], tuple[float, float]] | None = None) -> float:
        """A block's fused backward with Megatron's asynchronous TP collectives (the workload's
        ``_overlapped_backward``): the column-parallel GEMM's weight gradient hides the input-gradient reduction,
        and with SP the input all-gather runs beside the input-gradient GEMMs; under TE's userbuffers
        (``chunked``) the output gradient's gather exposes its first chunk, its others run before that all-gather
        on the TP stream."""
        weight = self._price(plan, f"{block}_column", "weight_grad")
        dgrad = self._price(plan, block, "backward") - weight
        if (chunked is not None and step.async_tp(plan) and not (block == "attention" and plan.cp > 1)
                and self._price(plan, f"{block}_row", "input_grad") > 0):
            # the workload's _async_tp_backward: the output gradient's gather fused with the row GEMM's input
            # gradient, the rest (its weight gradient too), the column GEMMs' input gradient fused with the
            # reduce-scatter, their weight gradient
            (_, gather_body), (_, reduce_body) = chunked
            n = step.tp_overlap_chunks(plan)
            row, column = (self._price(plan, f"{block}_chunked_{part}", "input_grad") for part in ("row", "column"))
            rest = dgrad - self._price(plan, f"{block}_row", "input_grad") - self._price(plan, f"{block}_column",
                                                                                          "input_grad")
            return (step.fused_gather_seconds(step.shard_copy_seconds(plan, self.costs), row, gather_body, n) + rest
                    + step.fused_scatter_seconds(column, reduce_body, step.reduce_partials_seconds(plan, self.costs),
                                                 n) + weight)
        if chunked is not None:
            (head, body), _ = chunked
            gather, reduce = times
            return head + max(dgrad, body + gather) + max(reduce, weight) + step.reduce_partials_seconds(plan,
                                                                                                      self.costs)
        if plan.sequence_parallel:
            gather, reduce = times
            return gather + max(dgrad, gather) + max(reduce, weight)
        return dgrad + max(times[0], weight)


def _work(pieces: step.Blocks, what: str) -> Work:
    """The ``Work`` a priced piece names: a block, its column-parallel GEMMs, the selective core, embedding, head."""
    if what in pieces.block:
        return pieces.block[what]
    if what.endswith("_chunked_row"):  # the forward beside TE's chunked collectives (step.chunk_gemms)
        name = what.removesuffix("_chunked_row")
        return pieces.chunked_row.get(name, pieces.row[name])
    if what.endswith("_chunked_column"):
        name = what.removesuffix("_chunked_column")
        return pieces.chunked_column.get(name, pieces.column[name])
    if what.endswith("_chunked"):
        name = what.removesuffix("_chunked")
        return pieces.chunked.get(name, pieces.block[name])
    if what.endswith("_column"):
        return pieces.column[what.removesuffix("_column")]
    if what.endswith("_row"):
        return pieces.row[what.removesuffix("_row")]
    if what.startswith("recompute_"):
        return pieces.recompute[what.removeprefix("recompute_")]
    return {"selective": pieces.selective, "embedding": pieces.embedding, "head": pieces.head}[what]
