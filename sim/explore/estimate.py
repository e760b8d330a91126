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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from sim.costs.host import host_bound
from sim.costs.models import ComputePhase, CostModel, Work
from sim.explore.pair_replay import Block, alone, chain, pair_span
from sim.explore.stage_replay import StageTimes, Unit, pass_dependencies, stage_level_replay
from sim.model.params import layer_params
from sim.network import models as network_models
from sim.network.flows import FlowNetwork
from sim.parallel.context import ring_makespan
from sim.parallel.grid import lockstep_groups
from sim.parallel.schedules import combined_pairs
from sim.plan import Plan, resolve
from sim.runner import build_topology
from sim.spec.degrees import Degrees
from sim.spec.scenario import FsdpSpec, Scenario
from sim.workload import footprint, step


@dataclass(frozen=True)
class Estimate:
    step_time_s: float
    pipeline_s: float
    exposed_dp_s: float
    optimizer_s: float
    mfu: float
    tflops_per_gpu: float
    peak_memory_bytes: float
    fits_in_memory: bool
    bound_s: float  # no layout's step is shorter: each stage runs its m micro-batches' work back to back


# Schedules whose stage times and makespan the estimate prices alike (``Estimator._pipeline``): GPipe runs 1F1B's
# passes (no split backward, one chunk per stage) and its makespan has the same form, only its memory differs.
PRICED_AS = {"gpipe": "1f1b"}


class Estimator:
    # Skip the tails of stages that cannot set the step (``estimate``); False works every stage's tail out (the
    # tests compare both).
    skip_tails = True

    def __init__(self, scenario: Scenario, costs: CostModel | None = None,
                 network: network_models.Network | None = None) -> None:
        plan = resolve(scenario)
        self.costs = costs or step.make_costs(plan)
        spec = scenario.network
        contention = spec.model == "contention"
        # the cluster's topology (built once per cluster, sim.runner), only where a network model is made here
        self.net = network or network_models.make("analytic" if contention else spec.model, build_topology(plan),
                                                  spec.algorithm, spec.protocol, plan.deepep_traffic)
        self.flows: network_models.FlowLevelNetwork | None = (
            network_models.ContentionNetwork(build_topology(plan), spec.algorithm, spec.protocol,
                                             plan.deepep_traffic)
            if contention else None)
        self._compute: dict[Any, float] = {}
        self._concurrent: dict[Any, float] = {}
        self._blocks: dict[Any, step.Blocks] = {}
        self._moe_blocks: dict[Any, dict[str, Work]] = {}
        self._orders: dict[tuple[str, int, int, int, bool], tuple[int, list[Unit]]] = {}
        self._replays: dict[Any, tuple[float, list[float]]] = {}
        self._stage_times: dict[Any, tuple[list[StageTimes], tuple[float, list[float]], float, _Timing, Any]] = {}
        self._shape_parts: dict[Any, _ShapeParts] = {}
        self._tail_shapes: dict[Any, tuple[_TailShape, Scenario]] = {}
        self._layers: dict[Any, tuple[_LayerTimes, Scenario]] = {}
        self._structures: dict[Any, tuple[tuple[list[_StageShape], list[int]], Scenario]] = {}
        self._sends: dict[tuple[float, int, int], float] = {}
        self._tail_kinds: dict[tuple[Any, ...], int] = {}
        self._flops: dict[Any, tuple[float, int, float, Any]] = {}
        self._unit_gathers: dict[Any, tuple[list[list[list[float]]], Scenario]] = {}
        # per shape, each stage that may peak: (stage, the resident parts' sum (footprint.parts_total), gathered
        # weights, unreduced gradients); per activations key, those stages' activations
        self._memory_states: dict[Any, tuple[list[tuple[int, float, float, float]], Any]] = {}
        self._activations: dict[Any, list[float]] = {}
        self._stashes: dict[Any, float] = {}
        self._peak_stages: dict[Any, tuple[list[int], Any]] = {}  # the stages that may peak, per structure
        self._units: dict[Any, tuple[list[step.ChunkUnit], Scenario]] = {}
        self._shape_of: tuple[Plan | None, tuple[Any, ...]] = (None, ())  # the last plan _price saw, its shape

    # ---------------------------------------------------------------------------------------- pieces
    def _price(self, plan: Plan, what: str, phase: ComputePhase) -> float:
        """Seconds of one piece of a layer (a block, its column-parallel GEMMs ``<block>_column``, the
        ``selective`` attention core) or the ``embedding`` / ``head`` (sim.workload.step.Blocks), cached by shape."""
        if plan is self._shape_of[0]:  # a layout's pieces are priced one after another: its shape found once
            shape = self._shape_of[1]
        else:
            t = plan.scenario.training
            shape = (plan.micro_batch, plan.seq_len, plan.tp, plan.sequence_parallel, t.flash_attention,
                     t.fused_kernels, t.causal_attention, plan.recompute_modules, plan.cp, plan.cp_comm_type,
                     plan.attention_work, plan.peft.method, plan.dtype, step.fp8_casts(plan), _fsdp_grad_key(plan),
                     step.tp_overlap_chunks(plan), step.tp_overlap_chunk_gemms(plan), t.cross_entropy)
            self._shape_of = (plan, shape)  # holding the plan keeps its id from being reused
        key = (what, phase, shape)
        if key not in self._compute:
            if shape not in self._blocks:  # one layer's ops per shape, for all its pieces and phases
                self._blocks[shape] = step.blocks(plan)
            self._compute[key] = self.costs.compute_time(_work(self._blocks[shape], what), phase)
        return self._compute[key]

    def _loss_comm(self, plan: Plan) -> float:
        """Seconds of the loss's blocking TP collectives after the head's forward (step.loss_collectives; 0 unless
        Megatron's unfused loss runs under TP), on the compute stream's path as the emitter orders them."""
        group = plan.grid.tp_group(0)
        return sum(self.net.collective_time(op, nbytes, group) for op, nbytes in step.loss_collectives(plan))

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
            bwd_layer = sum(self._price(plan, b, bwd) for b in step.BLOCKS) + 2 * tp_comm
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
                # layers offload), under its buffer copy as well (sim.workload.build's _layer)
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
            priced.append(StageTimes(f + sends_f * c, b + sends_b * c, w, final, layers, overlap))
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

    def _selective_dense(self, plan: Plan, tp_comm: float) -> float:
        """Seconds selective recomputation adds to a dense layer's backward (the emitter's
        ``_selective_recompute``): the replayed attention-side ops, the pre-MLP norm, and with module ``mlp`` the
        MLP module with its TP collectives."""
        if not plan.recompute_modules:
            return 0.0
        mlp = self._price(plan, "recompute_mlp", "forward") + (tp_comm if "mlp" in plan.recompute_modules else 0.0)
        return self._price(plan, "recompute_attention", "forward") + mlp

    def _frozen_layer(self, plan: Plan, bwd: ComputePhase, tp_comm: float,
                      split: bool) -> tuple[float, float] | None:
        """(backward, weight-gradient pass) of a layer ``training.method: frozen`` freezes: its linears run their
        input gradients only, so no asynchronous reduction hides under a weight gradient (step.frozen_layer_blocks,
        as the emitter runs it). None without such layers."""
        work = step.frozen_layer_blocks(plan)
        if work is None:
            return None
        block, _ = work
        backward = sum(self.costs.compute_time(block[b], bwd) for b in step.BLOCKS) + 2 * tp_comm
        weight = sum(self.costs.compute_time(block[b], "weight_grad") for b in step.BLOCKS) if split else 0.0
        return backward, weight
    def _moe_price(self, plan: Plan, name: str, phase: ComputePhase) -> float:
        """Seconds of one piece of a MoE layer's MLP part (sim.workload.step.moe_blocks), cached by shape."""
        t = plan.scenario.training
        shape = ("moe", plan.micro_batch, plan.local_seq_len, plan.tp, plan.sequence_parallel, plan.etp,
                 plan.local_experts, plan.routed_tokens, plan.dtype, t.fp8_cast_kernels, t.fp8_weight_cache,
                 plan.microbatches, plan.recompute_modules)
        key = (name, phase, shape)
        if key not in self._compute:
            if shape not in self._moe_blocks:
                self._moe_blocks[shape] = step.moe_blocks(plan) | {
                    f"recompute_{block}": work for block, work in step.moe_recompute(plan).items()}
            work = self._moe_blocks[shape][name]
            self._compute[key] = self.costs.compute_time(work, phase) if work.ops else 0.0
        return self._compute[key]

    def _exchanges(self, plan: Plan, exchanges: tuple[step.Exchange, ...]) -> float:
        """A MoE layer's dispatch or combine: its collectives one after another on the ``ep`` stream."""
        return sum(step.exchange_seconds(plan, self.net, ex) for ex in exchanges)

    def _moe_layer(self, plan: Plan, times: list[float],
                   overlapped: bool) -> tuple[float, float, float, tuple[Block, ...], tuple[Block, ...]]:
        """(forward, backward, weight-gradient pass, forward blocks, backward blocks) of one MoE layer, as the
        workload emits it (``_moe_forward`` / ``_moe_backward``): the attention block with its TP collectives, then
        router -> dispatch beside the shared expert (with its SP all-gather and reduce-scatter) -> experts ->
        combine -> unpermute; the backward mirrors it, the dispatch's gradient exchange beside the shared expert's
        backward (and selective recomputation's replay of it).

        The blocks (sim.explore.pair_replay.Block) are the layer's passes cut where a DualPipe F&B pair cuts them
        (``_StageEmitter._interleave_pair``: before each compute task that waits for an ``ep`` exchange), for
        ``_pair_overlap``: forward attention+router | experts | unpermute, backward [module moe's replayed forward]
        unpermute | experts | router+attention; each pass is its blocks run alone (``pair_replay.alone``)."""
        split = plan.splits_backward
        bwd: ComputePhase = "input_grad" if split else "backward"
        tp_comm = sum(times) if times else 0.0
        dispatch = self._exchanges(plan, step.dispatch_exchanges(plan))
        combine = self._exchanges(plan, step.combine_exchanges(plan))
        price = self._moe_price
        shared_tp = tp_comm if price(plan, "moe_shared", "forward") > 0 else 0.0
        chunked = self._chunked_collectives(plan)
        attention_f = (self._price(plan, "attention", "forward") + tp_comm if chunked is None
                       else self._chunked_forward(plan, "attention", "forward", chunked))
        attention_b = (self._overlapped_backward(plan, "attention", times, chunked) if overlapped
                       else self._price(plan, "attention", bwd) + tp_comm)
        attention_b += self._price(plan, "recompute_attention", "forward")
        cp_f, cp_b = self._cp_exposed(plan, bwd)
        attention_f, attention_b = attention_f + cp_f, attention_b + cp_b
        # the MoE part's forward: router -> dispatch beside the shared expert -> experts -> combine -> unpermute.
        # The shared expert's SP all-gather waits for the router and the expert for the gather; its
        # reduce-scatter only the pass's experts wait for (MoeLayerEmitter.shared_expert).
        gather, reduce = times if shared_tp > 0 else (0.0, 0.0)  # MoE with TP runs SP (Megatron-Core's rule)
        mlp_forward = (Block(price(plan, "moe_router", "forward"), dispatch,
                             gather + price(plan, "moe_shared", "forward"), reduce,
                             price(plan, "moe_router", "forward") if shared_tp > 0 else None),
                       Block(price(plan, "moe_experts", "forward"), combine, 0.0),
                       Block(price(plan, "moe_combine", "forward"), None, 0.0))
        lead = 0.0 if plan.tp > 1 else None  # the attention block starts with SP's all-gather (MoE with TP runs SP)
        forward_blocks = tuple(chain([(Block(attention_f, None, 0.0, 0.0, lead),), mlp_forward]))
        # Selective recomputation (the emitter's _selective_recompute and _moe_backward): module moe runs the MoE
        # forward again before its backward; else the pre-MLP norm, moe_act's activation and the shared expert,
        # the last beside the dispatch's gradient as the emitter issues it. The backward's first SP all-gather
        # waits only for the unpermute's backward (its source), so on the TP stream it runs beside the combine's
        # gradient exchange and the experts' backward; only what outlasts them is exposed.
        shared_again = price(plan, "recompute_moe_shared", "forward")
        shared_b = (price(plan, "moe_shared", bwd) + (shared_again + reduce + gather if shared_again > 0 else 0.0)
                    + max(0.0, gather - dispatch - price(plan, "recompute_moe_experts", "forward")
                          - price(plan, "moe_experts", bwd)))
        replayed = mlp_forward if "moe" in plan.recompute_modules else ()
        backward_blocks = tuple(chain([replayed, (
            Block(price(plan, "recompute_moe_router", "forward") + price(plan, "moe_combine", bwd), dispatch, 0.0),
            Block(price(plan, "recompute_moe_experts", "forward") + price(plan, "moe_experts", bwd), combine,
                  shared_b, reduce),
            Block(price(plan, "moe_router", bwd) + attention_b, None, 0.0, 0.0,
                  None if lead is None else price(plan, "moe_router", bwd)))]))
        weight = (self._price(plan, "attention", "weight_grad")
                  + sum(price(plan, name, "weight_grad") for name in ("moe_router", "moe_shared", "moe_experts"))
                  if split else 0.0)
        # behind the dispatcher's host sync a pass lasts at least the host's time to issue it (sim.costs.host),
        # counted as the simulation counts it: from the end of the forward's first task where that is SP's
        # all-gather (LayerEmitter._moe_host: a collective's length is the network's)
        host = plan.moe_host_seconds
        return (host_bound(alone(forward_blocks), self._moe_host_lead(plan, times) + host["forward"]),
                host_bound(alone(backward_blocks), host["backward"]), weight, forward_blocks, backward_blocks)

    def _moe_host_lead(self, plan: Plan, times: list[float]) -> float:
        """Seconds of a MoE layer forward before the host's issue time counts (the simulation's
        ``LayerEmitter._moe_host``: from the end of the pass's first task where that is a collective, whose length
        is the network's): SP's all-gather that starts the attention block under TP without chunked overlap."""
        return times[0] if plan.tp > 1 and times and self._chunked_collectives(plan) is None else 0.0

    @staticmethod
    def _rebuilt_moe(plan: Plan, forward: float, backward: float, forward_blocks: tuple[Block, ...],
                     backward_blocks: tuple[Block, ...], lead: float = 0.0) -> float:
        """Seconds full recomputation adds to a MoE layer's backward (``forward`` and ``backward``: its passes,
        each host-bound on its own; the blocks: their device work, ``_moe_layer``). The emitter reruns the layer's
        forward, host sync and eager ops included, inside the backward pass, so the host issues both in one pass
        (sim.workload.build's ``_layer_tasks``): the rebuilt backward lasts max(device forward + backward, host
        forward + backward), not the sum of the two passes' maxima (Qwen3-235B tp 4, pp 8, vpp 12, micro-batch 2,
        ep 4, full recomputation: +5.4% over the simulation that way); the host's time counted from the end of the
        rebuilt pass's first task where that is SP's all-gather (``lead``, as ``_moe_layer``). Without a host
        bound: the forward."""
        host = plan.moe_host_seconds
        if not host["forward"] and not host["backward"]:
            return forward
        return host_bound(alone(forward_blocks) + alone(backward_blocks),
                          lead + host["forward"] + host["backward"]) - backward

    def _pair_overlap(self, plan: Plan, pair: _PairBlocks, chunks: tuple[_ChunkLayers, ...],
                      mix: tuple[tuple[int, int, int], ...] = ()) -> float:
        """What a stage's F&B pairs hide, as ``stage_level_replay`` subtracts it (``pair_overlap / chunks`` per
        pair): the pair's passes run alone less their span replayed as the emitter interleaves them
        (sim.explore.pair_replay.pair_span), averaged over the pairs the schedule issues, times the chunks: under
        DualPipe a forward of one local chunk with a backward of the other (F0B1 and F1B0, about as many of each);
        under moe.a2a_overlap the stage's own (forward chunk, backward chunk, count) ``mix``
        (sim.parallel.schedules.combined_pairs).
        Each pass is its chunk's layers as blocks (``_PairBlocks``): the forward from the embedding to the head,
        the backward from the head down, a layer full recomputation rebuilds running its forward again first."""
        bwd: ComputePhase = "input_grad" if plan.splits_backward else "backward"
        passes = []
        for embedding, head, layers in chunks:
            forward: list[tuple[Block, ...]] = []
            backward: list[tuple[Block, ...]] = []
            if embedding:
                forward.append((Block(self._price(plan, "embedding", "forward"), None, 0.0),))
            if head:
                backward.append((Block(self._price(plan, "head", bwd), None, 0.0),))
            for moe, recomputed in reversed(layers):
                blocks = pair.moe if moe else pair.dense
                backward += [blocks[0], blocks[1]] if recomputed else [blocks[1]]
            forward += [pair.moe[0] if moe else pair.dense[0] for moe, _ in layers]
            if head:
                forward.append((Block(self._price(plan, "head", "forward") + self._loss_comm(plan), None, 0.0),))
            if embedding:
                backward.append((Block(self._price(plan, "embedding", bwd), None, 0.0),))
            moe_layers = sum(moe for moe, _ in layers)
            passes.append((chain(forward), chain(backward), moe_layers))
        # Behind the dispatcher's host sync (sim.costs.host) each MoE layer pass lasts at least the host's time to
        # issue it: alone, its device time or that, whichever is longer; in a pair the host issues both passes'
        # layers one after the other, so the pair lasts at least their sum (the host stream in the simulation).
        host = plan.moe_host_seconds
        moe_f = alone(pair.moe[0])
        moe_b = alone(pair.moe[1])
        extra = (max(0.0, host["forward"] - moe_f), max(0.0, host["backward"] - moe_b))
        # DeepEP's kernels hold n of the GPU's S SMs (Plan.deepep_sms): compute under an exchange runs on the rest
        # (pair_span's ``held``; sim.engine.sm_contention in the simulation)
        held = plan.deepep_sms / (plan.scenario.cluster.gpu.sms or 1) if plan.deepep_sms else 0.0

        def hides(a: int, b: int) -> float:
            forward, _, moe_forward = passes[a]
            _, backward, moe_backward = passes[b]
            apart = alone(forward) + moe_forward * extra[0] + alone(backward) + moe_backward * extra[1]
            issue = moe_forward * host["forward"] + moe_backward * host["backward"]
            return apart - max(pair_span(forward, backward, held), issue)

        if mix:
            return len(passes) * sum(count * hides(a, b) for a, b, count in mix) / sum(count for _, _, count in mix)
        hidden = [hides(a, b) for a in range(len(passes)) for b in range(len(passes)) if a != b]
        return len(passes) * sum(hidden) / len(hidden) if hidden else 0.0

    def _cp_exposed(self, plan: Plan, bwd: ComputePhase) -> tuple[float, float]:
        """(forward, backward) seconds one layer's context parallelism adds to its attention block's flash kernel,
        as the workload emits it (``_StageEmitter._cp_core``): the ring's makespan (sim.parallel.context.
        ring_makespan: a send is exposed where it outlasts its step; the steps with TE's output corrections) less
        the flash kernel, or the all-gather / all-to-all collectives, which nothing overlaps. (0, 0) without CP."""
        ca = step.context_attention(plan)
        if ca is None:
            return 0.0, 0.0
        group = plan.grid.cp_group(0)
        out = []
        for moves, phase in ((ca.forward, "forward"), (ca.backward, bwd)):
            if plan.cp_comm_type != "p2p":
                out.append(sum(network_models.transfer_time(self.net, m.op, m.nbytes, group) for m in moves))
                continue
            blocks = [self.costs.compute_time(work, phase) for work in ca.steps]  # type: ignore[arg-type]
            sends = [self.net.p2p_time(m.nbytes, group[0], group[1]) for m in moves]
            # The attention block prices the core as one kernel; the ring's steps replace it (their kernels are
            # smaller, so on a measured attention curve they run at a lower rate than the whole one).
            core = self.costs.compute_time(ca.core, phase)  # type: ignore[arg-type]
            out.append(ring_makespan(blocks, sends, backward=phase != "forward") - core)
        return out[0], out[1]

    def _p2p(self, plan: Plan) -> float:
        """One pipeline send between neighbouring stages (0 without pipeline parallelism), priced once per
        (bytes, sender, receiver)."""
        if plan.pp == 1:
            return 0.0
        rank = plan.grid.stage_representative
        key = (plan.p2p_bytes, rank(0), rank(1))
        if key not in self._sends:
            self._sends[key] = self.net.p2p_time(*key)
        return self._sends[key]

    def _chunked_collectives(self, plan: Plan) -> tuple[tuple[float, float], tuple[float, float]] | None:
        """Under TE's userbuffers (``step.tp_overlap_chunks``): ((first chunk, the other chunks) of the all-gather,
        (last chunk, the other chunks) of the reduce-scatter) in seconds, each chunk priced at its own size;
        None where the TP collectives are not chunked."""
        n = step.tp_overlap_chunks(plan)
        if not n:
            return None
        group = plan.grid.tp_group(0)
        gather, reduce = step.tp_ops(plan)
        assert gather is not None and reduce is not None

        def parts(op: str) -> tuple[float, float]:
            return (self.net.collective_time(op, plan.tp_bytes / n, group),
                    self.net.collective_time(op, plan.tp_bytes * (n - 1) / n, group))

        return parts(gather), parts(reduce)

    def _chunked_forward(self, plan: Plan, block: str, phase: ComputePhase,
                         chunked: tuple[tuple[float, float], tuple[float, float]]) -> float:
        """A block's forward under TE's userbuffers (the workload's ``_chunked_block``): the gather's first chunk,
        the block up to its row-parallel GEMM beside the gather's other chunks, the row GEMM beside the
        reduce-scatter's chunks but the last (which wait for the gather's on the TP stream), then the last."""
        (gather_head, gather_body), (reduce_tail, reduce_body) = chunked
        total, row = self._price(plan, f"{block}_chunked", phase), self._price(plan, f"{block}_chunked_row", phase)
        pre = total - row
        summed = step.reduce_partials_seconds(plan, self.costs)  # AsyncTP's reduction after the last chunk
        if step.async_tp(plan) and row > 0 and not (block == "attention" and plan.cp > 1):
            # the workload's _async_tp_block: shard copy, the fused GEMMs' chunks beside the remote shards' copies
            # and their last after them, the rest of the block, the row GEMM's first chunk, its others beside the
            # reduce-scatter's copies, the reduction
            n = step.tp_overlap_chunks(plan)
            column = self._price(plan, f"{block}_chunked_column", phase)
            row = step.beside_reduce_scatter(plan, row)
            return (step.fused_gather_seconds(step.shard_copy_seconds(plan, self.costs), column, gather_body, n)
                    + (pre - column) + step.fused_scatter_seconds(row, reduce_body, summed, n))
        total = pre + step.beside_reduce_scatter(plan, row)  # the row GEMM on the SMs the reduce-scatter leaves
        return gather_head + max(total, max(pre, gather_body) + reduce_body) + reduce_tail + summed

    def _overlapped_backward(self, plan: Plan, block: str, times: list[float],
                             chunked: tuple[tuple[float, float], tuple[float, float]] | None = None) -> float:
        """A block's fused backward with Megatron's asynchronous TP collectives (the workload's
        ``_overlapped_backward``): the column-parallel GEMM's weight gradient hides the input-gradient reduction,
        and with SP the input all-gather runs beside the input-gradient GEMMs; under TE's userbuffers
        (``chunked``) the output gradient's gather exposes its first chunk, its others run before that all-gather
        on the TP stream."""
        weight = self._price(plan, f"{block}_column", "weight_grad")
        dgrad = self._price(plan, block, "backward") - weight
        if (chunked is not None and step.async_tp(plan) and not (block == "attention" and plan.cp > 1)
                and self._price(plan, f"{block}_row", "input_grad") > 0):
            # the workload's _async_tp_backward: the output gradient's gather fused with the row GEMM's input
            # gradient, the rest (its weight gradient too), the column GEMMs' input gradient fused with the
            # reduce-scatter, their weight gradient
            (_, gather_body), (_, reduce_body) = chunked
            n = step.tp_overlap_chunks(plan)
            row, column = (self._price(plan, f"{block}_chunked_{part}", "input_grad") for part in ("row", "column"))
            rest = dgrad - self._price(plan, f"{block}_row", "input_grad") - self._price(plan, f"{block}_column",
                                                                                          "input_grad")
            return (step.fused_gather_seconds(step.shard_copy_seconds(plan, self.costs), row, gather_body, n) + rest
                    + step.fused_scatter_seconds(column, reduce_body, step.reduce_partials_seconds(plan, self.costs),
                                                 n) + weight)
        if chunked is not None:
            (head, body), _ = chunked
            gather, reduce = times
            return head + max(dgrad, body + gather) + max(reduce, weight) + step.reduce_partials_seconds(plan,
                                                                                                      self.costs)
        if plan.sequence_parallel:
            gather, reduce = times
            return gather + max(dgrad, gather) + max(reduce, weight)
        return dgrad + max(times[0], weight)

    def _sharded_unit_overhead(self, plan: Plan, fwd_layer: float, bwd_layer: float) -> tuple[float, float]:
        """ZeRO-3 / FSDP: per layer, the all-gather time the compute cannot hide (FSDP's prefetch)."""
        if not plan.gathers_units or not plan.data_parallel or plan.pipelined_fsdp:  # FSDP + PP: _unit_gather_delay
            return 0.0, 0.0
        group = plan.shard_group(0)
        if plan.deepspeed is not None:  # per-module all-gathers of a middle layer, the step's buckets per layer
            middle = plan.model.num_layers // 2
            gather = sum(self.net.collective_time("all_gather", params * plan.weight_bytes_per_param, group)
                         for params in step.gather_calls(plan, middle))
            reduce = sum(self.net.collective_time("reduce_scatter", params * plan.grad_bytes_per_param, group)
                         for _, params in step.reduce_buckets(plan)) / plan.model.num_layers
        else:
            unit_params = plan.unit_layers * layer_params(plan.model).per_tp_rank(plan.tp)
            unit_weights = unit_params * plan.weight_bytes_per_param
            unit_grads = unit_params * plan.grad_bytes_per_param
            if plan.peft.active:  # frozen weights in their storage dtype; gradients of the trainable ones only
                middle = plan.model.num_layers // 2
                unit_weights = plan.unit_layers * plan.layer_weight_bytes(middle)
                unit_grads = plan.unit_layers * plan.layer_grad_params(middle) * plan.grad_bytes_per_param
            gather = self.net.collective_time("all_gather", unit_weights, group) / plan.unit_layers
            reduce = self.net.collective_time("reduce_scatter", unit_grads, group) / plan.unit_layers
        network, gpu = plan.scenario.network, plan.scenario.cluster.gpu
        held = network.nccl_sms / (gpu.sms or 1) if network.nccl_sms else 0.0
        forward = _overlap_cost(fwd_layer, gather, held)
        if plan.zero_stage < 3:  # SHARD_GRAD_OP gathers nothing in the backward: its reduce-scatters run alone
            return forward, _overlap_cost(bwd_layer, reduce, held)
        both = gather + reduce  # one stream: the next unit's gather and this unit's reduce-scatter queue
        return forward, _overlap_cost(bwd_layer, both, held) if plan.prefetch else both

    def _dp_collective(self, plan: Plan, op: str, nbytes: float, group: tuple[int, ...]) -> float:
        """A data-parallel collective's time. On the flow-level network every TP rank's DP group runs the same
        collective at once (they are in lockstep) and may share NICs, leaf uplinks and the spine: one static
        max-min share of all their channels (sim.network.flows) stretches each channel, and the slowest gives the
        time."""
        if self.flows is None:  # a step's buckets repeat a few sizes, and layouts share groups: price each once
            alone = (op, nbytes, (group,))
            if alone not in self._concurrent:
                self._concurrent[alone] = self.net.collective_time(op, nbytes, group)
            return self._concurrent[alone]
        groups = lockstep_groups(group, plan.tp)
        key = (op, nbytes, groups)
        if key not in self._concurrent:
            seconds = 0.0
            for phases in zip(*(self.flows.transfer(op, nbytes, g) for g in groups), strict=True):
                flows = FlowNetwork(self.flows.capacities)
                channels = [ch for phase in phases for ch in phase.channels]
                for index, channel in enumerate(channels):
                    flows.add(index, channel.loads, channel.nbytes, channel.rate_cap, 0.0)
                slowest = max((ch.nbytes / flows.flows[i].rate for i, ch in enumerate(channels)), default=0.0)
                seconds += max(phase.latency for phase in phases) + slowest
            self._concurrent[key] = seconds
        return self._concurrent[key]

    def _pipeline(self, plan: Plan, stages: list[StageTimes]) -> tuple[float, list[float]]:
        """Makespan of the pipeline and when each stage's last backward pass ends."""
        p, v, m = plan.pp, plan.vpp, plan.microbatches
        # With blocking sends (parallel.overlap_p2p_comm: false) each stage's passes already hold their sends
        # (_stages), so the trip of a micro-batch down and back up adds no further hop.
        c = 0.0 if not plan.scenario.parallel.overlap_p2p_comm else self._p2p(plan)
        work = [st.forward + st.backward + st.weight for st in stages]
        slowest = max(work)
        f, b, w = (max(getattr(st, part) for st in stages) for part in ("forward", "backward", "weight"))
        name = plan.scenario.schedule
        if PRICED_AS.get(name, name) == "1f1b":
            total = sum(work) + (m - 1) * slowest + 2 * (p - 1) * c
        elif name == "interleaved":
            total = m * slowest + (p - 1) * (f + b) / v + 2 * (p - 1) * c
        elif name == "zb-h1":
            total = m * slowest + (p - 1) * max(f + b - w, 0.0) + 2 * (p - 1) * c
        elif name == "zb-h2":
            total = m * slowest + (p - 1) * max(f + b - 2 * w, 0.0) + 2 * (p - 1) * c
        else:  # zb-v: two chunks per stage, H2's bubble per chunk
            total = m * slowest + (p - 1) * max(f + b - 2 * w, 0.0) / 2 + 2 * (p - 1) * c
        # Too few micro-batches to fill the pipeline (zero-bubble needs m >= 2p): one micro-batch's trip down
        # and back up bounds the step, and the zero-bubble orders keep bubbles their formulas do not have, so
        # replay those orders at stage level (a few hundred actions at most).
        total = max(total, sum(st.forward + st.backward for st in stages) + w + 2 * (p - 1) * c)
        if name.startswith("zb") and m < 2 * p or name.startswith("dualpipe") or plan.a2a_overlap:
            # DualPipe and Megatron's combined 1F1B (F&B pairs): no formula here
            key = (name, p, m, plan.vpp, plan.a2a_overlap)  # the order and its layout depend on vpp too
            if key not in self._orders:  # many layouts share (schedule, p, m, vpp): build each order once
                self._orders[key] = pass_dependencies(plan.schedule.actions(p, m, plan.vpp), plan.layout,
                                                      plan.chunks - 1)
            # layouts that differ only where the stages' times do not (ZeRO 0 and 1) replay the same order
            replayed = (key, tuple(stages), c)
            if replayed not in self._replays:
                self._replays[replayed] = stage_level_replay(*self._orders[key], stages, c)
            total, ends = self._replays[replayed]
            return total, list(ends)
        ends, behind = [], 0.0
        for st in stages:  # stage 0 ends last; each later stage's last backward left one hop earlier
            ends.append(total - behind)
            behind += st.backward / (v if name == "interleaved" else 1) + c
        return total, ends

    def _tail(self, plan: Plan, stage: int, st: StageTimes, backward_end: float, shape: _TailShape,
              timing: _Timing, parts: _ShapeParts) -> tuple[float, float]:
        """(exposed data-parallel time after the last backward, optimizer + weight all-gather) of a stage, whose
        tail, apart from its times, is ``shape`` (``_tail_shape``); ``timing`` and ``parts``: the layout's facts
        its stage times and its shape decide (read there, not from ``plan``, which the screen builds per layout)."""
        exposed = 0.0
        if parts.data_parallel:
            # when each layer's gradients become final: the last local chunk's backward ends first, each layer
            # one layer_backward after the one before it. Under a split backward (zero-bubble schedules) they are
            # final only after the last micro-batch's weight-gradient pass, which ends the stage: ZB's
            # WeightGradStore runs the W GEMMs, and only then does DDP's hook see the gradient accumulated
            # (Qi et al. 2024, Sec. 2; the emitter's weight_grad sets grad_ready), so the buckets start inside W.
            interleaved, vpp, pp = timing.interleaved, timing.vpp, timing.pp
            when: dict[int, float] = {}
            at = backward_end - (st.weight if st.weight > 0.0 else st.backward)
            for c, layers in shape.chunks:
                if interleaved:  # chunk c's last backward ran c*p chunk-passes before the stage's end
                    at = backward_end - st.backward / vpp * (1 + c * pp)
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
            exposed = max(0.0, free_at - backward_end)
            if shape.experts:  # expert gradients: their own buckets and stream, over edp
                exposed = max(exposed, self._expert_tail(plan, stage, when, backward_end))
            m = timing.microbatches
            if parts.zero_stage >= 2 and m > 1 and not parts.pipelined_fsdp:
                # ZeRO-2/3 reduce-scatter every micro-batch's gradients: m times the buckets on one stream,
                # from the first backward on. When that is longer than the backward passes, it sets the end.
                first_backward = backward_end - (m - 1) * (st.forward + st.backward + st.weight) - st.backward
                exposed = max(exposed, first_backward + m * shape.per_microbatch - backward_end)
            if parts.zero_stage >= 2 and not plan.scenario.parallel.overlap_grad_reduce:
                # DeepSpeed overlap_comm false: every micro-batch's reductions run on the compute stream, each
                # between two backward kernels, so all of them lengthen the step (the emitter's _reduce)
                exposed = m * shape.per_microbatch
        if shape.copies is not None:  # DualPipe: the two model copies' gradients summed after the backward
            exposed += shape.copies
        return exposed, shape.optimizer

    def _tail_shape(self, plan: Plan, stage: int, stat_reduce: float, shape_key: tuple[Any, ...]) -> _TailShape:
        """The part of a stage's tail its times do not change: the order its gradients become final, its gradient
        buckets (or units) with each one's collective time, and its optimizer step. Layouts that differ only in
        micro-batch size, recomputation or sequence parallelism share it (``_shape_key``)."""
        key = (shape_key, stage)
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
            for c in range(plan.local_chunks - 1, -1, -1):  # the last local chunk's backward ends first
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
                if per_unit and plan.hybrid:
                    replicas = plan.replica_group(0)
                    seconds += self.net.collective_time("all_reduce", nbytes / len(group), replicas)
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
        if gather and not expert_gather:
            optimizer += self.net.collective_time("all_gather", gather, plan.grid.dp_group(0))
        elif expert_gather:  # the dense and the expert weights are gathered on two streams at once
            optimizer += max(self.net.collective_time("all_gather", gather, plan.grid.dp_group(0)) if gather else 0.0,
                             self.net.collective_time("all_gather", expert_gather, plan.expert_dp_group(0)))
        sync = step.metric_sync(plan)
        if sync is not None:  # the trainer's train-metric sync once the step is done (sim.workload.train_metrics)
            optimizer += step.metric_sync_seconds(sync, self.net)
        copies_s = self.net.collective_time("all_reduce", *copies) if copies is not None else None
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

    # ------------------------------------------------------------------------------------------ whole
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
        exposed_of: dict[tuple[int, int], float] = {}
        skip = self.skip_tails
        for s, (st, end, shape) in enumerate(zip(stages, ends, parts.tails, strict=True)):
            seen = exposed_of.get((shape.kind, id(st))) if skip else None
            if seen is not None:
                most = max(seen, shape.per_microbatch - end)
                most += 1e-9 * (abs(end) + abs(seen) + shape.per_microbatch)
                if end + delay + most + shape.optimizer < step_s:
                    continue
            exposed, opt = self._tail(plan, s, st, end, shape, timing, parts)
            if not shape.experts and shape.copies is None:
                exposed_of[shape.kind, id(st)] = exposed
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
                       plan.scenario.schedule == "interleaved")

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

    def _peak_memory(self, plan: Plan, keys: LayoutKeys) -> float:
        """The largest stage's memory bound (``sim.workload.footprint``): even stages peak at an end of the pipe
        (most in flight, or the head's); uneven ones may peak anywhere. The stages' resident states and sharded
        buffers are kept per tail shape (they do not depend on the micro-batch size, recomputation or SP), their
        activations per layout without the ZeRO stage: each a list over the stages that may peak."""
        found = self._memory_states.get(keys.shape)
        if found is None:
            found = self._memory_states[keys.shape] = (
                [(s, sum(footprint.states_and_buffers(plan, s)[0].values()), *footprint.sharded_buffers(plan, s))
                 for s in self._peak_stage_list(plan, keys)], keys.owner)  # the owner keeps the key's objects
        states = found[0]
        activations = self._activations.get(keys.activations)
        if activations is None:
            activations = self._activations[keys.activations] = [self._stage_activations(plan, keys, s)
                                                                  for s, _, _, _ in states]
        peak = None
        for (_, resident, gathered, unreduced), stashed in zip(states, activations, strict=True):
            total = footprint.parts_total(plan, resident, stashed, gathered, unreduced)
            if peak is None or total > peak:
                peak = total
        assert peak is not None
        return peak

    def _peak_stage_list(self, plan: Plan, keys: LayoutKeys) -> list[int]:
        """The stages that may peak (``_peak_memory``), per pipeline structure."""
        found = self._peak_stages.get(keys.structure)  # what the pipeline's structure decides
        if found is None:
            uneven = len(set(plan.chunk_sizes)) > 1
            stages = list(range(plan.pp)) if uneven else sorted({0, plan.head_stage, plan.pp - 1})
            found = self._peak_stages[keys.structure] = (stages, keys.owner)  # the owner keeps the key's objects
        return found[0]

    def _stage_activations(self, plan: Plan, keys: LayoutKeys, s: int) -> float:
        """A stage's activations at its peak (``footprint.stage_activations``), its largest chunk's stash kept per
        ``keys.stash`` (the chunk placement, not the schedule's name)."""
        stash_key = (keys.activations if keys.stash is None else keys.stash, s)
        stash = self._stashes.get(stash_key)
        if stash is None:
            stash = self._stashes[stash_key] = footprint.largest_chunk_stash(plan, s)
        return footprint.stage_activations(plan, s, stash)[0]


class LayoutKeys(NamedTuple):
    """Cache keys of a scenario for ``Estimator.estimate``: ``stages`` names everything but the ZeRO stage
    (``_STAGES_FREE``), ``shape`` everything but the micro-batch size, recomputation and SP (``_SHAPE_FREE``),
    ``activations`` everything but the ZeRO stage and the FSDP section (``_MEMORY_FREE``); ``owner`` is kept
    with the cached parts so that the objects the keys name by identity stay alive. sim.explore.search builds
    them from its layouts (``search.layout_keys``)."""

    stages: tuple[Any, ...]
    shape: tuple[Any, ...]
    activations: tuple[Any, ...]
    structure: tuple[Any, ...]  # the pipeline's structure: what each stage holds and recomputes (_stage_shapes)
    layer: tuple[Any, ...]  # what one layer's times depend on (_layer_times)
    base: tuple[Any, ...]  # the base without the layout (its global batch, sequence, model: the step's FLOPs)
    owner: Any
    # what a stage's largest chunk stashes depends on (footprint.largest_chunk_stash): ``activations`` with the
    # schedule's chunk placement for its name; None: ``activations``
    stash: tuple[Any, ...] | None = None


def _work_bound(stages: list[StageTimes]) -> float:
    """The slowest stage's work per micro-batch (less what a DualPipe F&B pair hides, as if every pass were
    paired): m times it bounds the step from below."""
    return max(st.forward + st.backward + st.weight - st.pair_overlap for st in stages)


class _Timing(NamedTuple):
    """What a layout's estimate reads that its stage times' key decides (the pipeline and the micro-batches), kept
    with them (``Estimator._timing``), so the screen reads no fact of a layout's plan once its parts are priced."""

    hop: float  # one pipeline send (Estimator._p2p)
    microbatches: int
    visits: float  # micro-batches each stage runs per step (half of them per copy in DualPipe's two copies)
    pp: int
    vpp: int
    local_chunks: int
    interleaved: bool  # the interleaved schedule (its chunks' backwards end apart: Estimator._tail)


class _Gate(NamedTuple):
    """Where a stage's first forward waits for weight all-gathers under ZeRO-1/2's ``overlap_param_gather``
    (``Estimator._param_gates``): at a layer where a bucket of the dense chain (0) or the expert chain (1) starts."""

    chunk: int  # the stage's local chunk
    waits: tuple[tuple[int, float], ...]  # (chain, the bucket's all-gather seconds), dense first
    layers: int  # layers computed from here to the next gate, or to the chunk's end
    next_chunk: bool  # the next gate is in a later chunk: the pipeline fill runs before it


class _ShapeParts(NamedTuple):
    """What a layout's estimate reads that its shape (``LayoutKeys.shape``: no micro-batch size, recomputation or
    SP) decides: its sharding's facts, FSDP + PP's unit gathers and every stage's tail shape
    (``Estimator._parts_of_shape``)."""

    stages_zero: int | None  # the ZeRO stage where it changes the stage times (weights gathered per unit), else None
    # ZeRO-1/2's per-bucket weight gathers under the forward (step.overlaps_param_gather): per stage, where its
    # first forward waits for them (Estimator._param_gates); else None
    param_gates: list[list[_Gate]] | None
    unit_ends: list[list[list[float]]] | None  # FSDP + PP: Estimator._unit_gather_ends, else None
    unit_layers: int
    tails: list[_TailShape]  # every stage's (Estimator._tail_shape)
    data_parallel: bool
    zero_stage: int
    pipelined_fsdp: bool
    owner: Any  # keeps the objects the shape key names alive


class _LayerTimes(NamedTuple):
    """One transformer layer's times for one micro-batch (Estimator._layer_times)."""

    split: bool  # the schedule splits the backward (its weight gradients run apart)
    backward_phase: ComputePhase  # the phase the backward's pieces are priced in
    forward: float  # TP collectives and CP's exposed exchanges included
    backward: float  # fused (or input-gradient) pass, selective recomputation and CP included
    weight: float  # the split weight-gradient pass (0 unless split)
    frozen: tuple[float, float] | None  # (backward, weight) of a layer ``training.method: frozen`` freezes
    dense: tuple[float, float, float]  # a MoE model's dense layer: (forward, backward, weight); zeros if dense
    moe: tuple[float, float, float]  # its MoE layer's; zeros in a dense model
    pair: _PairBlocks | None  # a MoE model's layers as DualPipe's F&B pairs cut them (Estimator._pair_overlap)
    rebuilt_moe: float  # what full recomputation adds to a MoE layer's backward (Estimator._rebuilt_moe); 0 if dense


class _PairBlocks(NamedTuple):
    """A MoE model's layers as blocks (sim.explore.pair_replay.Block), (forward, backward) each, for
    ``Estimator._pair_overlap``: a dense layer is one block per pass, a MoE layer is cut at its exchanges
    (``Estimator._moe_layer``)."""

    dense: tuple[tuple[Block, ...], tuple[Block, ...]]
    moe: tuple[tuple[Block, ...], tuple[Block, ...]]


# A local chunk as a DualPipe pair runs it: (embedding, head, (MoE layer, recomputed) per layer in forward order)
_ChunkLayers = tuple[bool, bool, tuple[tuple[bool, bool], ...]]


class _StageShape(NamedTuple):
    """What sets a stage's times apart from another's of the same layout (Estimator._stages)."""

    layers: int
    moe_layers: int  # of them MoE layers (0 in a dense model)
    recomputed: int  # layers full recomputation rebuilds
    recomputed_moe: int  # of them MoE layers (a MoE model's dense layers rebuild at their own price)
    frozen: int  # layers ``training.method: frozen`` freezes (0 unless that method)
    offloaded: int  # layers whose activations go to the host
    first_layer: int  # the first layer of the stage's first chunk where it offloads (its copy's size), else -1
    embedding: bool
    head: bool
    sends: tuple[int, int]  # blocking sends per micro-batch, forward and backward (_blocking_sends)
    pair_chunks: tuple[_ChunkLayers, ...]  # per local chunk, under DualPipe / a2a_overlap with MoE layers (else empty)
    pair_mix: tuple[tuple[int, int, int], ...]  # a2a_overlap: (F chunk, B chunk, pairs) of the stage's steady state
    # (sim.parallel.schedules.combined_pairs)



@dataclass(frozen=True)
class _TailShape:
    """What a stage's data-parallel tail and optimizer step are, apart from when its backward runs
    (``Estimator._tail_shape``)."""

    chunks: list[tuple[int, tuple[int, ...]]]  # (local chunk, its layers last first), the last chunk first
    embedding: bool  # the input embedding's gradients join the stage's first layer's
    after_backward: bool  # one bucket per chunk after the whole backward (key -2)
    unit_chunks: list[int]  # FSDP + PP: the local chunks whose units reduce after the chunk's last backward (-10 - c)
    buckets: list[tuple[int, float]]  # (the layer whose gradients close it, its collective's seconds), in order
    per_microbatch: float  # the buckets' seconds, summed in order
    experts: bool  # expert gradients reduce on their own stream (Estimator._expert_tail)
    copies: float | None  # DualPipe's all-reduce of the two model copies' gradients
    optimizer: float  # optimizer step, gradient checks and the weight all-gather after it
    kind: int  # equal for two stages' shapes that differ only in their layers' numbers (Estimator._tail_shape)


# Fields of a layout that change what a stage computes per micro-batch but not its parameters, gradients,
# groups or optimizer: layouts differing only in these share a tail shape.
_SHAPE_FREE = {"parallel": ("sequence_parallel",), "training": ("micro_batch", "recompute")}
# The ZeRO stage changes a stage's per-micro-batch times only where weights are gathered per unit
# (Estimator._sharded_unit_overhead): otherwise layouts differing only in it share their stage times.
_STAGES_FREE: dict[str, tuple[str, ...]] = {"parallel": ("zero",), "training": ()}
# A stage's activations do not depend on how its weights, gradients and optimizer states are sharded: layouts
# differing only in the ZeRO stage (and the FSDP section it implies) share them (Estimator._peak_memory).
_MEMORY_FREE: dict[str, tuple[str, ...]] = {"parallel": ("zero",), "training": (), "scenario": ("fsdp",)}


def _shape_key(sc: Scenario, free: dict[str, tuple[str, ...]] = _SHAPE_FREE) -> tuple[Any, ...]:
    """A scenario without the ``free`` fields, cheaply: values of the parallel and training fields, the
    schedule and names, and the identity of every other part (search candidates share those objects with their
    base: sim.explore.search.candidate copies only ``parallel`` and ``training``)."""
    skip = ("parallel", "training", *free.get("scenario", ()))
    return tuple(tuple(_token(v) for k, v in getattr(sc, part).__dict__.items() if k not in free[part])
                 for part in ("parallel", "training")) \
        + tuple(_token(v) for k, v in sc.__dict__.items() if k not in skip)


def _token(value: Any) -> Any:
    """A field's value as a key: itself for a plain value, a tuple for a list, the fields of an ``FsdpSpec``
    (sim.explore.search.candidate builds one per FSDP layout), else the object's identity."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, list):
        return tuple(_token(v) for v in value)
    if isinstance(value, FsdpSpec):
        return ("fsdp", *(_token(v) for v in value.__dict__.values()))
    return id(value)


def _fsdp_grad_key(plan: Plan) -> tuple[Any, ...] | None:
    """What FSDP1's per-micro-batch gradient kernels (``step.fsdp_grad_ops``, inside ``step.blocks``) read beyond
    ``Estimator._price``'s shape: None where there are none, else the gradient and reduce bytes and the
    data-parallel world (its pre-division factor)."""
    fsdp = plan.scenario.fsdp
    if fsdp is None or fsdp.version != 1 or plan.pipelined_fsdp or plan.dp <= 1:
        return None
    return plan.elem_bytes, plan.grad_bytes_per_param, len(plan.grid.dp_group(0))


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


def _work(pieces: step.Blocks, what: str) -> Work:
    """The ``Work`` a priced piece names: a block, its column-parallel GEMMs, the selective core, embedding, head."""
    if what in pieces.block:
        return pieces.block[what]
    if what.endswith("_chunked_row"):  # the forward beside TE's chunked collectives (step.chunk_gemms)
        name = what.removesuffix("_chunked_row")
        return pieces.chunked_row.get(name, pieces.row[name])
    if what.endswith("_chunked_column"):
        name = what.removesuffix("_chunked_column")
        return pieces.chunked_column.get(name, pieces.column[name])
    if what.endswith("_chunked"):
        name = what.removesuffix("_chunked")
        return pieces.chunked.get(name, pieces.block[name])
    if what.endswith("_column"):
        return pieces.column[what.removesuffix("_column")]
    if what.endswith("_row"):
        return pieces.row[what.removesuffix("_row")]
    if what.startswith("recompute_"):
        return pieces.recompute[what.removeprefix("recompute_")]
    return {"selective": pieces.selective, "embedding": pieces.embedding, "head": pieces.head}[what]


def _overlap_cost(compute: float, comm: float, held: float) -> float:
    """Time a layer's compute and the collective beside it add to the compute alone: the compute loses ``held``
    (NCCL's share of the SMs, sim.engine.sm_contention) of the seconds it overlaps, and what the compute cannot hide
    of the collective is exposed."""
    stretched = compute / (1.0 - held) if comm * (1.0 - held) >= compute else compute + held * comm
    return stretched - compute + max(0.0, comm - stretched)


def estimate(scenario: Scenario) -> Estimate:
    return Estimator(scenario).estimate(scenario)
