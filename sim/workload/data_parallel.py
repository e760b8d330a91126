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
  the optimizer step on 1/N of the parameters, then an all-gather of the updated 16-bit weights.
- ZeRO-2 (+ gradients): bucketed reduce-scatter during every micro-batch's backward (the full gradient is
  never kept), then the sharded step and the weight all-gather.
- ZeRO-3 / FSDP FULL_SHARD (+ weights): per unit of ``fsdp.unit_layers`` layers, an all-gather of the unit's
  weights before its forward and again before its backward, freed after; a reduce-scatter of its gradients
  after its backward. With prefetch (FSDP's BACKWARD_PRE, and the CPU running ahead in the forward) the next
  unit's all-gather is issued while this unit computes, with at most two units gathered at once (FSDP's rate
  limiter): in the backward it is issued before this unit's reduce-scatter, so it does not queue behind it.
  Without prefetch (FSDP's backward_prefetch=None) the forward still runs a unit ahead, but in the backward a
  unit's all-gather is issued when its compute is reached, after the previous unit's reduce-scatter: both are
  exposed. Zhao et al. VLDB 2023 Sec. 5.2 measured backward prefetch as ~18% faster on GPT-175B.
  SHARD_GRAD_OP keeps the forward's gather until the unit's backward. HYBRID_SHARD shards inside a node and
  adds an all-reduce of each reduced shard across nodes, on its own process group's stream.
Per step, ZeRO-3 moves 1.5x DDP's bytes (Rajbhandari et al. SC20 Sec. 7).
- CPU offload (ZeRO-Offload, Ren et al. ATC 2021): each reduced gradient shard is copied to the host over PCIe
  as soon as it is reduced (stream ``offload``), the host runs Adam on the shard (stream ``host``, bytes over
  host memory bandwidth), and the updated 16-bit weights return over PCIe before the weight all-gather. With
  ``offload.params`` (ZeRO-3) each unit's weight shard is copied to the GPU before its all-gather.
"""

from __future__ import annotations

from typing import Any

from sim.network.collectives import p2p_time
from sim.costs.models import ADAM_BYTES_PER_PARAM
from sim.hardware import bytes_per_element
from sim.model.memory import model_state_bytes
from sim.workload.memory_plan import stage_params
from sim.model.transformer import embedding_params, head_params, layer_params
from sim.workload.ir import HOST_STREAM, NCCL_STREAM, OFFLOAD_STREAM, REPLICA_STREAM


class DataParallelEmitter:
    def __init__(self, stage: Any) -> None:
        self.st = stage  # the stage emitter: rank, _add(), grad_ready, pending_deps, scenario
        sc = stage.sc
        self.sc = sc
        self.zero = sc.zero_stage
        self.fsdp = sc.fsdp
        grid = sc.grid
        self.dp_group = grid.dp_group(stage.rank)
        self.shard_group, self.replica_group = self.dp_group, (stage.rank,)
        if self.fsdp is not None and self.fsdp.sharding == "HYBRID_SHARD":
            node = grid.node(stage.rank)
            self.shard_group = tuple(r for r in self.dp_group if grid.node(r) == node)
            local = self.shard_group.index(stage.rank)
            per_node = len(self.shard_group)
            self.replica_group = tuple(self.dp_group[i] for i in range(local, len(self.dp_group), per_node))
        self.grad_bytes_per_param = bytes_per_element(sc.grad_dtype)
        self.weight_bytes_per_param = model_state_bytes(1.0, sc.training.dtype).weights
        self.layer_params = layer_params(sc.model).per_tp_rank(stage.tp)
        self.unit_layers = self.fsdp.unit_layers if self.fsdp is not None else 1
        self.sharded_units = self.zero >= 3 or (self.fsdp is not None and self.fsdp.sharding == "SHARD_GRAD_OP")
        self.prefetch = self.fsdp.prefetch if self.fsdp is not None else True
        self.unit_ends: list[int] = []  # last compute task of each unit computed, in order (for prefetch)
        self.gathered: dict[tuple[int, int], int] = {}  # SHARD_GRAD_OP: (mb, unit) gathered in forward
        self.prefetched: dict[tuple[int, int], int] = {}  # (mb, unit) whose backward gather is already issued
        self.pending_bucket = 0.0
        self.reduce_tasks: list[int] = []
        self.multi = len(self.dp_group) > 1
        self.offload = sc.offload
        self.pcie = sc.cluster.pcie

    def _pcie(self, name: str, nbytes: float, after: int | None, mb: int = -1, layer: int = -1) -> int:
        """A host <-> GPU copy of ``nbytes`` on the offload stream (PCIe latency + bytes / effective rate)."""
        seconds = p2p_time(nbytes, self.pcie.latency, self.pcie.effective_bandwidth)
        return self.st._add(OFFLOAD_STREAM, "offload", name, mb, layer, after, duration=seconds, nbytes=nbytes)

    # ------------------------------------------------------------------------------------------ helpers
    def _unit_bytes(self, unit: int, per_param: float) -> float:
        params = self.unit_layers * self.layer_params
        first, last = unit * self.unit_layers, (unit + 1) * self.unit_layers - 1
        if first == 0:
            params += embedding_params(self.sc.model) / self.st.tp
        if last == self.sc.model.num_layers - 1:
            params += head_params(self.sc.model) / self.st.tp
        return params * per_param

    # ---------------------------------------------------------------------------------------------- hooks
    def before_layer(self, mb: int, layer: int, phase: str) -> None:
        """Gather a unit's weights before its first layer runs (ZeRO-3 / FSDP)."""
        if not (self.sharded_units and self.multi):
            return
        unit = layer // self.unit_layers
        first_of_unit = layer % self.unit_layers == (0 if phase == "forward" else self.unit_layers - 1)
        if not first_of_unit:
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

    def _gather(self, mb: int, unit: int, backward: bool, lag: int) -> int:
        """A unit's weight all-gather, waiting for the unit computed ``lag`` units ago to be freed."""
        waits = [self.unit_ends[-lag]] if len(self.unit_ends) >= lag else []
        if self.offload.params:  # the unit's weight shard comes from host memory first
            shard = self._unit_bytes(unit, self.weight_bytes_per_param) / len(self.shard_group)
            waits.append(self._pcie("params_to_gpu", shard, None, mb, unit * self.unit_layers))
            self.st.g.tasks[waits[-1]].deps.extend(waits[:-1])
        name = "param_gather_bwd" if backward else "param_gather_fwd"
        task = self.st._add(NCCL_STREAM, "dp", name, mb, unit * self.unit_layers, None, op="all_gather",
                            nbytes=self._unit_bytes(unit, self.weight_bytes_per_param), group=self.shard_group)
        self.st.g.tasks[task].deps.extend(waits)
        return task

    def unit_compute_done(self, layer: int, phase: str, last_task: int) -> None:
        """Record the end of a unit's compute (the last layer of a unit in this phase's order)."""
        if self.sharded_units and layer % self.unit_layers == (self.unit_layers - 1 if phase == "forward" else 0):
            self.unit_ends.append(last_task)

    def after_layer_backward(self, mb: int, layer: int, last_task: int) -> None:
        """Reduce-scatter gradients as they are produced: per unit (ZeRO-3 / FSDP) or per bucket (ZeRO-2)."""
        if not self.multi or self.zero < 2:
            return
        if self.sharded_units:
            if layer % self.unit_layers:
                return
            unit = layer // self.unit_layers
            self._reduce(mb, layer, last_task, self._unit_bytes(unit, self.grad_bytes_per_param))
            return
        self.pending_bucket += self._unit_bytes(layer, self.grad_bytes_per_param)  # ZeRO-2: one-layer units
        if self.pending_bucket >= self.sc.parallel.dp_bucket_size or layer == 0:
            self._reduce(mb, layer, last_task, self.pending_bucket)
            self.pending_bucket = 0.0

    def _reduce(self, mb: int, layer: int, after: int, nbytes: float) -> None:
        task = self.st._add(NCCL_STREAM, "dp", "grad_reduce_scatter", mb, layer, after, op="reduce_scatter",
                            nbytes=nbytes, group=self.shard_group)
        self.reduce_tasks.append(task)
        if len(self.replica_group) > 1:  # HYBRID_SHARD: replicas all-reduce their reduced shard
            task = self.st._add(REPLICA_STREAM, "dp", "grad_all_reduce", mb, layer, task, op="all_reduce",
                                nbytes=nbytes / len(self.shard_group), group=self.replica_group)
            self.reduce_tasks.append(task)

    # ------------------------------------------------------------------------------------------ end of step
    def finish(self) -> None:
        st, sc = self.st, self.sc
        params = stage_params(sc, st.stage)
        if self.multi and self.zero < 2:
            self._end_of_step_buckets("all_reduce" if self.zero == 0 else "reduce_scatter")
        shards = sc.zero_shards if self.zero >= 1 else 1
        if self.offload.optimizer:
            optimizer = self._host_step(params / shards)
        else:
            optimizer = st._add("compute", "optimizer", "optimizer", -1, -1, None,
                                duration=st.costs.optimizer_time(params / shards, self.grad_bytes_per_param))
            st.g.tasks[optimizer].deps.extend(self.reduce_tasks)
        if self.multi and self.zero in (1, 2):  # bring every rank the updated 16-bit weights
            st._add(NCCL_STREAM, "dp", "param_all_gather", -1, -1, optimizer, op="all_gather",
                    nbytes=params * self.weight_bytes_per_param, group=self.dp_group)

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
        seconds = ADAM_BYTES_PER_PARAM * shard_params / self.offload.host_bandwidth
        adam = st._add(HOST_STREAM, "optimizer", "host_adam", -1, -1, None, duration=seconds)
        st.g.tasks[adam].deps.extend(copies)
        return self._pcie("params_to_gpu", shard_params * self.weight_bytes_per_param, adam)

    def _end_of_step_buckets(self, op: str) -> None:
        """DDP / ZeRO-1: buckets in the order gradients become final (the last micro-batch's backward)."""
        st, sc = self.st, self.sc
        per_layer = self.layer_params * self.grad_bytes_per_param
        sizes = {layer: per_layer for layer in st.grad_ready if layer >= 0}
        if st.stage == st.p - 1:  # the head's gradients are final with the last layer's
            head = head_params(sc.model) + (sc.model.vocab_size * sc.model.hidden_size
                                            if sc.model.tied_embeddings and st.p > 1 else 0)
            sizes[max(sizes)] += head / st.tp * self.grad_bytes_per_param
        if st.stage == 0:
            key = -1 if -1 in st.grad_ready else min(sizes)
            sizes[key] = sizes.get(key, 0.0) + embedding_params(sc.model) / st.tp * self.grad_bytes_per_param
        order = sorted(sizes, key=lambda layer: st.grad_ready[layer])
        pending = 0.0
        for index, layer in enumerate(order):
            pending += sizes[layer]
            if pending >= sc.parallel.dp_bucket_size or index == len(order) - 1:
                name = f"grad_bucket{len(self.reduce_tasks)}"
                self.reduce_tasks.append(st._add(NCCL_STREAM, "dp", name, -1, layer, st.grad_ready[layer], op=op,
                                                 nbytes=pending, group=self.dp_group))
                pending = 0.0
