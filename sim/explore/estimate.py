"""Closed-form step time of a scenario, without building its task graph: the screen of ``sim search``.

In: a validated ``Scenario`` (or a cheap ``model_copy`` of one with another layout). Out: ``Estimate``: step
time, its parts (pipeline, exposed data-parallel tail, optimizer), MFU and the per-rank memory bound of
``sim.workload.footprint`` with whether it fits. An ``Estimator`` keeps the cost model, the network and per-shape
costs between calls, so screening thousands of layouts of one model on one cluster prices each GEMM shape once.

The same cost model and network as the event simulation price the pieces; what differs is the composition:
- a micro-batch's forward (backward) on stage s = its layers' blocks plus their Megatron TP collectives, which
  the compute stream waits for (Narayanan et al. SC21 Sec. 3.3), except the backward's input-gradient
  reduction, which hides under the column-parallel weight gradient; plus the embedding / head on the end stages;
- pipeline makespan by schedule, with F_s, B_s, W_s per stage and c one p2p send: GPipe / 1F1B
  sum_s(F_s+B_s) + (m-1) max_s(F_s+B_s) + 2(p-1)c (Narayanan et al. 2021 Sec. 2.2); interleaved with v
  chunks the warm-up/cool-down shrink to (p-1)(F+B)/v; ZB-H1 (p-1)(F+B-W) and ZB-H2 max(0,(p-1)(F+B-2W))
  of bubble (Qi et al. ICLR 2024 Sec. 3.1); ZB-V the bubble of H2 at chunk granularity;
- ZeRO-3 / FSDP: the data-parallel group's collectives share one NCCL stream, so a unit's forward takes
  max(compute, all-gather) (the next unit's gather hides behind this one's compute) and its backward
  max(compute, all-gather + reduce-scatter) with backward prefetch, compute + all-gather + reduce-scatter without;
- DualPipe's F&B pairs of MoE layers: the pair's span replayed block by block on the compute and ``ep`` streams
  (sim.explore.pair_replay), less than its two passes run alone by what the interleaving hides;
- the data-parallel tail: the step's gradient buckets (or units) replayed in the order the last backward frees
  them on a sequential stream, then the optimizer (on the GPU, or the host under offload) and ZeRO-1/2's weight
  all-gather; the step ends at the latest stage.
With fewer than 2p micro-batches the zero-bubble formulas do not hold (their orders keep bubbles), so those
orders are replayed at stage level instead (one task per pass and chunk, built once per (schedule, p, m)).
What it ignores and the simulation keeps (the reason the two may differ; the test allows 5%): interleaved and
zero-bubble schedules' exact warm-up order, p2p sends hidden in the steady state, reduce-scatters queueing
behind each other across micro-batches under ZeRO-2/3, and link contention.

Screening (sim.explore.search) prices each part once per what it depends on, under keys the search builds from
its layouts (``LayoutKeys``; ``_shape_key`` otherwise): a layer's times; what sets each stage apart; the stage
times and the pipeline; each stage's tail shape and memory states; the activations. Only stages whose tail
cannot set the step are skipped (``estimate``). Every float is the one a fresh Estimator gives the scenario
alone (tests/test_search_cache.py).

The estimator is a stack of one class per part, each in a module of its own (as sim.workload's emitters):
``estimate_blocks.BlockPricing`` (the state and caches; a layer's pieces with their TP and CP collectives, a pipeline
send, a data-parallel collective) < ``estimate_moe.MoePricing`` (a MoE layer, DualPipe's pairs) <
``estimate_stages.StagePricing`` (a layer's and each stage's times) < ``estimate_pipeline.PipelineComposition`` (the
makespan by schedule) < ``estimate_tail.DataParallelTail`` (the data-parallel tail and optimizer) <
``estimate_gathers.WeightGathers`` (weight all-gathers before the forward) < ``estimate_memory.MemoryBound`` (the memory
bound) < ``Estimator`` (here: the step put together). The records they pass are in ``estimate_records``, the cache keys
in ``estimate_keys``.
"""

from __future__ import annotations

from typing import Any

from sim.explore.estimate_keys import _MEMORY_FREE, _STAGES_FREE, LayoutKeys, _shape_key
from sim.explore.estimate_memory import MemoryBound
from sim.explore.estimate_pipeline import PRICED_AS, _work_bound
from sim.explore.estimate_records import Estimate, _ShapeParts, _Timing
from sim.plan import Plan, resolve
from sim.spec.degrees import Degrees
from sim.spec.scenario import Scenario
from sim.workload import step

__all__ = ["PRICED_AS", "Estimate", "Estimator", "LayoutKeys", "estimate"]


class Estimator(MemoryBound):
    """A scenario's closed-form estimate (``estimate``) over the stack of one class per part (the module's docstring),
    kept between calls so that layouts share what they price alike."""

    # Skip the tails of stages that cannot set the step (``estimate``); False works every stage's tail out (the
    # tests compare both).
    skip_tails = True

    def estimate(self, sc: Scenario, keys: LayoutKeys | None = None, implied: Degrees | None = None) -> Estimate:
        """The estimate of ``sc``. ``keys``: where ``sc`` is a search candidate (its base with one layout), the
        layout's cache keys (``LayoutKeys``), which spare working out ``_shape_key`` and let the parts a layout
        shares with others (stage times and the pipeline, the stages' memory parts, the tails' shapes) be
        looked up without pricing them again; the floats are the same either way. ``implied``: ``sc``'s degrees,
        where the caller has them (``check_rules`` returns them)."""
        plan = resolve(sc, implied)  # its facts are worked out where a part is priced for the first time
        if keys is None:
            stages_free = _shape_key(sc, _STAGES_FREE)
            keys = LayoutKeys(stages_free, _shape_key(sc), _shape_key(sc, _MEMORY_FREE), stages_free, stages_free,
                              stages_free, sc)
        shape_key = keys.shape
        parts = self._shape_parts.get(shape_key)
        if parts is None:
            parts = self._shape_parts[shape_key] = self._parts_of_shape(plan, keys)
        # stage times and the pipeline: shared by the layouts that differ only in a ZeRO stage that gathers
        # nothing per unit, or gathers once per step outside the stages' times (FSDP + PP, Plan.pipelined_fsdp)
        stages_key = (keys.stages, parts.stages_zero)
        found = self._stage_times.get(stages_key)
        if found is None:
            stages = self._stages(plan, keys)
            # the owner keeps the objects the keys name alive
            found = self._stage_times[stages_key] = (stages, self._pipeline(plan, stages), _work_bound(stages),
                                                     self._timing(plan), keys.owner)
        stages, (pipeline, ends), slowest_pass, timing, _ = found
        step_s, exposed_dp, optimizer = pipeline, 0.0, 0.0
        delay = self._gather_delay(plan, stages, timing, parts)
        # A stage whose tail is of a kind already worked out for another stage with the same times (an even
        # pipeline's middle stages) is skipped where it cannot set the step: its exposed tail is at most that
        # stage's or, had its backward ended before the buckets could all run from the step start, their sum
        # less its backward's end (the tail's buckets wait for when gradients become final, at fixed offsets
        # from the backward's end), with a margin far above the floats' rounding. What it skips never changes
        # the result: only a stage above the step so far does.
        if parts.pipelined_fsdp and parts.data_parallel and not sc.parallel.overlap_grad_reduce:
            # FSDP + PP without overlap_grad_reduce: a stage's chunk reduce-scatters, after its last backward, run
            # before that backward's send (the emitter's _reduce: the next task waits), so every stage below
            # starts its last backward that much later (llama2-7b spine pp 2, dp 2: 9.6 ms, 2.4% of the step)
            ends, held = list(ends), 0.0
            for s in range(len(ends) - 1, -1, -1):
                ends[s], held = ends[s] + held, held + parts.tails[s].per_microbatch
        exposed_of: dict[tuple[int, int, Any], float] = {}
        after_weight = timing.after_weight  # a split backward's passes after each chunk's last W differ by stage
        skip = self.skip_tails
        for s, (st, end, shape) in enumerate(zip(stages, ends, parts.tails, strict=True)):
            trailing = after_weight[s] if after_weight is not None else None
            seen = exposed_of.get((shape.kind, id(st), trailing)) if skip else None
            if seen is not None:
                most = max(seen, shape.per_microbatch - end)
                most += 1e-9 * (abs(end) + abs(seen) + shape.per_microbatch)
                if end + delay + most + shape.optimizer < step_s:
                    continue
            exposed, opt = self._tail(plan, s, st, end, shape, timing, parts)
            if not shape.experts and shape.copies is None:
                exposed_of[shape.kind, id(st), trailing] = exposed
            if end + delay + exposed + opt > step_s:
                step_s, exposed_dp, optimizer = end + delay + exposed + opt, delay + exposed, opt
        gpu = sc.cluster.gpu
        # the documents' FLOPs (fine-tuning methods, padding, packing) and the GPU's peak: one per base, whatever
        # its layout
        flops_key = keys.base
        if flops_key not in self._flops:
            self._flops[flops_key] = (plan.model_flops_per_step, plan.num_gpus, gpu.peak(plan.dtype), keys.owner)
        flops, gpus, peak_flops, _ = self._flops[flops_key]
        tflops = flops / gpus / step_s / 1e12
        peak = self._peak_memory(plan, keys)
        bound = timing.visits * slowest_pass
        return Estimate(step_s, pipeline, exposed_dp, optimizer, tflops * 1e12 / peak_flops, tflops, peak,
                        peak <= gpu.hbm_capacity, bound)

    def _parts_of_shape(self, plan: Plan, keys: LayoutKeys) -> _ShapeParts:
        """What a layout's estimate reads that its shape (``keys.shape``) decides (``_ShapeParts``)."""
        shape_key = keys.shape
        # A stage's gradient statistics are all-reduced over its model-parallel group (or every rank): groups of
        # one shape on every stage, so priced once (its group and bytes are the same for every micro-batch size).
        stat_reduce = self.net.collective_time("all_reduce", step.GRAD_STAT_BYTES, step.grad_stats_group(plan, 0))
        units = plan.pipelined_fsdp and plan.data_parallel  # FSDP + PP's unit gathers (_unit_gather_delay)
        tails = [self._tail_shape(plan, s, stat_reduce, shape_key) for s in range(plan.pp)]
        ends = self._unit_gather_ends(plan, shape_key) if units else None
        gates = [self._param_gates(plan, s) for s in range(plan.pp)] if step.overlaps_param_gather(plan) else None
        return _ShapeParts(plan.zero_stage if plan.gathers_units and not plan.pipelined_fsdp else None,
                           gates, ends, plan.unit_layers, tails, plan.data_parallel,
                           plan.zero_stage, plan.pipelined_fsdp, keys.owner)

    def _timing(self, plan: Plan) -> _Timing:
        """What a layout's estimate reads that its stage times decide (``_Timing``)."""
        # each micro-batch passes every stage once; in DualPipe's two copies it visits one of each rank's two chunks
        visits = plan.microbatches / 2 if plan.layout == "dual" else plan.microbatches
        return _Timing(self._p2p(plan), plan.microbatches, visits, plan.pp, plan.vpp, plan.local_chunks,
                       plan.scenario.schedule == "interleaved", self._after_last_weight(plan))


def estimate(scenario: Scenario) -> Estimate:
    return Estimator(scenario).estimate(scenario)
