"""Data-parallel emitters: DDP buckets, ZeRO-1/2/3 and FSDP, and the optimizer step.

In: one stage's task emitter (sim.workload.build) while it emits the pipeline, through three hooks: before a layer's
compute (``before_layer``), after a layer's backward (``after_layer_backward``) and at the end of the step
(``finish``). Out: tasks on the ``dp`` stream (every gradient reduction and weight all-gather of the data-parallel
process group) and, under HYBRID_SHARD, the ``dp_replica`` stream (the replicas' all-reduce), their dependencies,
and the optimizer step on the compute stream.

One stream per process group: with NCCL, every collective of one process group runs on that group's one
per-device NCCL stream, whichever CUDA stream issued it, so collectives of the group run one at a time in the
order they were issued (PyTorch ``torch.distributed.fsdp.BackwardPrefetch`` docstring). That is why FSDP's
backward prefetch is about issue order, and it is what this module replays:

- ZeRO-0 / NO_SHARD (PyTorch DDP): gradient all-reduce in buckets filled in the order gradients become final,
  after the last micro-batch's backward.
- ZeRO-1 (optimizer states sharded; Megatron's distributed optimizer): the same buckets as a reduce-scatter,
  the optimizer step on 1/N of the parameters, then an all-gather of the updated 16-bit weights; with
  ``parallel.overlap_param_gather`` that all-gather runs per bucket under the next step's forward instead, which
  the step models as gathers from the step start that each bucket's first forward waits for (``before_forward``).
  Without ``parallel.overlap_grad_reduce`` (Megatron-LM's default) each model chunk's gradients are one bucket,
  reduced after the whole backward.
- ZeRO-2 (+ gradients): bucketed reduce-scatter during every micro-batch's backward (the full gradient is
  never kept), then the sharded step and the weight all-gather. Without ``parallel.overlap_grad_reduce``
  (DeepSpeed's overlap_comm false) each ZeRO-2/3 reduce-scatter runs on the compute stream: the next compute
  task waits for it.
- ZeRO-3 / FSDP FULL_SHARD (+ weights): per unit of ``fsdp.unit_layers`` layers, an all-gather of the unit's
  weights before its forward and again before its backward, freed after; a reduce-scatter of its gradients
  after its backward. With prefetch (FSDP's BACKWARD_PRE, and the CPU running ahead in the forward) the next
  unit's all-gather is issued while this unit computes, with at most two units gathered at once (FSDP's rate
  limiter): in the backward it is issued before this unit's reduce-scatter, so it does not queue behind it.
  Without prefetch (FSDP's backward_prefetch=None) the forward still runs a unit ahead, but in the backward a
  unit's all-gather is issued when its compute is reached, after the previous unit's reduce-scatter: both are
  exposed. Zhao et al. VLDB 2023 Sec. 5.2 measured backward prefetch as ~18% faster on GPT-175B.
  SHARD_GRAD_OP keeps the forward's gather until the unit's backward (and, its weights sharded at rest, has no
  weight all-gather after the step). HYBRID_SHARD shards inside a node and
  adds an all-reduce of each reduced shard across nodes, on its own process group's stream.
- FSDP with pp > 1 (``Plan.pipelined_fsdp``: TorchTitan's FSDP2 under torch.distributed.pipelining): a unit's
  weights are all-gathered once per step, in its first micro-batch's forward, and kept; its gradients accumulate
  unsharded, and every unit of a model chunk is reduce-scattered once, after the chunk's last micro-batch's
  backward (the pipeline stage's manual ``post_backward``).
Per step, ZeRO-3 moves 1.5x DDP's bytes (Rajbhandari et al. SC20 Sec. 7).
- The trainer's train-metric sync (``training.train_metric_states``, sim.workload.train_metrics): once the step's GPU
  work is done, per metric state a barrier and an all-gather over every rank on the ``dp`` stream and the host's
  per-rank loops on the ``host`` stream, one after another (Composer computes torchmetrics every batch).
- CPU offload (ZeRO-Offload, Ren et al. ATC 2021): each reduced gradient shard is copied to the host over PCIe
  as soon as it is reduced (stream ``offload``), the host runs Adam on the shard (stream ``host``, bytes over
  host memory bandwidth), and the updated 16-bit weights return over PCIe before the weight all-gather. With
  ``offload.params`` (ZeRO-3) each unit's weight shard is copied to the GPU before its all-gather.
- MoE: the routed experts' gradients are reduced apart from the dense ones, in their own buckets (filled the same
  way) over the expert-data-parallel group, on that group's stream ``expert_dp`` (Megatron-Core's DDP keeps
  expert parameters in separate buffers reduced over the expert DP group); with the distributed optimizer
  (ZeRO-1) their updated weights are all-gathered over it after the step, or, with overlap_param_gather, per
  expert bucket under the next forward on the same stream (``param_gather.expert_param_gather_buckets``), issued by the
  same rule as the dense buckets (``before_forward``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.parallel.chunks import upstream
from sim.workload import fsdp_units, grad_buckets, host_offload, optimizer_step, param_gather, train_metrics
from sim.workload.ir import EXPERT_DP_STREAM, HOST_STREAM, NCCL_STREAM, OFFLOAD_STREAM, REPLICA_STREAM


class DataParallelEmitter:
    def __init__(self, stage: Any) -> None:
        self.st = stage  # the stage emitter: rank, _add(), grad_ready, pending_deps, plan
        plan = stage.plan
        self.plan = plan
        self.zero = plan.zero_stage
        self.dp_group = plan.grid.dp_group(stage.rank)
        self.shard_group, self.replica_group = plan.shard_group(stage.rank), plan.replica_group(stage.rank)
        self.grad_bytes_per_param = plan.grad_bytes_per_param
        self.weight_bytes_per_param = plan.weight_bytes_per_param
        self.unit_layers = plan.unit_layers
        self.sharded_units = plan.gathers_units
        self.per_step = plan.pipelined_fsdp  # gathers in micro-batch 0's forward, reduces after the last backward
        # FSDP + PP: the units of each of this stage's chunks (fsdp_units.chunk_units), and by first layer
        self.chunk_units = {g: fsdp_units.chunk_units(plan, g) for g in plan.stage_chunks[stage.stage]} \
            if self.per_step else {}
        self.chunk_gathers: dict[int, int] = {}  # first layer of a unit -> its all-gather, until its forward waits
        self.prefetch = plan.prefetch
        self.unit_ends: list[int] = []  # last compute task of each unit computed, in order (for prefetch)
        self.gathered: dict[tuple[int, int], int] = {}  # SHARD_GRAD_OP: (mb, unit) gathered in forward
        self.prefetched: dict[tuple[int, int], int] = {}  # (mb, unit) whose backward gather is already issued
        self.pending_bucket = 0.0
        self.reduce_tasks: list[int] = []
        self.multi = len(self.dp_group) > 1
        self.offload = plan.scenario.offload
        # Per layer, the reduce-scatters its backward issues (one per unit; DeepSpeed: its buckets).
        self.reduce_at: dict[int, list[float]] = {}
        if self.sharded_units and self.zero >= 3:
            for layer, params in fsdp_units.reduce_buckets(plan):
                self.reduce_at.setdefault(layer, []).append(params)
        # ZeRO-1/2 with overlap_param_gather: the weight all-gathers of the previous step's update, per bucket,
        # issued from the step start; the forward of a bucket's first layer (micro-batch 0) waits for its gather.
        self.param_buckets = param_gather.param_gather_buckets(plan, stage.stage) if self.multi else []
        self.bucket_starts = {bucket.layers[0]: index for index, bucket in enumerate(self.param_buckets)}
        self.param_gathers: list[int] = []
        # The same for a MoE model's expert weights over the expert-data-parallel group (their own bucket chain).
        self.expert_buckets = param_gather.expert_param_gather_buckets(plan, stage.stage) if self.multi else []
        self.expert_starts = {bucket.layers[0]: index for index, bucket in enumerate(self.expert_buckets)}
        self.expert_gathers: list[int] = []

    def _pcie(self, name: str, nbytes: float, after: int | None, mb: int = -1, layer: int = -1,
              also: list[int] | None = None) -> int:
        """A host <-> GPU copy of ``nbytes`` on the offload stream, after ``after`` and the tasks in ``also``."""
        seconds = host_offload.pcie_seconds(self.plan, nbytes)
        return self.st._add(OFFLOAD_STREAM, "offload", name, mb, layer, after, also or (), duration=seconds,
                            nbytes=nbytes)

    # ---------------------------------------------------------------------------------------------- hooks
    def before_layer(self, mb: int, layer: int, phase: str) -> None:
        """Gather a unit's weights before its first layer runs (ZeRO-3 / FSDP)."""
        if not (self.sharded_units and self.multi):
            return
        unit = layer // self.unit_layers
        first_of_unit = layer % self.unit_layers == (0 if phase == "forward" else self.unit_layers - 1)
        if not first_of_unit:
            return
        if self.per_step:
            # FSDP + PP: gathered once, for micro-batch 0's forward; the compute stream orders the rest. Nothing is
            # freed before the step's end and FSDP2 has no rate limiter, so the CPU, running ahead of the GPU,
            # issues every gather early: they wait only for each other on the group's stream (lag 0).
            if phase == "forward" and mb == 0:
                self.st.pending_deps.append(self.chunk_gathers.pop(layer))
            return
        if phase != "forward" and self.zero < 3:  # SHARD_GRAD_OP kept the forward's gather
            self.st.pending_deps.append(self.gathered[(mb, unit)])
            return
        backward = phase != "forward"
        task = self.prefetched.pop((mb, unit), None) if backward else None
        if task is None:
            # The forward always gathers a unit ahead (the CPU runs ahead of the GPU; FSDP's rate limiter keeps at
            # most two units gathered), so the gather waits for the unit two back to be freed; so does the
            # backward's first gather under prefetch. Without prefetch a backward gather is issued when its unit
            # is reached, and the stream runs it after the previous unit's reduce-scatter.
            task = self._gather(mb, unit, backward, 2 if self.prefetch or not backward else 1)
        self.st.pending_deps.append(task)
        if not backward:
            self.gathered[(mb, unit)] = task
        elif self.prefetch and unit > 0:
            # BACKWARD_PRE: the next unit's gather is issued now, ahead of this unit's reduce-scatter on the
            # group's stream; it may start once the unit computed before this one is freed.
            self.prefetched[(mb, unit - 1)] = self._gather(mb, unit - 1, backward, 1)

    def before_forward(self, mb: int, chunk: int, layer: int, after: int | None) -> None:
        """ZeRO-1/2 with ``parallel.overlap_param_gather``: before the forward of ``layer`` (-1: the embedding) of
        global model ``chunk``, whose previous task is ``after``. The first micro-batch's forward of a bucket's
        first layer waits for that bucket's all-gather (Megatron-LM core_r0.8 distrib_optimizer.py
        _make_forward_pre_hook; Apex DistributedFusedAdam's pre-forward hook). When the gathers are issued:
        - ``align_param_gather: false``, one at a time: bucket 0's at the step start (zero_grad_buffer, before the
          forward), the next one in this pre-hook, once this bucket's is complete (_finish_param_sync_helper:
          "launch the all-gather for the next bucket now", not all at once, so they do not head-of-line block
          compute), i.e. when the compute reaches this bucket;
        - ``align_param_gather: true``, a model chunk at a time: the first two chunks' at the step start, chunk
          k+1's when chunk k's first micro-batch starts (the interleaved schedule's param_sync_func, Megatron-LM
          core_r0.8 and current schedules.py, which NeMo 24.07 points at Apex's _try_start_bucket_param_sync;
          without interleaving, every bucket at the step start)."""
        if mb != 0:
            return
        if layer in self.bucket_starts:
            self._bucket_chain(self.param_buckets, self.param_gathers, self.bucket_starts[layer], chunk, mb, after,
                               self._param_gather)
        if layer in self.expert_starts:  # the expert buckets' own chain, by the same rule
            self._bucket_chain(self.expert_buckets, self.expert_gathers, self.expert_starts[layer], chunk, mb,
                               after, self._expert_gather)

    def _bucket_chain(self, buckets: list[param_gather.GatherBucket], issued: list[int], index: int, chunk: int,
                      mb: int, after: int | None, gather: Callable[[float, list[int]], int]) -> None:
        """Issue the gathers of ``buckets`` (``issued``: the tasks so far, made by ``gather``) that reaching
        bucket ``index`` dispatches, and make the forward wait for this bucket's."""
        local = buckets[index].chunk
        if self.plan.scenario.parallel.align_param_gather:
            if not issued:
                self._param_gathers([b for b in buckets if b.chunk <= 1], [], gather)
            if local >= 1 and (index == 0 or buckets[index - 1].chunk != local):  # chunk k's first bucket
                self._param_gathers([b for b in buckets if b.chunk == local + 1], self._reached(chunk, mb, after),
                                    gather)
        else:
            if not issued:
                self._param_gathers(buckets[:1], [], gather)
            if index + 1 < len(buckets):
                self._param_gathers(buckets[index + 1:index + 2], self._reached(chunk, mb, after), gather)
        self.st.pending_deps.append(issued[index])

    def _reached(self, chunk: int, mb: int, after: int | None) -> list[int | tuple[str, int, int]]:
        """What a collective issued when the compute reaches this point waits for: the previous task or, at a
        chunk's start, the activations from the upstream chunk (sim.parallel.chunks.upstream, resolved once every
        stage has emitted its sends)."""
        if after is not None:
            return [after]
        needs = upstream("F", chunk, mb, self.plan.pp * self.plan.vpp - 1)
        return [needs] if needs is not None else []

    def _param_gathers(self, buckets: list[param_gather.GatherBucket], waits: list[int | tuple[str, int, int]],
                       gather: Callable[[float, list[int]], int]) -> None:
        for bucket in buckets:
            tasks = [w for w in waits if isinstance(w, int)]
            task = gather(bucket.nbytes, tasks)
            self.st.waits.extend((task, w) for w in waits if isinstance(w, tuple))

    def _expert_gather(self, nbytes: float, waits: list[int]) -> int:
        task = self.st._add(EXPERT_DP_STREAM, "dp", f"expert_param_gather_bucket{len(self.expert_gathers)}", -1, -1,
                            None, waits, op="all_gather", nbytes=nbytes, group=self.plan.expert_dp_group(self.st.rank))
        self.expert_gathers.append(task)
        return task

    def _param_gather(self, nbytes: float, waits: list[int]) -> int:
        task = self.st._add(NCCL_STREAM, "dp", f"param_gather_bucket{len(self.param_gathers)}", -1, -1, None, waits,
                            op="all_gather", nbytes=nbytes, group=self.dp_group)
        self.param_gathers.append(task)
        return task

    def before_chunk(self, mb: int, chunk: int) -> None:
        """FSDP + PP: before micro-batch 0's forward of a model chunk (and before the pass waits for its input),
        the all-gathers of all its units; each unit's first forward waits for its own (``before_layer``), a chunk
        holding only the embedding or the head for its one."""
        if not (self.per_step and self.multi and mb == 0):
            return
        for unit in self.chunk_units[chunk]:
            self.chunk_gathers[unit.layer] = self._gather(mb, unit.layer // self.unit_layers if unit.layer >= 0
                                                          else -1, False, 0, unit.weight_params)
        if not self.plan.chunk_layers(chunk):
            self.st.pending_deps.append(self.chunk_gathers.pop(-1))

    def _gather(self, mb: int, unit: int, backward: bool, lag: int, params: float | None = None) -> int:
        """A unit's weight all-gather, waiting for the unit computed ``lag`` units ago (0: none); ``params``:
        an all-gather of that many (FSDP + PP's ``fsdp_units.chunk_units``) instead of ``fsdp_units.gather_calls``."""
        waits = [self.unit_ends[-lag]] if lag and len(self.unit_ends) >= lag else []
        if self.offload.params:  # the unit's weight shard comes from host memory first
            shard = fsdp_units.unit_weight_params(self.plan, unit) * self.weight_bytes_per_param / len(self.shard_group)
            waits.append(self._pcie("params_to_gpu", shard, None, mb, unit * self.unit_layers, also=waits))
        name = "param_gather_bwd" if backward else "param_gather_fwd"
        task = -1
        # One all-gather per unit (FSDP), or DeepSpeed's per-module calls back to back on the group's stream.
        for call in fsdp_units.gather_calls(self.plan, unit) if params is None else (params,):
            task = self.st._add(NCCL_STREAM, "dp", name, mb, unit * self.unit_layers if unit >= 0 else -1,
                                None, waits, op="all_gather", nbytes=call * self.weight_bytes_per_param,
                                group=self.shard_group)
            waits = []
        return task

    def inert(self, mb: int, phase: str) -> bool:
        """Whether this micro-batch's pass of a layer adds no data-parallel task or dependency (so the stage
        emitter may stamp a recorded layer chain): FSDP + PP touches only micro-batch 0's forward."""
        return self.per_step and not (phase == "forward" and mb == 0)

    def layers_inert(self, mb: int, phase: str) -> bool:
        """Whether this micro-batch's pass adds nothing per layer: ``before_layer``, ``before_forward`` (forward),
        ``unit_compute_done`` and ``after_layer_backward`` (backward) return without a task, a dependency or a
        record (the stage emitter then stamps its layers' chains without calling them)."""
        if self.sharded_units:
            # FSDP + PP gathers per unit in micro-batch 0's forward only (``before_layer``) and reduces after the
            # chunk's last backward; the one record the other passes make, ``unit_ends``, is read only for a
            # per-unit gather's lag (``_gather``), which FSDP + PP's gathers (``before_chunk``) do not take.
            return self.per_step and not (phase == "forward" and mb == 0)
        if phase == "forward":
            return mb != 0 or not (self.bucket_starts or self.expert_starts)
        return not self.multi or self.zero < 2 or self.per_step

    def unit_compute_done(self, layer: int, phase: str, last_task: int) -> None:
        """Record the end of a unit's compute (the last layer of a unit in this phase's order)."""
        if self.sharded_units and layer % self.unit_layers == (self.unit_layers - 1 if phase == "forward" else 0):
            self.unit_ends.append(last_task)

    def after_layer_backward(self, mb: int, layer: int, last_task: int) -> None:
        """Reduce-scatter gradients as they are produced: per unit (ZeRO-3 / FSDP) or per bucket (ZeRO-2)."""
        if not self.multi or self.zero < 2:
            return
        if self.per_step:  # after_chunk_backward
            return
        if self.sharded_units:
            if self.zero >= 3:
                for params in self.reduce_at.get(layer, ()):
                    self._reduce(mb, layer, last_task, params * self.grad_bytes_per_param)
                return
            if layer % self.unit_layers:
                return
            unit = layer // self.unit_layers
            self._reduce(mb, layer, last_task, fsdp_units.unit_grad_params(self.plan, unit) * self.grad_bytes_per_param)
            return
        # ZeRO-2: 1-layer
        self.pending_bucket += fsdp_units.unit_grad_params(self.plan, layer) * self.grad_bytes_per_param
        if grad_buckets.bucket_full(self.plan, self.pending_bucket) or layer == 0:  # layer 0's gradients are the last
            self._reduce(mb, layer, last_task, self.pending_bucket)
            self.pending_bucket = 0.0

    def after_chunk_backward(self, mb: int, chunk: int, last_task: int) -> None:
        """FSDP + PP: after the last micro-batch's backward of a model chunk (its embedding's too), every unit of
        the chunk is reduce-scattered, in forward order (the pipeline stage's ``post_backward`` over its FSDP
        states, torch/distributed/pipelining/stage.py)."""
        if not (self.per_step and self.multi) or mb != self.plan.microbatches - 1:
            return
        for unit in self.chunk_units[chunk]:
            self._reduce(mb, unit.layer, last_task, unit.grad_params * self.grad_bytes_per_param)

    def chunk_backward_inert(self, mb: int) -> bool:
        """Whether ``after_chunk_backward`` adds nothing after this micro-batch's backward of a chunk."""
        return not (self.per_step and self.multi) or mb != self.plan.microbatches - 1

    def _reduce(self, mb: int, layer: int, after: int, nbytes: float) -> None:
        task = self.st._add(NCCL_STREAM, "dp", "grad_reduce_scatter", mb, layer, after, op="reduce_scatter",
                            nbytes=nbytes, group=self.shard_group)
        self.reduce_tasks.append(task)
        if len(self.replica_group) > 1:  # HYBRID_SHARD: replicas all-reduce their reduced shard
            task = self.st._add(REPLICA_STREAM, "dp", "grad_all_reduce", mb, layer, task, op="all_reduce",
                                nbytes=nbytes / len(self.shard_group), group=self.replica_group)
            self.reduce_tasks.append(task)
        if not self.plan.scenario.parallel.overlap_grad_reduce:
            # DeepSpeed with overlap_comm false: the reduction is issued on the current (compute) stream
            # (stage_1_and_2.py reduce_ipg_grads, stage3.py __reduce_and_partition_ipg_grads), so the next
            # backward kernel waits for it.
            self.st.pending_deps.append(task)

    # ------------------------------------------------------------------------------------------ end of step
    def finish(self) -> None:
        st, plan = self.st, self.plan
        if self.multi and self.zero < 2:
            op = "all_reduce" if self.zero == 0 else "reduce_scatter"
            if plan.scenario.parallel.overlap_grad_reduce:
                self._end_of_step_buckets(op)
            else:
                self._after_backward_buffers(op)
        if grad_buckets.expert_reduces(plan):
            self._expert_buckets("all_reduce" if self.zero == 0 else "reduce_scatter")
        copies = optimizer_step.copy_gradient_reduce(plan, st.rank)
        if copies is not None:  # DualPipe: sum the two model copies' gradients, after the DP reduction
            nbytes, group = copies
            last = max(st.grad_ready.values())
            self.reduce_tasks.append(st._add(NCCL_STREAM, "dp", "copy_grad_all_reduce", -1, -1, last,
                                             list(self.reduce_tasks), op="all_reduce", nbytes=nbytes, group=group,
                                             collective=st.g.meeting_key(group)))
        shard_params = optimizer_step.optimizer_params(plan, st.stage)
        if self.offload.optimizer:
            optimizer = self._host_step(shard_params)
        else:
            ready = list(self.reduce_tasks)
            # fp16 inf/nan check, gradient-norm clipping
            for name, nbytes in optimizer_step.grad_checks(plan, st.stage):
                kernel = st._add("compute", "optimizer", name, -1, -1, None, ready,
                                 duration=st.costs.memory_time(nbytes))
                ready = [st._add(NCCL_STREAM, "optimizer", f"{name}_all_reduce", -1, -1, kernel, op="all_reduce",
                                 nbytes=optimizer_step.GRAD_STAT_BYTES,
                                 group=optimizer_step.grad_stats_group(plan, st.rank))]
            optimizer = st._add("compute", "optimizer", "optimizer", -1, -1, None, ready,
                                duration=st.costs.optimizer_time(shard_params, plan.optimizer_step_bytes_per_param))
        step_end = [optimizer]
        gather = param_gather.final_weight_gather_bytes(plan, st.stage)
        if gather:  # ZeRO-1/2: bring every rank the updated 16-bit weights
            step_end.append(st._add(NCCL_STREAM, "dp", "param_all_gather", -1, -1, optimizer, op="all_gather",
                                    nbytes=gather, group=self.dp_group))
        experts = param_gather.expert_weight_gather_bytes(plan, st.stage)
        if experts:  # the expert weights over the expert-data-parallel group
            step_end.append(st._add(EXPERT_DP_STREAM, "dp", "expert_param_all_gather", -1, -1, optimizer,
                                    op="all_gather", nbytes=experts, group=plan.expert_dp_group(st.rank)))
        sync = train_metrics.metric_sync(plan)
        if sync is not None:
            self._metric_sync(sync, step_end)

    def _metric_sync(self, sync: train_metrics.MetricSync, step_end: list[int]) -> None:
        """The trainer's train-metric sync once the step's GPU work is done (Composer: after the loss's host sync;
        sim.workload.train_metrics): per metric state, one after another, the barrier, the host's world-size
        zeros_like, the all-gather into them and c10d's world-size copies, the GPU idle meanwhile."""
        st = self.st
        last, also = step_end[0], step_end[1:]
        for state in range(sync.states):
            barrier = st._add(NCCL_STREAM, "dp", f"metric_barrier{state}", -1, -1, last, also, op="all_reduce",
                              nbytes=sync.barrier_bytes, group=sync.group)
            zeros = st._add(HOST_STREAM, "host", f"metric_zeros_like{state}", -1, -1, barrier,
                            duration=sync.zeros_s)
            gather = st._add(NCCL_STREAM, "dp", f"metric_all_gather{state}", -1, -1, zeros, op="all_gather",
                             nbytes=sync.gather_bytes, group=sync.group)
            last, also = st._add(HOST_STREAM, "host", f"metric_copies{state}", -1, -1, gather,
                                 duration=sync.copies_s), []

    def _expert_buckets(self, op: str) -> None:
        """A MoE model's expert gradients over the expert-data-parallel group: buckets in the order they become
        final (``parallel.overlap_grad_reduce``), or one per model chunk after the whole backward."""
        st, plan = self.st, self.plan
        sizes = grad_buckets.expert_gradient_bytes(plan, st.stage)
        group = plan.expert_dp_group(st.rank)
        if plan.scenario.parallel.overlap_grad_reduce:
            ready = sorted(sizes.items(), key=lambda item: st.grad_ready[item[0]])
            buckets = [(layer, nbytes, st.grad_ready[layer])
                       for layer, nbytes in grad_buckets.fill_buckets(plan, ready)]
        else:
            last = max(st.grad_ready.values())
            buckets = []
            for chunk in plan.stage_chunks[st.stage]:
                nbytes = sum(sizes.get(layer, 0.0) for layer in plan.chunk_layers(chunk))
                if nbytes:
                    buckets.append((-1, nbytes, last))
        for layer, nbytes, after in buckets:
            name = f"expert_grad_bucket{len(self.reduce_tasks)}"
            self.reduce_tasks.append(st._add(EXPERT_DP_STREAM, "dp", name, -1, layer, after, op=op, nbytes=nbytes,
                                             group=group))

    def _host_step(self, shard_params: float) -> int:
        """ZeRO-Offload: reduced gradient shards to the host as they are reduced, Adam there, weights back."""
        st = self.st
        copies = []
        for task_id in self.reduce_tasks:
            task = st.g.tasks[task_id]
            shard = task.nbytes / len(task.group) if task.op == "reduce_scatter" else task.nbytes
            copies.append(self._pcie("grads_to_host", shard, task_id, task.microbatch, task.layer))
        if not copies:  # a single rank: the whole gradient crosses at the end
            copies.append(self._pcie("grads_to_host", shard_params * self.grad_bytes_per_param, None))
        adam = st._add(HOST_STREAM, "optimizer", "host_adam", -1, -1, None, copies,
                       duration=host_offload.host_adam_seconds(self.plan, shard_params))
        return self._pcie("params_to_gpu", host_offload.weights_to_gpu_bytes(self.plan, shard_params), adam)

    def _after_backward_buffers(self, op: str) -> None:
        """Megatron-LM without --overlap-grad-reduce: each model chunk's gradient buffer is one bucket, reduced
        synchronously after the last backward (finalize_model_grads -> finish_grad_sync)."""
        st = self.st
        last = max(st.grad_ready.values())  # the stage's last backward task (the compute stream runs in order)
        for _, nbytes in grad_buckets.chunk_gradient_bytes(self.plan, st.stage):
            name = f"grad_bucket{len(self.reduce_tasks)}"
            self.reduce_tasks.append(st._add(NCCL_STREAM, "dp", name, -1, -1, last, op=op, nbytes=nbytes,
                                             group=self.dp_group))

    def _end_of_step_buckets(self, op: str) -> None:
        """DDP / ZeRO-1: buckets in the order gradients become final (the last micro-batch's backward)."""
        st, plan = self.st, self.plan
        sizes = grad_buckets.gradient_bytes(plan, st.stage)
        ready = sorted(sizes.items(), key=lambda item: st.grad_ready[item[0]])
        for layer, nbytes in grad_buckets.fill_buckets(plan, ready):
            name = f"grad_bucket{len(self.reduce_tasks)}"
            self.reduce_tasks.append(st._add(NCCL_STREAM, "dp", name, -1, layer, st.grad_ready[layer], op=op,
                                             nbytes=nbytes, group=self.dp_group))
