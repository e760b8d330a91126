"""Each pipeline stage's forward, backward and weight-gradient times for one micro-batch.

In: ``MoePricing`` (a dense and a MoE layer's pieces) and a ``Plan`` with its ``LayoutKeys``. Out: ``StagePricing``: one
layer's times (``_layer_times``, kept per ``LayoutKeys.layer``); what sets each stage apart (``_stage_shapes``: its
layers, MoE, recomputed, frozen and offloaded layers, embedding, head, blocking sends, DualPipe's pairs; kept per
``LayoutKeys.structure``); each stage's ``StageTimes`` (``_stages``): its layers' times with ZeRO-3 / FSDP's exposed
gathers per unit (``_sharded_unit_overhead``), full recomputation's forward, activation offload's exposed copies, the
embedding and head, blocking sends, and what its F&B pairs hide.
"""

from __future__ import annotations

from typing import Any

from sim.costs.models import ComputePhase
from sim.explore.estimate_keys import LayoutKeys
from sim.explore.estimate_moe import MoePricing
from sim.explore.estimate_records import _LayerTimes, _PairBlocks, _StageShape
from sim.explore.pair_replay import Block
from sim.explore.stage_replay import StageTimes
from sim.parallel.schedules import combined_pairs
from sim.plan import Plan
from sim.workload import step


class StagePricing(MoePricing):
    """A layer's and each stage's times per micro-batch (a base of sim.explore.estimate's ``Estimator``)."""

    def _layer_times(self, plan: Plan, key: Any) -> _LayerTimes:
        """One layer's forward, backward and weight-gradient times (``_LayerTimes``), kept per ``key`` (the search
        keys it by what a layer's work and its TP, CP and expert collectives depend on: not the pipeline)."""
        found = self._layers.get(key)
        if found is not None:
            return found[0]
        split = plan.splits_backward
        group = plan.grid.tp_group(0)
        times = [self.net.collective_time(op, plan.tp_bytes, group) for op in step.tp_ops(plan) if op]  # per block
        tp_comm = sum(times) if times else 0.0
        bwd: ComputePhase = "input_grad" if split else "backward"
        chunked = self._chunked_collectives(plan)  # TE's userbuffers: the collectives' exposed and hidden chunks
        if chunked is None:
            fwd_layer = sum(self._price(plan, b, "forward") for b in step.BLOCKS) + 2 * tp_comm
        else:
            fwd_layer = sum(self._chunked_forward(plan, b, "forward", chunked) for b in step.BLOCKS)
        overlapped = not split and step.overlaps_backward(plan, self._price(plan, "mlp_column", "weight_grad"))
        if overlapped:
            bwd_layer = sum(self._overlapped_backward(plan, b, times, chunked) for b in step.BLOCKS)
        elif chunked is not None:  # the output gradient's gather in chunks beside the block, then its reduction
            (head, body), _ = chunked
            bwd_layer = sum(head + max(self._price(plan, b, bwd), body) for b in step.BLOCKS) + 2 * (
                times[1] + step.reduce_partials_seconds(plan, self.costs))  # AsyncTP: each reduction after it
        else:
            bwd_layer = sum(self._price(plan, b, bwd) + self._regather(plan) for b in step.BLOCKS) + 2 * tp_comm
        bwd_layer += self._selective_dense(plan, tp_comm)
        cp_f, cp_b = self._cp_exposed(plan, bwd)
        fwd_layer, bwd_layer = fwd_layer + cp_f, bwd_layer + cp_b
        w_layer = sum(self._price(plan, b, "weight_grad") for b in step.BLOCKS) if split else 0.0
        frozen = self._frozen_layer(plan, bwd, tp_comm, split)  # method frozen: (backward, W) of a frozen layer
        dense = moe = (0.0, 0.0, 0.0)
        pair = None
        rebuilt_moe = 0.0
        if plan.is_moe:
            dense = (fwd_layer, bwd_layer, w_layer)
            moe_f, moe_b, moe_w, moe_forward, moe_backward = self._moe_layer(plan, times, overlapped)
            moe = (moe_f, moe_b, moe_w)
            rebuilt_moe = self._rebuilt_moe(plan, moe_f, moe_b, moe_forward, moe_backward,
                                            self._moe_host_lead(plan, times))
            lead = 0.0 if plan.tp > 1 else None  # a dense layer's passes start with SP's all-gather
            pair = _PairBlocks(((Block(fwd_layer, None, 0.0, 0.0, lead),), (Block(bwd_layer, None, 0.0, 0.0, lead),)),
                               (moe_forward, moe_backward))
        layer = _LayerTimes(split, bwd, fwd_layer, bwd_layer, w_layer, frozen, dense, moe, pair, rebuilt_moe)
        self._layers[key] = (layer, plan.scenario)  # the scenario keeps the objects the key names alive
        return layer

    def _stages(self, plan: Plan, keys: LayoutKeys) -> list[StageTimes]:
        """Each stage's forward, backward and weight-gradient times for one micro-batch (``StageTimes``), from its
        layers' (``_layer_times``) and what sets the stage apart (``_stage_shapes``)."""
        split, bwd, fwd_layer, bwd_layer, w_layer, frozen, dense, moe, pair, rebuilt_moe = self._layer_times(plan,
                                                                                                        keys.layer)
        c = self._p2p(plan)
        shapes, of_stage = self._stage_shapes(plan, keys.structure)
        priced: list[StageTimes] = []  # stages of one shape (most of an even pipeline's) priced once
        for shape in shapes:
            (layers, moe_layers, recomputed, recomputed_moe, frozen_layers, offloaded, first_layer, embedding, head,
             sends, pair_chunks, pair_mix) = shape
            share_of = max(layers, 1)  # a stage may hold no layer (the pipeline-split slots: embedding, loss only)
            # Full recomputation adds a forward to the backward of the layers it rebuilds (all, or the first
            # recompute_num_layers of each chunk); FSDP's gather overhead sees the stage's average layer.
            rebuilt = fwd_layer * recomputed
            if plan.is_moe:  # the stage's average layer, its dense and MoE layers mixed (and those it rebuilds)
                n = moe_layers
                fwd_layer, bwd_layer, w_layer = (((layers - n) * d + n * e) / share_of for d, e in zip(dense, moe,
                                                                                                     strict=True))
                rebuilt = (recomputed - recomputed_moe) * dense[0] + recomputed_moe * rebuilt_moe
            layer_bwd = bwd_layer + rebuilt / share_of
            layer_w = w_layer
            if frozen is not None:  # the stage's average layer, its frozen layers without weight gradients
                share = frozen_layers / share_of
                layer_bwd += share * (frozen[0] - bwd_layer)
                layer_w += share * (frozen[1] - w_layer)
            fsdp_f, fsdp_b = self._sharded_unit_overhead(plan, fwd_layer, layer_bwd)
            f, b, w = layers * (fwd_layer + fsdp_f), layers * (layer_bwd + fsdp_b), layers * layer_w
            if offloaded:  # activation offload: each copy hides under the next layer's pass, the rest is exposed
                copy = step.activation_copy_seconds(plan, first_layer)
                # TE's on-GPU copy into its ping-pong buffer runs on the compute stream before each PCIe copy,
                # so a copy hides under the next layer's forward and, when that layer offloads too (the first
                # layers offload), under its buffer copy as well (sim.workload.layer_emit's LayerEmitter._layer)
                buffer = step.offload_buffer_copy_seconds(plan, first_layer, self.costs)
                f += offloaded * buffer + max(0.0, copy - fwd_layer - fsdp_f)
                f += (offloaded - 1) * max(0.0, copy - fwd_layer - fsdp_f - buffer)
                b += offloaded * max(0.0, copy - layer_bwd - fsdp_b)
            for piece, holds in (("embedding", embedding), ("head", head)):
                if holds:
                    f += self._price(plan, piece, "forward") + (self._loss_comm(plan) if piece == "head" else 0.0)
                    b += self._price(plan, piece, bwd)
                    w += self._price(plan, piece, "weight_grad") if split else 0.0
            sends_f, sends_b = sends
            overlap = self._pair_overlap(plan, pair, pair_chunks, pair_mix) if pair is not None and pair_chunks else 0.0
            # the pass after which a layer's gradients are final: its backward, or under a split backward its
            # weight-gradient pass (the emitter's grad_ready is the W task: sim.workload.build.weight_grad)
            final = layer_w if split else layer_bwd + fsdp_b
            priced.append(StageTimes(f + sends_f * c, b + sends_b * c, w, final, layers, overlap, layers * fsdp_b))
        return [priced[index] for index in of_stage]

    def _stage_shapes(self, plan: Plan, key: Any) -> tuple[list[_StageShape], list[int]]:
        """What sets each stage's times apart (``_StageShape``): the distinct shapes, in the order of the first
        stage of each, and each stage's index into them; kept per ``key``, which names the pipeline's structure
        (sim.explore.search keys it by pp, vpp, schedule and recomputation alone)."""
        found = self._structures.get(key)
        if found is not None:
            return found[0]
        frozen = step.frozen_layer_blocks(plan) is not None
        # DualPipe's F&B pairs (and Megatron's combined 1F1B under moe.a2a_overlap) interleave their MoE layers
        # (Estimator._pair_overlap): what each local chunk runs, as the emitter's forward and backward do (the
        # embedding on model chunk 0, the head on the last)
        pairs = plan.is_moe and (plan.scenario.schedule.startswith("dualpipe") or plan.a2a_overlap)
        mixes = [combined_pairs(plan.pp, plan.vpp, s) for s in range(plan.pp)] if plan.a2a_overlap else None
        last = plan.pp * plan.vpp - 1
        shapes: dict[_StageShape, int] = {}
        of_stage = []
        for s in range(plan.pp):
            offloaded = plan.offloaded_layers(s)
            recomputed = plan.recomputed_layers(s)
            pair_chunks = tuple((g == 0, g == last, tuple((plan.moe_layers[layer], plan.recomputes(layer))
                                                          for layer in plan.chunk_layers(g)))
                                for g in plan.stage_chunks[s]) if pairs else ()
            shape = _StageShape(
                plan.stage_layers(s), plan.stage_moe_layers(s) if plan.is_moe else 0, recomputed,
                sum(plan.moe_layers[layer] and plan.recomputes(layer) for layer in step.stage_layer_ids(plan, s))
                if plan.is_moe and recomputed else 0,
                sum(plan.peft.layer_frozen(layer) for layer in step.stage_layer_ids(plan, s)) if frozen else 0,
                offloaded, plan.chunk_layers(plan.stage_chunks[s][0])[0] if offloaded else -1,
                plan.holds_embedding(s), plan.holds_head(s), _blocking_sends(plan, s), pair_chunks,
                mixes[s] if mixes is not None else ())
            of_stage.append(shapes.setdefault(shape, len(shapes)))
        # the scenario keeps the objects the key names alive
        self._structures[key] = ((list(shapes), of_stage), plan.scenario)
        return list(shapes), of_stage

    def _sharded_unit_overhead(self, plan: Plan, fwd_layer: float, bwd_layer: float) -> tuple[float, float]:
        """ZeRO-3 / FSDP: per layer, the all-gather (and reduce-scatter) time the compute cannot hide (FSDP's
        prefetch). The gathers and reductions are the emitter's (``step.gather_calls`` per unit, the embedding in
        the first unit and the head in the last, ``step.reduce_buckets``), priced as every data-parallel collective
        (``_dp_collective``) and spread over the layers: on a slow network the group's stream runs them back to
        back and sets the pace (llama2-7b spine, ZeRO-3 pp 1: the first and last units are 1.6x the others)."""
        if not plan.gathers_units or not plan.data_parallel or plan.pipelined_fsdp:  # FSDP + PP: _unit_gather_delay
            return 0.0, 0.0
        group, layers = plan.shard_group(0), plan.model.num_layers
        units = layers // plan.unit_layers
        # the units between the first and the last gather alike (a middle one stands for them): 3 priced, not all
        counts = {0: 1, units - 1: 1} if units > 1 else {0: 1}
        if units > 2:
            counts[units // 2] = units - 2
        gather = sum(count * self._dp_collective(plan, "all_gather", params * plan.weight_bytes_per_param, group)
                     for unit, count in counts.items() for params in step.gather_calls(plan, unit)) / layers
        # the reduce-scatters of one micro-batch's backward (SHARD_GRAD_OP: one per unit), and under HYBRID_SHARD
        # the all-reduce of each reduced shard over the replicas (on their own stream)
        reductions = [(1, params) for _, params in step.reduce_buckets(plan)] \
            if plan.zero_stage >= 3 and plan.deepspeed is not None else \
            [(count, step.unit_grad_params(plan, unit)) for unit, count in counts.items()]  # FSDP: one per unit
        reduce = replicas = 0.0
        for count, params in reductions:
            nbytes = params * plan.grad_bytes_per_param
            reduce += count * self._dp_collective(plan, "reduce_scatter", nbytes, group)
            if plan.hybrid:
                replicas += count * self._dp_collective(plan, "all_reduce", nbytes / len(group),
                                                        plan.replica_group(0))
        reduce, replicas = reduce / layers, replicas / layers
        network, gpu = plan.scenario.network, plan.scenario.cluster.gpu
        held = network.nccl_sms / (gpu.sms or 1) if network.nccl_sms else 0.0
        forward = _overlap_cost(fwd_layer, gather, held)
        # Without overlap_grad_reduce (DeepSpeed's overlap_comm false) the compute waits for each reduce-scatter
        # and, under HYBRID_SHARD, the replicas' all-reduce after it (the emitter's _reduce): counted here, not in
        # the tail (_tail), as the next unit's gather still runs beside the compute
        blocking = not plan.scenario.parallel.overlap_grad_reduce
        if plan.zero_stage < 3:  # SHARD_GRAD_OP gathers nothing in the backward: its reduce-scatters run alone
            if blocking:
                return forward, reduce + replicas
            # The group's stream runs a micro-batch's gathers, then its reduce-scatters, each chain beside the
            # compute it feeds or follows: two two-machine flow shops of like jobs, whose makespan is the busier
            # machine's sum plus the other's one job at the turn (Johnson 1954): the last unit's forward (or the
            # first gather) and the first unit's backward (or the last reduce-scatter), per micro-batch. Spread
            # over the layers (pp 1: the stage holds them all). llama2-7b spine pp 1: -2.0% -> +0.1%; with the
            # spine not oversubscribed (the gathers faster than the forward) -3.8% -> -1.7%
            turn = plan.unit_layers / layers * (min(gather, fwd_layer) + min(reduce, bwd_layer))
            return forward, _overlap_cost(bwd_layer, reduce, held) + turn
        both = gather + reduce  # one stream: the next unit's gather and this unit's reduce-scatter queue
        if not plan.prefetch:  # the gather issued when its unit is reached, after the previous reduce-scatter
            return forward, both + (replicas if blocking else 0.0)
        if blocking:
            return forward, _overlap_cost(bwd_layer, gather, held) + reduce + replicas
        return forward, _overlap_cost(bwd_layer, both, held)


def _blocking_sends(plan: Plan, stage: int) -> tuple[int, int]:
    """(forward sends, backward sends) one micro-batch costs ``stage``'s compute stream when sends block
    (``parallel.overlap_p2p_comm: false``): one per local chunk whose neighbour chunk is on another stage."""
    if plan.scenario.parallel.overlap_p2p_comm or plan.pp == 1:
        return 0, 0
    last = plan.pp * plan.vpp - 1
    forward = backward = 0
    for copy, g in enumerate(plan.stage_chunks[stage]):  # copy: DualPipe's model copy (the local chunk there)
        forward += g < last and plan.chunk_location(g + 1, copy)[0] != stage
        backward += g > 0 and plan.chunk_location(g - 1, copy)[0] != stage
    return forward, backward


def _overlap_cost(compute: float, comm: float, held: float) -> float:
    """Time a layer's compute and the collective beside it add to the compute alone: the compute loses ``held``
    (NCCL's share of the SMs, sim.engine.sm_contention) of the seconds it overlaps, and what the compute cannot hide
    of the collective is exposed."""
    stretched = compute / (1.0 - held) if comm * (1.0 - held) >= compute else compute + held * comm
    return stretched - compute + max(0.0, comm - stretched)
