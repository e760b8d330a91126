"""A MoE layer's MLP part on one rank, as tasks (issue 23).

In: the stage emitter (``sim.workload.build``'s: plan, graph, pricing, task helpers) and the plan's MoE work
(``sim.workload.moe_layer``: the router / shared expert / experts / combine blocks, what selective recomputation
replays, the dispatch and combine exchanges over the expert groups). Out: the layer's MLP tasks, forward, its
recomputation and backward, on the compute stream, the ``ep`` stream (dispatch and combine) and the TP stream
(the shared expert's sequence-parallel collectives), in Megatron-Core's MoELayer order.
"""

from __future__ import annotations

from typing import Any

from sim.costs.models import ComputePhase, Work
from sim.workload.ir import EP_STREAM
from sim.workload.moe_layer import (
    combine_exchanges,
    dispatch_exchanges,
    expert_group,
    moe_blocks,
    moe_recompute,
    task_seconds,
)


class MoeLayerEmitter:
    """One rank's MoE MLP parts; ``st`` is the stage emitter whose graph and chains the tasks join."""

    def __init__(self, stage: Any) -> None:
        self.st = stage
        plan, rank = stage.plan, stage.rank
        self.work = moe_blocks(plan)
        self.recompute = moe_recompute(plan)
        self.has_shared = bool(self.work["moe_shared"].ops)
        # (op, bytes, group, skew) and the exchange's own seconds (DeepEP's; None: the network times it)
        self.dispatch = [((ex.op, ex.nbytes, expert_group(plan, rank, ex.group), ex.skew), task_seconds(plan, ex))
                         for ex in dispatch_exchanges(plan)]
        self.combine = [((ex.op, ex.nbytes, expert_group(plan, rank, ex.group), ex.skew), task_seconds(plan, ex))
                        for ex in combine_exchanges(plan)]

    def task(self, *args: Any, **kwargs: Any) -> int:
        """The stage emitter's task with exactly the edges given (``_exact_task``)."""
        return int(self.st._exact_task(*args, **kwargs))

    def forward(self, kind: str, mb: int, layer: int, after: int | None) -> int:
        """A MoE layer's MLP part, forward (or its recomputation): router -> dispatch (stream ``ep``) beside the
        shared expert -> routed experts -> combine (``ep``) -> unpermute and residual. Megatron-Core's MoELayer
        (moe_layer.py): the experts wait for the dispatched tokens; the shared expert needs only the router's
        input (its overlap with the dispatch: --moe-shared-expert-overlap)."""
        w = self.work
        router = self.task("compute", kind, "moe_router", mb, layer, after, work=w["moe_router"])
        dispatched = router
        for exchange, seconds in self.dispatch:
            dispatched = self.task(EP_STREAM, "ep", "dispatch", mb, layer, dispatched, exchange=exchange,
                                   seconds=seconds)
        waits = [dispatched]
        if self.has_shared:
            self.shared_expert(kind, mb, layer, router, "forward")
        last = len(self.st.g.tasks) - 1
        experts = self.task("compute", kind, "moe_experts", mb, layer, last,
                                 [d for d in waits if d != last], work=w["moe_experts"])
        combined = experts
        for exchange, seconds in self.combine:
            combined = self.task(EP_STREAM, "ep", "combine", mb, layer, combined, exchange=exchange, seconds=seconds)
        return self.task("compute", kind, "moe_combine", mb, layer, combined, work=w["moe_combine"])

    def backward(self, mb: int, layer: int, after: int | None, phase: ComputePhase) -> int:
        """The mirror: combine's backward -> the combine's gradient exchange (the dispatch's collectives) ->
        experts' backward -> the dispatch's gradient exchange (the combine's collectives) beside the shared
        expert's backward -> router's backward."""
        w = self.work
        combine = self.task("compute", "backward", "moe_combine", mb, layer, after, work=w["moe_combine"],
                                 phase=phase)
        grads = combine
        for exchange, seconds in self.dispatch:
            grads = self.task(EP_STREAM, "ep", "combine_grad", mb, layer, grads, exchange=exchange, seconds=seconds)
        if self.recompute["moe_experts"].ops:  # moe_act: the activation output, rebuilt from fc1's
            grads = self.task("compute", "recompute", "moe_experts", mb, layer, grads,
                                   work=self.recompute["moe_experts"])
        experts = self.task("compute", "backward", "moe_experts", mb, layer, grads, work=w["moe_experts"],
                                 phase=phase)
        returned = experts
        for exchange, seconds in self.combine:
            returned = self.task(EP_STREAM, "ep", "dispatch_grad", mb, layer, returned, exchange=exchange,
                                 seconds=seconds)
        if self.has_shared:
            if self.recompute["moe_shared"].ops:  # shared_experts: its forward again, collectives included
                self.shared_expert("recompute", mb, layer, combine, "forward", self.recompute["moe_shared"])
            self.shared_expert("backward", mb, layer, combine, phase)
        last = len(self.st.g.tasks) - 1
        return self.task("compute", "backward", "moe_router", mb, layer, last,
                              [returned] if returned != last else [], work=w["moe_router"], phase=phase)

    def shared_expert(self, kind: str, mb: int, layer: int, source: int, phase: ComputePhase,
                       work: Work | None = None) -> None:
        """The shared expert on the compute stream after ``source`` (its input, or its output gradient), with
        sequence parallelism's all-gather before and reduce-scatter after over the TP group (Megatron-Core
        SharedExpertMLP is a TP MLP); ``work``: other work than its whole MLP (its recomputation)."""
        work = work or self.work["moe_shared"]
        if self.st.tp > 1:
            gather = self.task("tp", "tp", "", mb, layer, None, [source],
                                    exchange=("all_gather", self.st.tp_bytes, self.st.tp_group, 1.0))
            shared = self.task("compute", kind, "moe_shared", mb, layer, gather, work=work, phase=phase)
            self.task("tp", "tp", "", mb, layer, shared,
                           exchange=("reduce_scatter", self.st.tp_bytes, self.st.tp_group, 1.0))
        else:
            self.task("compute", kind, "moe_shared", mb, layer, None, work=work, phase=phase)
