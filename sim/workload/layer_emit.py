"""One transformer layer's pass: its blocks, recomputation, activation offload and the MoE dispatcher's host sync.

In: the chain and block emitters (``ChainEmitter`` and below), a MoE layer's MLP part (sim.workload.moe_emit), the
data-parallel hooks (sim.workload.data_parallel) and the Plan's per-layer rules (``recomputes``, ``offloads``,
``recompute_modules``, ``moe_host_seconds``). Out: ``LayerEmitter``: a layer's forward or backward (``_layer``: with
activation offload's PCIe copies and TE's buffer copy, docs/mechanisms/activation_offload.md; ``_layer_tasks``: its
blocks, full recomputation's replay, what selective recomputation replays (``_selective_recompute``,
docs/mechanisms/recompute_modules.md), the host's issue time behind a MoE dispatcher's sync (``_moe_host``,
docs/mechanisms/moe_host_sync.md), recorded from the first layer and stamped for those that repeat it), and a
layer's weight-gradient GEMMs (``_weight_layer``, zero-bubble schedules).
"""

from __future__ import annotations

from sim.costs.models import ComputePhase
from sim.workload.chain_emit import ChainEmitter
from sim.workload.host_offload import activation_copy_seconds, offload_buffer_copy_seconds
from sim.workload.ir import HOST_STREAM, OFFLOAD_STREAM, Kind


class LayerEmitter(ChainEmitter):
    """A layer's passes (a base of ``sim.workload.build._StageEmitter``)."""

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
            # full recomputation reruns the layer's forward, its host sync and eager ops with it, in the backward;
            # selective recomputation of module moe its MoE part (Plan.moe_replay_host_seconds)
            host = self.moe_host[direction] + (self.moe_host["forward"] if recomputes else
                                               self.plan.moe_replay_host_seconds if direction == "backward" else 0.0)
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

    def _selective_recompute(self, block: str, moe: bool, mb: int, layer: int, after: int | None) -> int | None:
        """What selective recomputation replays before ``block``'s backward (``training.recompute_modules``,
        Megatron-Core): before attention's, the attention core, input norm and MLA up projections
        (``blocks.Blocks.recompute``); before a dense MLP's, the pre-MLP norm and, with module ``mlp``, the MLP
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

