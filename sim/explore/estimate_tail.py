"""A stage's data-parallel tail after its last backward, and its optimizer step.

In: ``PipelineComposition`` (the network, the caches, ``_dp_collective``) and a ``Plan``; per stage its ``StageTimes``
and when its last backward ends. Out: ``DataParallelTail``: a stage's tail shape (``_tail_shape``, kept per
``_shape_key``): its gradient buckets (DDP and ZeRO-1/2 buckets, ZeRO-3 / FSDP units, FSDP + PP's chunk units) with
their collectives' seconds, in the order its backward frees them, and its optimizer step with the gradient checks and
ZeRO-1/2's final weight all-gather; its exposed tail (``_tail``): the buckets on one stream, each as soon as its
gradients are final, ZeRO-2/3's per-micro-batch reduce-scatters, DualPipe's copy all-reduce, a MoE stage's expert
buckets on their own stream (``_expert_tail``).
"""

from __future__ import annotations

from typing import Any

from sim.explore.estimate_pipeline import PipelineComposition
from sim.explore.estimate_records import _ShapeParts, _TailShape, _Timing
from sim.explore.stage_replay import StageTimes
from sim.plan import Plan
from sim.workload import step


class DataParallelTail(PipelineComposition):
    """A stage's exposed data-parallel tail and optimizer step (a base of sim.explore.estimate's ``Estimator``)."""

    def _tail(self, plan: Plan, stage: int, st: StageTimes, backward_end: float, shape: _TailShape,
              timing: _Timing, parts: _ShapeParts) -> tuple[float, float]:
        """(exposed data-parallel time after the last backward, optimizer + weight all-gather) of a stage, whose
        tail, apart from its times, is ``shape`` (``_tail_shape``); ``timing`` and ``parts``: the layout's facts
        its stage times and its shape decide (read there, not from ``plan``, which the screen builds per layout)."""
        exposed = 0.0
        if parts.data_parallel:
            # when each layer's gradients become final: the last local chunk's backward ends first, each layer
            # one layer_backward after the one before it. Under a split backward (zero-bubble schedules) they are
            # final only after the last micro-batch's weight-gradient pass: WeightGradStore.pop runs the stored
            # weight-gradient GEMMs there, which accumulate into main_grad (Megatron-LM megatron/core/
            # tensor_parallel/weight_grad_store.py; Qi et al. 2024, Sec. 2), and a bucket cannot be reduced before
            # its gradients exist (the emitter's weight_grad sets grad_ready), so the buckets start inside W;
            # each local chunk's last W is followed by the passes Estimator._after_last_weight counts.
            interleaved, vpp, pp = timing.interleaved, timing.vpp, timing.pp
            when: dict[int, float] = {}
            at = backward_end - st.backward
            after_weight = timing.after_weight[stage] if timing.after_weight is not None else None
            for c, layers in shape.chunks:
                if interleaved:  # chunk c's last backward ran c*p chunk-passes before the stage's end
                    at = backward_end - st.backward / vpp * (1 + c * pp)
                elif after_weight is not None:  # chunk c's last W, then the passes the order runs after it
                    f, b, w = after_weight[c]
                    at = backward_end - (f * st.forward + b * st.backward + (w + 1) * st.weight) / timing.local_chunks
                for layer in layers:
                    at += st.layer_backward
                    when[layer] = at
            if shape.embedding:  # the embedding's gradients, with the stage's first layer's
                when[-1] = at
            if shape.after_backward:  # Megatron-LM's default: one bucket per model chunk, after the whole backward
                when[-2] = backward_end
            for c in shape.unit_chunks:  # FSDP + PP: chunk c's last backward ends c*p chunk-passes before the stage's
                when[-10 - c] = backward_end - (st.backward / vpp * c * pp if interleaved else 0.0)
            free_at = 0.0
            for layer, seconds in shape.buckets:  # on one stream, each as soon as its gradients are final
                ready = when[layer]
                free_at = (ready if ready > free_at else free_at) + seconds  # max(free_at, ready), inline
            # ZeRO-3/FSDP: the group's one stream ran the units' reduce-scatters beside their gathers, and the
            # backward already holds what the compute could not hide of both (_sharded_unit_overhead): the last
            # buckets' reductions are exposed only past that (DeepSpeed ZeRO-3's 842 MB last bucket on llama2-7b
            # spine pp 1 was counted twice: +3.1%)
            exposed = max(0.0, free_at - backward_end - st.unit_comm)
            if shape.experts:  # expert gradients: their own buckets and stream, over edp
                exposed = max(exposed, self._expert_tail(plan, stage, when, backward_end))
            m = timing.microbatches
            if parts.zero_stage >= 2 and m > 1 and not parts.pipelined_fsdp:
                # ZeRO-2/3 reduce-scatter every micro-batch's gradients: m times the buckets on one stream,
                # from the first backward on. When that is longer than the backward passes, it sets the end.
                first_backward = backward_end - (m - 1) * (st.forward + st.backward + st.weight) - st.backward
                exposed = max(exposed, first_backward + m * shape.per_microbatch - backward_end)
            if parts.zero_stage >= 2 and not plan.scenario.parallel.overlap_grad_reduce and parts.stages_zero is None \
                    and not parts.pipelined_fsdp:
                # DeepSpeed overlap_comm false: every micro-batch's reductions run on the compute stream, each
                # between two backward kernels, so all of them lengthen the step (the emitter's _reduce). Where
                # units are gathered per layer the stage times hold them (_sharded_unit_overhead); FSDP + PP
                # reduces once, after a chunk's last backward (the buckets above)
                exposed = m * shape.per_microbatch
        if shape.copies is not None:  # DualPipe: the two model copies' gradients summed after the backward
            exposed += shape.copies
        return exposed, shape.optimizer

    def _tail_shape(self, plan: Plan, stage: int, stat_reduce: float, shape_key: tuple[Any, ...]) -> _TailShape:
        """The part of a stage's tail its times do not change: the order its gradients become final, its gradient
        buckets (or units) with each one's collective time, and its optimizer step. Layouts that differ only in
        micro-batch size, recomputation or sequence parallelism share it (``_shape_key``) and the order in which
        its local chunks' gradients become final (``_chunk_order``: with a split backward it may change with m)."""
        chunk_order = self._chunk_order(plan, stage) if plan.local_chunks > 1 else (0,)
        key = (shape_key, stage, chunk_order)
        found = self._tail_shapes.get(key)
        if found is not None:
            return found[0]
        zero = plan.zero_stage
        grad_elem = plan.grad_bytes_per_param
        chunks: list[tuple[int, tuple[int, ...]]] = []
        unit_chunks: list[int] = []
        buckets: list[tuple[int, float]] = []
        embedding = after_backward = experts = False
        per_microbatch = 0.0
        if plan.data_parallel:
            op = "all_reduce" if zero == 0 else "reduce_scatter"
            # per unit where the emitters reduce per unit (ZeRO-3, FSDP's sharded strategies), else DDP buckets
            per_unit = plan.gathers_units
            group = plan.shard_group(0) if per_unit else plan.grid.dp_group(0)
            sizes = step.gradient_bytes(plan, stage)
            ready = []  # (layer, its gradient bytes), in the order they become final
            for c in chunk_order:
                layers = tuple(reversed(plan.chunk_layers(plan.stage_chunks[stage][c])))
                chunks.append((c, layers))
                ready += [(layer, sizes[layer]) for layer in layers]
            if -1 in sizes:  # the embedding's gradients, with the stage's first layer's
                embedding = True
                ready.append((-1, sizes[-1]))
            if plan.pipelined_fsdp:  # FSDP + PP: every unit of a chunk, once, after the chunk's last backward
                sent = []
                for c in range(plan.local_chunks - 1, -1, -1):  # the last local chunk's backward ends first
                    unit_chunks.append(c)
                    sent += [(-10 - c, unit.grad_params * grad_elem)
                             for unit in self._chunk_units(plan, plan.stage_chunks[stage][c], shape_key)]
            elif per_unit and zero >= 3:  # the reductions a micro-batch's backward issues (step.reduce_buckets)
                sent = [(layer, params * grad_elem) for layer, params in step.reduce_buckets(plan)]
            elif per_unit:  # one reduction per unit, as its backward ends
                units: dict[int, float] = {}
                for layer, _ in ready:
                    unit = max(layer, 0) // plan.unit_layers
                    units[unit] = step.unit_grad_params(plan, unit) * grad_elem
                closing = {max(layer, 0) // plan.unit_layers: layer for layer, _ in ready}
                sent = [(closing[unit], nbytes) for unit, nbytes in units.items()]
            elif plan.scenario.parallel.overlap_grad_reduce or zero >= 2:
                sent = step.fill_buckets(plan, ready)
            else:  # Megatron-LM's default: one bucket per model chunk, after the whole backward
                after_backward = True
                sent = [(-2, nbytes) for _, nbytes in step.chunk_gradient_bytes(plan, stage)]
            # a stage's buckets repeat a few sizes over one group: each size priced once here (a lookup in
            # _dp_collective's cache hashes the group's ranks, up to thousands of them, every time)
            priced: dict[float, float] = {}
            for layer, nbytes in sent:
                seconds = priced.get(nbytes)
                if seconds is None:
                    seconds = priced[nbytes] = self._dp_collective(plan, op, nbytes, group)
                if per_unit and plan.hybrid:  # every TP rank's replicas at once, as the reduce-scatters
                    seconds += self._dp_collective(plan, "all_reduce", nbytes / len(group), plan.replica_group(0))
                buckets.append((layer, seconds))
                per_microbatch += seconds
            experts = step.expert_reduces(plan)
        copies = step.copy_gradient_reduce(plan, plan.grid.stage_representative(stage))
        shard = step.optimizer_params(plan, stage)
        if plan.scenario.offload.optimizer:
            optimizer = step.host_adam_seconds(plan, shard) \
                + step.pcie_seconds(plan, step.weights_to_gpu_bytes(plan, shard))
        else:
            optimizer = self.costs.optimizer_time(shard, plan.optimizer_step_bytes_per_param)
        for _, nbytes in step.grad_checks(plan, stage):  # each kernel, then its one-float all-reduce
            optimizer += self.costs.memory_time(nbytes) + stat_reduce
        gather = step.final_weight_gather_bytes(plan, stage)
        expert_gather = step.expert_weight_gather_bytes(plan, stage)
        # priced as the buckets are (_dp_collective): on the flow-level network every TP rank's DP group gathers at
        # once, through the same NICs, leaf uplinks and spine (llama2-7b spine, ZeRO-1 pp 1: 54 ms, not the 27 ms
        # of one group alone; the estimate was 6.5% under the simulation)
        if gather and not expert_gather:
            optimizer += self._dp_collective(plan, "all_gather", gather, plan.grid.dp_group(0))
        elif expert_gather:  # the dense and the expert weights are gathered on two streams at once
            optimizer += max(self._dp_collective(plan, "all_gather", gather, plan.grid.dp_group(0)) if gather else 0.0,
                             self._dp_collective(plan, "all_gather", expert_gather, plan.expert_dp_group(0)))
        sync = step.metric_sync(plan)
        if sync is not None:  # the trainer's train-metric sync once the step is done (sim.workload.train_metrics)
            optimizer += step.metric_sync_seconds(sync, self.net)
        copies_s = None
        if copies is not None:  # every (tp, dp, cp) coordinate's two stages sum their copies at once, not only the
            # TP peers (lockstep_groups): llama2-7b spine DualPipe pp 2, dp 2, both DP replicas' pairs through the
            # spine, 287 ms, not the 71 ms of one pair alone (-20.0% -> +1.6%; the rest was the buckets' order,
            # _chunk_order: -0.3%)
            nbytes, pair = copies
            everyone = None if self.flows is None else tuple(sorted({
                step.copy_gradient_reduce(plan, rank)[1] for rank in range(plan.num_gpus)}))  # type: ignore[index]
            copies_s = self._dp_collective(plan, "all_reduce", nbytes, pair, everyone)
        # Stages whose tails differ only in their layers' names (an even pipeline's middle stages) share a kind:
        # the buckets closed at the same place in the stage's backward, with the same seconds.
        order = [layer for _, layers in chunks for layer in layers]
        position = dict(zip(order, range(len(order)), strict=True))
        kind = self._tail_kinds.setdefault(
            (tuple((c, len(layers)) for c, layers in chunks), embedding, after_backward, tuple(unit_chunks),
             tuple((position.get(layer, layer), seconds) for layer, seconds in buckets), per_microbatch, experts,
             copies_s, optimizer), len(self._tail_kinds))
        shape = _TailShape(chunks, embedding, after_backward, unit_chunks, buckets, per_microbatch, experts, copies_s,
                           optimizer, kind)
        self._tail_shapes[key] = (shape, plan.scenario)  # the scenario keeps the objects _shape_key names alive
        return shape

    def _chunk_order(self, plan: Plan, stage: int) -> tuple[int, ...]:
        """A stage's local chunks in the order their gradients become final, the order the emitter fills its
        buckets in (``data_parallel``: the layers sorted by ``grad_ready``): the last local chunk's backward ends
        first, and under a split backward the order of the chunks' last W passes (``_after_last_weight``: more
        passes after it, earlier). They differ in DualPipe's later half of the stages, whose local chunk 0 finishes
        first (llama2-7b spine dualpipe pp 2: stage 1's chunk 0 buckets waited behind chunk 1's last W, +1.6% ->
        -0.3%). The chunk holding the embedding finishes last in ZB-V, DualPipe and DualPipeV (pp 2, 4 and 8:
        tests/test_estimate.py), where ``_tail`` puts the embedding's gradients."""
        descending = range(plan.local_chunks - 1, -1, -1)
        after = self._after_last_weight(plan)
        if after is None:
            return tuple(descending)
        passes = after[stage]
        return tuple(sorted(descending, key=lambda c: -sum(passes[c])))

    def _chunk_units(self, plan: Plan, chunk: int, shape_key: tuple[Any, ...]) -> list[step.ChunkUnit]:
        """``step.chunk_units`` of model ``chunk``, kept per ``shape_key`` (``_shape_key``): a stage's tail and its
        first micro-batch's gathers both read them."""
        key = (shape_key, chunk)
        found = self._units.get(key)
        if found is None:
            found = self._units[key] = (step.chunk_units(plan, chunk), plan.scenario)  # keeps the key's objects
        return found[0]

    def _expert_tail(self, plan: Plan, stage: int, when: dict[int, float], backward_end: float) -> float:
        """Exposed time of a MoE stage's expert-gradient reduction after its last backward: buckets over the
        expert-data-parallel group on their own stream, each as soon as its layers' gradients are final (the
        emitter's ``_expert_buckets``), or one per chunk after the backward."""
        op = "all_reduce" if plan.zero_stage == 0 else "reduce_scatter"
        group = plan.expert_dp_group(0)
        sizes = step.expert_gradient_bytes(plan, stage)
        if plan.scenario.parallel.overlap_grad_reduce:
            ready = sorted(sizes.items(), key=lambda item: when[item[0]])
            buckets = [(when[layer], nbytes) for layer, nbytes in step.fill_buckets(plan, ready)]
        else:
            buckets = [(backward_end, sum(sizes.get(layer, 0.0) for layer in plan.chunk_layers(chunk)))
                       for chunk in plan.stage_chunks[stage]]
        free_at = 0.0
        for at, nbytes in buckets:
            if nbytes:
                free_at = max(free_at, at) + self._dp_collective(plan, op, nbytes, group)
        return max(0.0, free_at - backward_end)
