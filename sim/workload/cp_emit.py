"""The attention block of one rank under context parallelism, as tasks (issue 24).

In: the stage emitter (``sim.workload.build``'s: its plan, graph, pricing and task helpers) and the plan's CP
attention (``sim.workload.cp_attention.context_attention``: the core's steps and the exchanges of each pass). Out: the
tasks of a layer's attention block, forward or backward, on the compute stream and the ``cp`` stream: the
projections around the flash kernel, and the kernel with its exchanges (all_gather / a2a collectives, or
Transformer Engine's p2p ring). The physics (volumes, causal shares) is in ``sim.parallel.context``.
"""

from __future__ import annotations

from typing import Any

from sim.costs.models import ComputePhase, Work
from sim.workload.cp_attention import ContextAttention, attention_parts
from sim.workload.ir import CP_STREAM
from sim.workload.tp_collectives import overlaps_backward, regathers_after_input_grad


class ContextEmitter:
    """One rank's CP attention blocks; ``st`` is the stage emitter whose graph and chains the tasks join."""

    def __init__(self, stage: Any) -> None:
        self.st = stage
        attention: ContextAttention | None = stage.cp_attention
        assert attention is not None
        self.attention = attention
        self.group = stage.plan.grid.cp_group(stage.rank)
        self.next_rank = self.group[(self.group.index(stage.rank) + 1) % len(self.group)]  # the ring's next rank
        self.parts: dict[int, tuple[Work, Work]] = {}  # id(attention block) -> (before, after the core)

    def block(self, kind: str, mb: int, layer: int, after: int | None, phase: ComputePhase) -> int | None:
        """The attention block under context parallelism: the part before the flash kernel (norm, QKV: task
        ``attention``), the attention core with its CP exchanges (``core``: ``attention_core``), the part after
        it (output projection, residual: ``attention_out``); backward in reverse, the QKV
        projection's backward keeping Megatron's asynchronous input-gradient reduction under its weight gradient
        (as ``_overlapped_backward``)."""
        whole = self.st.block_work["attention"]  # the trained or the frozen layer's
        if id(whole) not in self.parts:  # kept: _price caches by identity
            self.parts[id(whole)] = attention_parts(whole)
        pre, post = self.parts[id(whole)]
        st = self.st
        head = None  # TE's userbuffers (st.tp_chunks): the gather's first chunk, which the first GEMM reads
        if st.tp_chunks:
            after = head = st._overlapped_gather(mb, layer, after)
        elif st.tp_before:
            after = st._tp(st.tp_before, mb, layer, after)
        if phase == "forward":
            after = st._compute(kind, "attention", mb, layer, pre, after, phase)
            if head is not None:
                st._after_chunk(after, head)
            after = self.core(kind, mb, layer, after, phase)
            if head is None:
                after = st._compute(kind, "attention_out", mb, layer, post, after, phase)
                return st._tp(st.tp_after, mb, layer, after)
            # the reduce-scatter's chunks but the last beside the output projection, the last after it
            n, op, core_end = st.tp_chunks, st.tp_after, after
            st._tp_chunk(op, st.tp_bytes * (n - 1) / n, mb, layer, core_end)
            after = st._compute(kind, "attention_out", mb, layer, post, core_end, phase)
            assert after is not None and core_end is not None
            st._flagged(after, False, True, (after - core_end,) if st.g.tasks[core_end].stream != "compute" else ())
            return st._sum_partials(kind, "attention", mb, layer, st._tp_chunk(op, st.tp_bytes / n, mb, layer, after))
        after = st._compute("backward", "attention_out", mb, layer, post, after, phase)
        if head is not None:
            st._after_chunk(after, head)
        after = self.core("backward", mb, layer, after, phase)
        column = self.st.column_work["attention"]
        if not overlaps_backward(self.st.plan, self.st._price(column, "weight_grad")[0]):
            if regathers_after_input_grad(self.st.plan, self.st._price(column, "weight_grad")[0]):
                return self.st._sum_partials("backward", "attention", mb, layer,
                                             self.st._serial_backward("attention", mb, layer, after, pre))
            after = self.st._compute("backward", "attention", mb, layer, pre, after, phase)
            return self.st._sum_partials("backward", "attention", mb, layer,
                                         self.st._tp(self.st.tp_after, mb, layer, after))
        total, weight = self.st._price(pre, "backward"), self.st._price(column, "weight_grad")
        gathered = None
        if self.st.tp_before:  # SP: the stored sharded input gathered again beside the input-gradient GEMMs
            prior = self.st.blocking_tp
            gathered = self.st._flagged(self.st._tp(self.st.tp_before, mb, layer, after), True, False, ())
            self.st.blocking_tp = prior  # it gates nothing but the weight gradient
        ring_end = after
        dgrad = self.st._compute("backward", "attention", mb, layer, pre, after,
                              cost=(total[0] - weight[0], total[1] - weight[1]))
        if gathered is not None:
            self.st._flagged(dgrad, False, True, (dgrad - ring_end,))  # type: ignore[operator]
        reduce = self.st._flagged(self.st._tp(self.st.tp_after, mb, layer, dgrad), True, False, (), consumed=True)
        extra = [gathered] if gathered is not None else []
        wgrad = self.st.g.add(self.st.rank, self.st.stage, "compute", "backward", "attention", mb, layer, extra,
                           weight[0] * self.st.jitter(), "", 0.0, weight[1])
        self.st._flagged(wgrad, False, False, tuple(wgrad - task for task in extra))
        self.st.blocking_tp = reduce  # the next block consumes the reduced input gradient
        return self.st._sum_partials("backward", "attention", mb, layer, wgrad)  # AsyncTP's, taking ``reduce``

    def core(self, kind: str, mb: int, layer: int, after: int | None, phase: ComputePhase) -> int | None:
        """The attention core and its CP exchanges (stream ``cp``; sim.parallel.context.exchanges): all_gather and
        a2a, the collectives before the core, the core, the collectives after it; p2p, Transformer Engine's ring
        (AttnFuncWithCPAndKVP2P): at step k the send of what step k+1 needs leaves (forward: after send k-1;
        backward: also after step k-1's compute, whose dKV it carries) while step k computes on what arrived, and
        step k waits for send k-1. Returns the task the rest of the block waits for (the backward ring's last
        send: dK, dV back home)."""
        ca = self.attention
        assert ca is not None
        backward = kind == "backward"
        moves = ca.backward if backward else ca.forward
        if self.st.plan.cp_comm_type != "p2p":
            last = after
            for move in (m for m in moves if m.where == "before"):
                last = self.st._exact_task(CP_STREAM, "cp", "cp", mb, layer, last,
                                      exchange=(move.op, move.nbytes, self.group, 1.0))
            last = self.st._exact_task("compute", kind, "attention_core", mb, layer, last, work=ca.steps[0],
                                       phase=phase)
            for move in (m for m in moves if m.where == "after"):
                last = self.st._exact_task(CP_STREAM, "cp", "cp", mb, layer, last,
                                      exchange=(move.op, move.nbytes, self.group, 1.0))
            return last
        start, block, send = after, after, None
        block_k: int | None = None
        for k, step in enumerate(ca.steps):
            block_k = self.st._exact_task("compute", kind, "attention_core", mb, layer, None,
                                     [send] if send is not None else [], work=step, phase=phase)
            if k < len(moves):
                gate = start if k == 0 else block if backward else None  # K, V ready; backward: step k-1's dKV
                also = [gate] if gate is not None else []
                send = self.st._exact_task(CP_STREAM, "cp", "cp", mb, layer, None, also,
                                      exchange=("send", moves[k].nbytes, (self.st.rank, self.next_rank), 1.0))
            block = block_k
        return send if backward and send is not None else block
