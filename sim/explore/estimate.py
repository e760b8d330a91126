"""Closed-form step time of a scenario, without building its task graph: the screen of ``sim search``.

In: a validated ``Scenario`` (or a cheap ``model_copy`` of one with another layout). Out: ``Estimate``: step
time, its parts (pipeline, exposed data-parallel tail, optimizer), MFU and the per-rank memory bound of
``sim.workload.memory_plan`` with whether it fits. An ``Estimator`` keeps the cost model, the network and per-shape
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
- the data-parallel tail: the step's gradient buckets (or units) replayed in the order the last backward frees
  them on a sequential stream, then the optimizer (on the GPU, or the host under offload) and ZeRO-1/2's weight
  all-gather; the step ends at the latest stage.
With fewer than 2p micro-batches the zero-bubble formulas do not hold (their orders keep bubbles), so those
orders are replayed at stage level instead (one task per pass and chunk, built once per (schedule, p, m)).
What it ignores and the simulation keeps (the reason the two may differ; the test allows 5%): interleaved and
zero-bubble schedules' exact warm-up order, p2p sends hidden in the steady state, reduce-scatters queueing
behind each other across micro-batches under ZeRO-2/3, and link contention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.network import models as network_models
from sim.network.collectives import p2p_time
from sim.spec.scenario import Scenario
from sim.network.flows import FlowNetwork
from sim.costs.models import ADAM_BYTES_PER_PARAM, CostModel, Phase, Work
from sim.hardware import bytes_per_element
from sim.model.memory import model_state_bytes
from sim.workload.memory_plan import stage_memory, stage_params
from sim.model.transformer import (ATTENTION_CORE, COLUMN_PARALLEL, embedding_forward_ops, head_forward_ops,
                       layer_forward_ops, layer_params, model_flops_per_step)
from sim.parallel.schedules import SCHEDULES, Action, Layout, chunk_location, model_chunk


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


@dataclass(frozen=True)
class _Stage:
    forward: float  # one micro-batch, all chunks, TP collectives included
    backward: float  # input-gradient pass (+ weight gradients unless split) with recomputation
    weight: float  # split weight-gradient pass (zero-bubble schedules)
    layer_backward: float  # one layer's backward, for when gradients become final
    layers: int


class Estimator:
    def __init__(self, scenario: Scenario, costs: CostModel | None = None,
                 network: network_models.Network | None = None) -> None:
        from sim.runner import build_topology  # the topology of the cluster, shared by every layout
        from sim.workload.build import make_costs

        self.costs = costs or make_costs(scenario)
        spec = scenario.network
        topology = build_topology(scenario) if network is None or spec.model == "contention" else None
        model = "analytic" if spec.model == "contention" else spec.model
        self.net = network or network_models.make(model, topology, spec.algorithm)
        self.flows: network_models.FlowLevelNetwork | None = (
            network_models.ContentionNetwork(topology, spec.algorithm) if spec.model == "contention" else None)
        self._compute: dict[Any, float] = {}
        self._concurrent: dict[Any, float] = {}
        self._orders: dict[tuple[str, int, int], list[list[Action]]] = {}

    # ---------------------------------------------------------------------------------------- pieces
    def _price(self, sc: Scenario, what: str, phase: Phase) -> float:
        t, p = sc.training, sc.parallel
        key = (what, phase, t.micro_batch, sc.seq_len, p.tp, p.sequence_parallel, t.flash_attention, t.fused_kernels)
        if key not in self._compute:
            elem = bytes_per_element(t.dtype)
            b, s = t.micro_batch, sc.seq_len
            if what in ("attention", "mlp", "selective", "attention_column", "mlp_column"):
                blocks = layer_forward_ops(sc.model, b, s, p.tp, p.sequence_parallel, elem, t.flash_attention,
                                           t.fused_kernels)
                if what == "selective":
                    work = Work(tuple(op for op in blocks["attention"] if op.name in ATTENTION_CORE), 0.0)
                elif what.endswith("_column"):
                    work = Work(tuple(op for op in blocks[what[:-7]] if op.name in COLUMN_PARALLEL), 0.0)
                else:
                    work = Work(blocks[what], 0.5)
            elif what == "embedding":
                work = Work(embedding_forward_ops(sc.model, b, s, elem), 0.0)
            else:
                work = Work(head_forward_ops(sc.model, b, s, p.tp, elem), 0.0)
            self._compute[key] = self.costs.compute_time(work, phase)
        return self._compute[key]

    def _stages(self, sc: Scenario) -> list[_Stage]:
        t, p, grid = sc.training, sc.parallel, sc.grid
        split = SCHEDULES[sc.schedule].splits_backward
        tp_bytes = t.micro_batch * sc.seq_len * sc.model.hidden_size * bytes_per_element(t.dtype)
        group = grid.tp_group(0)
        if p.tp > 1:
            ops = ("all_gather", "reduce_scatter") if p.sequence_parallel else ("all_reduce",)
            times = [self.net.collective_time(op, tp_bytes, group) for op in ops]  # per block
        else:
            times = [0.0]
        tp_comm = sum(times)
        bwd: Phase = "input_grad" if split else "backward"
        fwd_layer = sum(self._price(sc, b, "forward") for b in ("attention", "mlp")) + 2 * tp_comm
        if p.tp > 1 and not split and self._price(sc, "mlp_column", "weight_grad") > 0:
            bwd_layer = sum(self._overlapped_backward(sc, b, times) for b in ("attention", "mlp"))
        else:
            bwd_layer = sum(self._price(sc, b, bwd) for b in ("attention", "mlp")) + 2 * tp_comm
        if t.recompute == "selective":
            bwd_layer += self._price(sc, "selective", "forward")
        w_layer = sum(self._price(sc, b, "weight_grad") for b in ("attention", "mlp")) if split else 0.0
        stages = []
        for s in range(p.pp):
            layers = sc.stage_layers(s)
            # Full recomputation adds a forward to the backward of the layers it rebuilds (all, or the first
            # recompute_num_layers of each chunk); FSDP's gather overhead sees the stage's average layer.
            recomputed = sc.recomputed_layers(s)
            layer_bwd = bwd_layer + fwd_layer * recomputed / layers
            fsdp_f, fsdp_b = self._sharded_unit_overhead(sc, fwd_layer, layer_bwd)
            f, b, w = layers * (fwd_layer + fsdp_f), layers * (layer_bwd + fsdp_b), layers * w_layer
            holds_first = s == 0
            holds_last = (s == p.pp - 1) if SCHEDULES[sc.schedule].layout != "v" else s == 0
            if holds_first:
                f += self._price(sc, "embedding", "forward")
                b += self._price(sc, "embedding", bwd)
                w += self._price(sc, "embedding", "weight_grad") if split else 0.0
            if holds_last:
                f += self._price(sc, "head", "forward")
                b += self._price(sc, "head", bwd)
                w += self._price(sc, "head", "weight_grad") if split else 0.0
            stages.append(_Stage(f, b, w, layer_bwd + fsdp_b, layers))
        return stages

    def _overlapped_backward(self, sc: Scenario, block: str, times: list[float]) -> float:
        """A block's fused backward with Megatron's asynchronous TP collectives (the workload's
        ``_overlapped_backward``): the column-parallel GEMM's weight gradient hides the input-gradient reduction,
        and with SP the input all-gather runs beside the input-gradient GEMMs."""
        weight = self._price(sc, f"{block}_column", "weight_grad")
        dgrad = self._price(sc, block, "backward") - weight
        if sc.parallel.sequence_parallel:
            gather, reduce = times
            return gather + max(dgrad, gather) + max(reduce, weight)
        return dgrad + max(times[0], weight)

    def _sharded_unit_overhead(self, sc: Scenario, fwd_layer: float, bwd_layer: float) -> tuple[float, float]:
        """ZeRO-3 / FSDP: per layer, the all-gather time the compute cannot hide (FSDP's prefetch)."""
        sharded = sc.zero_stage >= 3 or (sc.fsdp is not None and sc.fsdp.sharding == "SHARD_GRAD_OP")
        if not sharded or sc.dp == 1:
            return 0.0, 0.0
        unit_layers = sc.fsdp.unit_layers if sc.fsdp is not None else 1
        group = self._shard_group(sc)
        per_param = model_state_bytes(1.0, sc.training.dtype, grad_dtype=sc.grad_dtype)
        unit_params = unit_layers * layer_params(sc.model).per_tp_rank(sc.parallel.tp)
        gather = self.net.collective_time("all_gather", unit_params * per_param.weights, group) / unit_layers
        reduce = self.net.collective_time("reduce_scatter", unit_params * per_param.gradients, group) / unit_layers
        prefetch = sc.fsdp.prefetch if sc.fsdp is not None else True
        held = sc.network.nccl_sms / (sc.cluster.gpu.sms or 1) if sc.network.nccl_sms else 0.0
        forward = _overlap_cost(fwd_layer, gather, held)
        if sc.zero_stage < 3:  # SHARD_GRAD_OP gathers nothing in the backward: its reduce-scatters run alone
            return forward, _overlap_cost(bwd_layer, reduce, held)
        both = gather + reduce  # one stream: the next unit's gather and this unit's reduce-scatter queue
        return forward, _overlap_cost(bwd_layer, both, held) if prefetch else both

    def _dp_collective(self, sc: Scenario, op: str, nbytes: float, group: tuple[int, ...]) -> float:
        """A data-parallel collective's time. On the flow-level network every TP rank's DP group runs the same
        collective at once (they are in lockstep) and may share NICs, leaf uplinks and the spine: one static
        max-min share of all their channels (sim.network.flows) stretches each channel, and the slowest gives the time."""
        if self.flows is None:
            return self.net.collective_time(op, nbytes, group)
        groups = tuple(tuple(rank + t for rank in group) for t in range(sc.parallel.tp))
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

    def _shard_group(self, sc: Scenario) -> tuple[int, ...]:
        group = sc.grid.dp_group(0)
        if sc.fsdp is not None and sc.fsdp.sharding == "HYBRID_SHARD":
            return tuple(r for r in group if sc.grid.node(r) == 0)
        return group

    def _pipeline(self, sc: Scenario, stages: list[_Stage]) -> tuple[float, list[float]]:
        """Makespan of the pipeline and when each stage's last backward pass ends."""
        p, v, m = sc.parallel.pp, sc.parallel.vpp, sc.microbatches
        rank = sc.grid.stage_representative
        c = self.net.p2p_time(self._p2p_bytes(sc), rank(0), rank(1)) if p > 1 else 0.0
        work = [st.forward + st.backward + st.weight for st in stages]
        slowest = max(work)
        f, b, w = (max(getattr(st, part) for st in stages) for part in ("forward", "backward", "weight"))
        name = sc.schedule
        if name in ("gpipe", "1f1b"):
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
        if name.startswith("zb") and m < 2 * p:
            key = (name, p, m)
            if key not in self._orders:  # many layouts share (schedule, p, m): build each order once
                self._orders[key] = SCHEDULES[name].actions(p, m, 2 if name == "zb-v" else 1)
            return stage_level_replay(self._orders[key], SCHEDULES[name].layout, stages, c)
        ends, behind = [], 0.0
        for st in stages:  # stage 0 ends last; each later stage's last backward left one hop earlier
            ends.append(total - behind)
            behind += st.backward / (v if name == "interleaved" else 1) + c
        return total, ends

    def _p2p_bytes(self, sc: Scenario) -> float:
        t = sc.training
        return t.micro_batch * sc.seq_len * sc.model.hidden_size * bytes_per_element(t.dtype) / sc.parallel.tp

    def _tail(self, sc: Scenario, stage: int, st: _Stage, backward_end: float) -> tuple[float, float]:
        """(exposed data-parallel time after the last backward, optimizer + weight all-gather) of a stage."""
        p, model, zero = sc.parallel, sc.model, sc.zero_stage
        params = stage_params(sc, stage)
        grad_elem = bytes_per_element(sc.grad_dtype)
        shards = sc.zero_shards if zero >= 1 else 1
        exposed = 0.0
        if sc.dp > 1:
            sharded = zero >= 3 or sc.fsdp is not None
            op = "all_reduce" if zero == 0 else "reduce_scatter"
            group = self._shard_group(sc) if sharded else sc.grid.dp_group(0)
            per_layer = layer_params(model).per_tp_rank(p.tp) * grad_elem
            unit = sc.fsdp.unit_layers if sc.fsdp is not None else 1
            bucket = per_layer * unit if sharded else max(p.dp_bucket_size, per_layer)
            layers_per_bucket = max(1, round(bucket / per_layer))
            extra = (params - st.layers * layer_params(model).per_tp_rank(p.tp)) * grad_elem
            v = p.vpp if sc.schedule == "interleaved" else 1
            chunk_layers, chunk_backward = st.layers // v, st.backward / v
            ready_at = []  # when each layer's gradients become final, in that order
            for c in range(v - 1, -1, -1):  # interleaved: chunk c's last backward ran c*p chunk-passes earlier
                start = backward_end - chunk_backward * (1 + c * p.pp)
                ready_at += [start + (i + 1) * st.layer_backward for i in range(chunk_layers)]
            free_at = per_microbatch = 0.0
            done = 0
            while done < st.layers:  # buckets fill as the last backward frees each layer's gradients
                n = min(layers_per_bucket, st.layers - done)
                done += n
                nbytes = n * per_layer + (extra if done == st.layers else 0.0)
                seconds = self._dp_collective(sc, op, nbytes, group)
                if sharded and sc.fsdp is not None and sc.fsdp.sharding == "HYBRID_SHARD":
                    replicas = tuple(sc.grid.dp_group(0)[len(group)::len(group)])
                    seconds += self.net.collective_time("all_reduce", nbytes / len(group), (0, *replicas))
                free_at = max(free_at, ready_at[done - 1]) + seconds
                per_microbatch += seconds
            exposed = max(0.0, free_at - backward_end)
            if zero >= 2 and sc.microbatches > 1:
                # ZeRO-2/3 reduce-scatter every micro-batch's gradients: m times the buckets on one stream,
                # from the first backward on. When that is longer than the backward passes, it sets the end.
                first_backward = backward_end - (sc.microbatches - 1) * (st.forward + st.backward + st.weight) \
                    - st.backward
                exposed = max(exposed, first_backward + sc.microbatches * per_microbatch - backward_end)
        off = sc.offload
        if off.optimizer:
            pcie = sc.cluster.pcie
            shard = params / shards
            optimizer = (ADAM_BYTES_PER_PARAM * shard / off.host_bandwidth
                         + p2p_time(shard * model_state_bytes(1.0, sc.training.dtype).weights, pcie.latency,
                                    pcie.effective_bandwidth))
        else:
            optimizer = self.costs.optimizer_time(params / shards, grad_elem)
        if sc.dp > 1 and zero in (1, 2):
            weights = params * model_state_bytes(1.0, sc.training.dtype).weights
            optimizer += self.net.collective_time("all_gather", weights, sc.grid.dp_group(0))
        return exposed, optimizer

    # ------------------------------------------------------------------------------------------ whole
    def estimate(self, sc: Scenario) -> Estimate:
        stages = self._stages(sc)
        pipeline, ends = self._pipeline(sc, stages)
        step, exposed_dp, optimizer = pipeline, 0.0, 0.0
        for s, (st, end) in enumerate(zip(stages, ends, strict=True)):
            exposed, opt = self._tail(sc, s, st, end)
            if end + exposed + opt > step:
                step, exposed_dp, optimizer = end + exposed + opt, exposed, opt
        gpus = sc.num_gpus
        flops = model_flops_per_step(sc.model, sc.global_batch, sc.seq_len)
        tflops = flops / gpus / step / 1e12
        # Even stages peak at an end of the pipe (most in flight, or the head); uneven ones may peak anywhere.
        p = sc.parallel
        uneven = p.first_stage_layers is not None or p.last_stage_layers is not None
        candidates = range(p.pp) if uneven else {0, p.pp - 1}
        peak = max(stage_memory(sc, s)["total"] for s in candidates)
        bound = sc.microbatches * max(st.forward + st.backward + st.weight for st in stages)
        return Estimate(step, pipeline, exposed_dp, optimizer, tflops * 1e12 / sc.cluster.gpu.peak(sc.training.dtype),
                        tflops, peak, peak <= sc.cluster.gpu.hbm_capacity, bound)


def _overlap_cost(compute: float, comm: float, held: float) -> float:
    """Time a layer's compute and the collective beside it add to the compute alone: the compute loses ``held``
    (NCCL's share of the SMs, sim.engine.sm_contention) of the seconds it overlaps, and what the compute cannot hide
    of the collective is exposed."""
    stretched = compute / (1.0 - held) if comm * (1.0 - held) >= compute else compute + held * comm
    return stretched - compute + max(0.0, comm - stretched)


def stage_level_replay(orders: list[list[Action]], layout: Layout, stages: list[_Stage],
                       c: float) -> tuple[float, list[float]]:
    """Makespan of a schedule's action orders with each stage's F, B and W split evenly over its chunks and
    one p2p time ``c`` between stages; and when each stage's last B ends."""
    p = len(orders)
    v = 1 + max(action.chunk for order in orders for action in order)
    last = p * v - 1
    done: dict[tuple[str, int, int], float] = {}
    position, free, last_b = [0] * p, [0.0] * p, [0.0] * p
    progress = True
    while progress:
        progress = False
        for s, order in enumerate(orders):
            times = {"F": stages[s].forward / v, "B": stages[s].backward / v, "W": stages[s].weight / v}
            while position[s] < len(order):
                action = order[position[s]]
                g = model_chunk(layout, p, s, action.chunk)
                if action.phase == "F":
                    dep = ("F", g - 1, action.microbatch) if g > 0 else None
                elif action.phase == "B":
                    dep = ("B", g + 1, action.microbatch) if g < last else ("F", g, action.microbatch)
                else:
                    dep = ("B", g, action.microbatch)
                if dep is not None and dep not in done:
                    break
                ready = free[s]
                if dep is not None:
                    hop = c if chunk_location(layout, p, dep[1])[0] != s else 0.0
                    ready = max(ready, done[dep] + hop)
                free[s] = done[(action.phase, g, action.microbatch)] = ready + times[action.phase]
                if action.phase == "B":
                    last_b[s] = free[s]
                position[s] += 1
                progress = True
    return max(free), last_b


def estimate(scenario: Scenario) -> Estimate:
    return Estimator(scenario).estimate(scenario)
