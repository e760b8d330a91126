"""How the weight all-gathers before the forward hold back a stage's first micro-batch.

In: ``DataParallelTail`` (``_dp_collective``, ``_chunk_units``), a ``Plan`` and the stages' ``StageTimes``. Out:
``WeightGathers``: ZeRO-1/2 with ``parallel.overlap_param_gather``, where a stage's first forward waits for a dense or
expert bucket's gather (``_param_gates``) and the delay it adds (``_param_gather_delay``, with or without
``align_param_gather``; docs/mechanisms/distributed_optimizer.md); FSDP + PP's once-per-step unit gathers, when each
ends (``_unit_gather_ends``) and their delay (``_unit_gather_delay``; docs/mechanisms/fsdp_pipeline.md); the step's
delay, the stages' holds added up down the pipe (``_gather_delay``).
"""

from __future__ import annotations

from typing import Any

from sim.explore.estimate_records import _Gate, _ShapeParts, _Timing
from sim.explore.estimate_tail import DataParallelTail
from sim.explore.stage_replay import StageTimes
from sim.plan import Plan
from sim.workload import step


class WeightGathers(DataParallelTail):
    """The weight all-gathers' delay of the first forwards (a base of sim.explore.estimate's ``Estimator``)."""

    def _param_gates(self, plan: Plan, stage: int) -> list[_Gate]:
        """ZeRO-1/2 with ``parallel.overlap_param_gather``: where ``stage``'s first micro-batch forward waits for a
        weight all-gather (``_Gate``), in forward order, for ``_param_gather_delay``; kept per shape
        (``_parts_of_shape``: the buckets and their seconds do not depend on the micro-batch size, recomputation or
        SP). The dense buckets (``step.param_gather_buckets``) over dp on one stream and, for a MoE model, the
        expert buckets (``step.expert_param_gather_buckets``) over edp on theirs, each chain by the emitter's rule
        (``DataParallelEmitter.before_forward``): a layer where a bucket of either chain starts waits for it."""
        chains = [(step.param_gather_buckets(plan, stage), plan.grid.dp_group(0)),
                  (step.expert_param_gather_buckets(plan, stage), plan.expert_dp_group(0) if plan.is_moe else ())]
        starts: dict[tuple[int, int], list[tuple[int, float]]] = {}  # (local chunk, first layer) -> (chain, s)
        tops: dict[int, int] = {}  # per local chunk, one past its last layer (the dense buckets hold them all)
        for k, (buckets, group) in enumerate(chains):
            for bucket in buckets:
                seconds = self._dp_collective(plan, "all_gather", bucket.nbytes, group)
                starts.setdefault((bucket.chunk, bucket.layers[0]), []).append((k, seconds))
                tops[bucket.chunk] = max(tops.get(bucket.chunk, 0), bucket.layers[-1] + 1)
        order = sorted(starts)  # forward order: by local chunk, then layer (-1: the embedding, first)
        gates = []
        for index, (chunk, first) in enumerate(order):
            following = order[index + 1] if index + 1 < len(order) else None
            if following is not None and following[0] == chunk:  # the layers up to the next gate
                gates.append(_Gate(chunk, tuple(starts[chunk, first]), following[1] - max(first, 0), False))
            else:  # the rest of the chunk, then the pipeline fill before the next chunk
                gates.append(_Gate(chunk, tuple(starts[chunk, first]), max(0, tops[chunk] - max(first, 0)),
                                   following is not None))
        return gates

    @staticmethod
    def _param_gather_delay(gates: list[_Gate], aligned: bool, st: StageTimes, start: float,
                            timing: _Timing) -> float:
        """ZeRO-1/2 with ``parallel.overlap_param_gather``: how much the per-bucket weight all-gathers (issued from
        the step start; ``gates``: ``_param_gates``) delay the stage's first micro-batch forward, whose compute
        could begin at ``start``. A gate's layers start once its buckets' gathers have ended and the previous
        layers' compute is done; a chain's gather i+1 follows its gather i on the chain's stream and is issued when
        the compute reaches bucket i, or with ``align_param_gather`` a chunk's gathers all at once when the
        compute reaches the chunk before it (the first two chunks' at the step start; the emitter's
        ``before_forward``). A MoE model's expert chain, over edp on its own stream, often gathers a layer's
        weights for longer than the layer's forward: with pp 1 and few micro-batches it sets the first
        micro-batch's pace (Mixtral 8x7B tp 2, pp 1, ep 4 was 4.0% under the simulation, DeepSeek-V3 1F1B pp 16,
        ep 8 6.6%, with the dense chain alone). Between a chunk's last gate and the next chunk, the other
        micro-batches of the pipeline fill run (min(m, p) - 1 more chunk forwards)."""
        per_layer = st.forward / st.layers  # a layer's forward, the embedding and head spread over the layers
        fill = (min(timing.microbatches, timing.pp) - 1) * (st.forward / timing.local_chunks)
        gathered = [0.0, 0.0]  # when each chain's stream is free
        reached = [0.0, 0.0]  # when the compute reached each chain's previous bucket (its next gather's issue)
        chunk_reached: list[dict[int, float]] = [{}, {}]  # when the compute reached each local chunk, per chain
        free = start  # when the compute could start the next gate's layers
        busy = 0.0  # compute time of the layers, without waiting
        for chunk, waits, layers, next_chunk in gates:
            begin = free
            for k, seconds in waits:
                if aligned:  # chunk c+1's gathers are issued when the compute reaches chunk c (0 and 1: at once)
                    issued = chunk_reached[k].get(chunk - 1, 0.0) if chunk >= 2 else 0.0
                    chunk_reached[k].setdefault(chunk, free)
                else:  # the next bucket's gather is issued when the compute reaches this one
                    issued = reached[k]
                    reached[k] = free
                done = (gathered[k] if gathered[k] > issued else issued) + seconds
                gathered[k] = done
                if done > begin:
                    begin = done
            work = layers * per_layer
            if next_chunk:
                work += fill
            free, busy = begin + work, busy + work
        return max(0.0, free - start - busy)

    def _unit_gather_delay(self, ends: list[list[float]], unit_layers: int, st: StageTimes, start: float,
                           timing: _Timing) -> float:
        """FSDP + PP (``Plan.pipelined_fsdp``): how much the once-per-step unit all-gathers delay the stage's
        forwards, whose compute could begin at ``start``. As the emitter issues them (``DataParallelEmitter.
        before_chunk``): every local chunk's at once, chunk by chunk, queued on the group's one stream, and a unit
        computes its first micro-batch once its gather is done. Between a chunk's last unit and the next chunk,
        the other micro-batches of the pipeline fill run (min(m, p) - 1 more chunk forwards, as
        ``_param_gather_delay``): with many chunks and few micro-batches the later chunks' gathers are not done
        before they are reached (GPT-3 175B tp 8, pp 2, vpp 24, dp 64, 4 micro-batches: the simulated step was
        10% over the estimate that counted the first chunk's gathers alone). ``ends``: when each of the stage's
        units' gathers ends, per local chunk (``_unit_gather_ends``), ``unit_layers`` the layers of a unit."""
        unit_forward = st.forward / max(st.layers, 1) * unit_layers  # embedding and head spread over layers
        fill = (min(timing.microbatches, timing.pp) - 1) * st.forward / timing.local_chunks
        free, busy = start, 0.0
        last = len(ends) - 1
        for index, chunk_ends in enumerate(ends):
            for gathered in chunk_ends:
                free = (gathered if gathered > free else free) + unit_forward  # max(free, gathered), inline
                busy += unit_forward
            if index < last:
                free, busy = free + fill, busy + fill
        return max(0.0, free - start - busy)

    def _unit_gather_ends(self, plan: Plan, shape_key: tuple[Any, ...]) -> list[list[list[float]]]:
        """FSDP + PP: per stage, per local chunk, when each unit's all-gather ends (all of a stage's queued on its
        group's one stream from the step start). It does not depend on the stages' times: kept per ``shape_key``
        (``_shape_key``), every stage's at once (a layout's delay reads them all)."""
        found = self._unit_gathers.get(shape_key)
        if found is None:
            group = plan.shard_group(0)
            stages = []
            for stage in range(plan.pp):
                ends: list[list[float]] = []
                gathered = 0.0
                for chunk in plan.stage_chunks[stage]:
                    ends.append([])
                    for unit in self._chunk_units(plan, chunk, shape_key):
                        gathered += self._dp_collective(plan, "all_gather",
                                                        unit.weight_params * plan.weight_bytes_per_param, group)
                        ends[-1].append(gathered)
                stages.append(ends)
            found = self._unit_gathers[shape_key] = (stages, plan.scenario)  # the scenario keeps the key's objects
        return found[0]

    def _gather_delay(self, plan: Plan, stages: list[StageTimes], timing: _Timing, parts: _ShapeParts) -> float:
        """The weight all-gathers overlapped with the forward hold back a stage's first micro-batch: the whole
        step moves by the largest such delay (a stage's first forward can start once the upstream stages ran
        their first chunk's forward and sent it). 0 where no weights are gathered before the forward."""
        gates = parts.param_gates  # else _param_gather_delay is 0
        ends = parts.unit_ends  # else _unit_gather_delay is 0
        if gates is None and ends is None:
            return 0.0
        aligned = plan.scenario.parallel.align_param_gather
        hop, chunks, unit_layers = timing.hop, timing.local_chunks, parts.unit_layers
        start = delay = 0.0
        for s, st in enumerate(stages):
            held = 0.0
            if gates is not None:
                held = self._param_gather_delay(gates[s], aligned, st, start, timing)
            if ends is not None:
                held = max(held, self._unit_gather_delay(ends[s], unit_layers, st, start, timing))
            # the stage's first forward, held back, sends later: the next stage starts later too (a gather the
            # compute dispatches, ``align_param_gather: false``, is issued only then, so the holds add up)
            delay += held
            start += held + st.forward / chunks + hop
        return delay
