"""A transformer block's tasks with its TP collectives: Megatron-LM's, TE userbuffers' and PyTorch AsyncTP's.

In: the task emitter (``TaskEmitter``: state, pricing, task helpers) and the step structure's block work and TP ops
(sim.workload.step). Out: ``BlockEmitter``: one block (attention or MLP) in a phase: [all-gather] compute
[all-reduce | reduce-scatter], synchronous as Megatron issues them; the backward's input-gradient reduction under
the weight gradient (``_overlapped_backward``); TE userbuffers' chunked all-gather and reduce-scatter beside the
GEMMs (``_chunked_block``, ``_overlapped_gather``); AsyncTP's fused gather and scatter GEMMs and the reduction of
the partial sums (``_async_tp_block``, ``_async_tp_backward``, ``_fused_gather``, ``_fused_scatter``,
``_sum_partials``; docs/mechanisms/tp_comm_overlap.md). The attention block under context parallelism is
sim.workload.cp_emit's, which uses these helpers.
"""

from __future__ import annotations

from sim.costs.models import ComputePhase, Work
from sim.workload.task_emit import TaskEmitter
from sim.workload.tp_collectives import overlaps_backward, regathers_after_input_grad
from sim.workload.tp_overlap import beside_reduce_scatter


class BlockEmitter(TaskEmitter):
    """A block and its TP collectives (a base of ``sim.workload.build._StageEmitter``)."""

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
        if phase == "backward":
            column_weight = self._price(self.column_work[block], "weight_grad")[0]
            if overlaps_backward(self.plan, column_weight):
                return self._overlapped_backward(block, mb, layer, after)
            if regathers_after_input_grad(self.plan, column_weight):
                return self._serial_backward(block, mb, layer, after)
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

    def _serial_backward(self, block: str, mb: int, layer: int, after: int | None,
                         work: Work | None = None) -> int | None:
        """A block's backward (``work``: default the block's; context parallelism's attention passes its part
        besides the ring) when Megatron's asynchronous TP collectives run after the GEMMs they were issued before
        (``regathers_after_input_grad``: more than one CUDA hardware queue, sequence parallelism): the
        input-gradient GEMMs, SP's second all-gather of the block's input, the weight-gradient GEMM, then the
        input-gradient reduce-scatter, each waiting for the one before. Returns the reduce-scatter."""
        work, column = work or self.block_work[block], self.column_work[block]
        total, weight = self._price(work, "backward"), self._price(column, "weight_grad")
        dgrad = self._compute("backward", block, mb, layer, work, after,
                              cost=(total[0] - weight[0], total[1] - weight[1]))
        gathered = self._tp(self.tp_before, mb, layer, dgrad)
        wgrad = self._compute("backward", block, mb, layer, column, gathered, cost=weight)
        return self._tp(self.tp_after, mb, layer, wgrad)

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
        """AsyncTP's reduction of the tp partial sums after a chunked reduce-scatter (``after``; sim.workload.tp_overlap
        ``reduce_partials_bytes``), on the compute stream, which waits for it; ``after`` itself where there is
        none (TE's reduce-scatter reduces as it goes)."""
        seconds, nbytes = self.reduce_partials
        if not seconds:
            return after
        return self._add("compute", kind, f"{block}_reduce_partials", mb, layer, after,
                         duration=seconds * self.jitter(), nbytes=nbytes)

