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
The graph's types live in sim.workload.ir. The stage emitter is a stack of classes, one concept per module, each
extending the one below: the rank's state and task helpers (sim.workload.task_emit), a block with its TP
collectives (block_emit), recorded chains and their stamps (chain_emit), a layer's pass with recomputation, offload
and the MoE host sync (layer_emit); this module adds the passes of the schedule's actions (forward, backward,
weight gradients), their sends and issued units, whose DualPipe F&B pairs are interleaved by
sim.workload.pair_interleave, and ``build``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from sim.costs.models import ComputePhase, CostModel, ScaledCosts
from sim.hardware.gpus import GPU_PRESETS
from sim.parallel.chunks import upstream
from sim.parallel.schedules import Action, Schedule
from sim.plan import Plan
from sim.workload.chain_emit import reads_first
from sim.workload.cost_model import make_costs
from sim.workload.ir import EXPERT_DP_STREAM, HOST_STREAM, NCCL_STREAM, TaskGraph
from sim.workload.layer_emit import LayerEmitter
from sim.workload.pair_interleave import interleave_pair


class _StageEmitter(LayerEmitter):
    """Emits the tasks of one simulated rank (one pipeline stage, all of its model chunks); a MoE layer's MLP part
    through ``moe`` (sim.workload.moe_emit), the attention block under context parallelism through ``cp``
    (sim.workload.cp_emit), data-parallel communication through ``dp`` (sim.workload.data_parallel)."""

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
                if mb and reads_first(fused[0]):
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

    def _wait_upstream(self, first_task: int, phase: Literal["F", "B"], g: int, mb: int) -> None:
        """The pass's first task waits for the send of the pass it needs on a neighbouring chunk
        (sim.parallel.chunks.upstream; on its own chunk the stream order already holds it)."""
        needs = upstream(phase, g, mb, self.p * self.v - 1)
        if needs is not None and needs[1] != g:
            self.waits.append((first_task if self.unit_first is None else self.unit_first, needs))

    def _send(self, phase: str, chunk: int, mb: int, to_global_chunk: int, after: int | None,
              host: int | None = None) -> None:
        """The send of a pass's output to ``to_global_chunk``, after ``after`` (and the host task ``host``: the host
        issues it there, ``close_unit``)."""
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
        if host is not None:
            also.append(host)
        task = self._add("pp", "pp", name, mb, -1, after, also, op="send", nbytes=self.p2p_bytes, group=group)
        self.sends[(phase, g, mb)] = task
        if self.p2p_blocks:
            # Megatron-LM's _communicate waits on every isend/irecv request before returning, so the stage launches
            # nothing more until its send completes (parallel.overlap_p2p_comm: false; docs/mechanisms/p2p_wait.md).
            self.blocking_tp = task

    def open_unit(self) -> None:
        """Starts a unit of passes issued together (``Action.with_next``): DualPipe's ``_forward_backward_chunk``
        receives all inputs, then computes, then sends (dualpipe.py, around ``_commit_and_wait_comm``)."""
        self.unit_first = len(self.g.tasks)

    def close_unit(self) -> None:
        """Ends the unit: an F&B pair of MoE layers is interleaved (sim.workload.pair_interleave), then the sends of its
        passes leave, in issue order, after its last task (DualPipe's ``_forward_backward_chunk`` sends after the
        pair). Under Megatron's combined 1F1B (``moe.a2a_overlap``) the forward's send leaves once the forward's
        own last task is done, beside the backward's last block: ``TransformerModelChunkSchedulePlan.run`` issues
        ``post_forward`` (send_forward_recv_forward) on the communication stream waiting only for the forward's
        event, "so the p2p comm could be overlapped with the pre_dispatch backward" (Megatron-LM d98e8a64dd,
        models/common/model_chunk_schedule_plan.py). The host calls it only after the layer loop, once it has
        issued the backward's last attention node too (f3e6c5, the Qwen3 overlap row's code:
        ``schedule_chunk_1f1b`` in models/gpt/fine_grained_schedule.py calls ``layer_pre_backward()`` before
        ``post_forward``), so the send also waits for the unit's last host issue (``moe_host_issue``, the host
        stream): later than the forward's end where the pair is host-bound, the same where it is device-bound."""
        passes, self.unit_passes = self.unit_passes, []
        phases = [phase for phase, _ in passes]
        if self.plan.is_moe and phases[:2] == ["F", "B"]:
            end = passes[2][1] if len(passes) > 2 else len(self.g.tasks)
            tail = interleave_pair(self.g, self.rank, passes[0][1], passes[1][1], end)
            if tail is not None:
                self.tail = tail
        first, self.unit_first = self.unit_first, None
        sends, self.unit_sends = self.unit_sends, []
        blocking = self.blocking_tp
        issued = self.g.streams.get((self.rank, HOST_STREAM))
        host = issued[-1] if issued and first is not None and issued[-1] >= first else None  # the unit's last
        for phase, chunk, mb, to_global_chunk, after, owed in sends:
            early = phase == "F" and self.plan.a2a_overlap
            self.blocking_tp = owed if early else blocking
            self._send(phase, chunk, mb, to_global_chunk, after if early else self.tail, host if early else None)
        self.blocking_tp = blocking



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
    its tasks in their stream lists after they are emitted (sim.workload.pair_interleave)."""
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

