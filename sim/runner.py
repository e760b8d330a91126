"""Run one scenario end to end, in memory.

In: a validated ``Scenario``. Out: ``RunResult`` with the task graph as it was built (a run never writes it:
SM contention's stretched durations go to the replays as an override), the trace DataFrame, the summary and
the number of simulated events. This is the data flow of ARCHITECTURE.md in one place (topology -> network,
workload -> task graph, engine -> trace -> summary), shared by the CLI, sweeps and benchmarks. No files are
written here.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import pandas as pd

from sim.engine import event as engine
from sim.engine import longest_path, sm_contention
from sim.engine.critical_path import critical_path
from sim.errors import ConfigError, SimError
from sim.network import models as network
from sim.network import topology
from sim.output import link_usage, trace
from sim.output.summary import CriticalPathSeconds, Summary, summarize
from sim.plan import Plan, resolve
from sim.spec.scenario import CalibratedCostsSpec, FixedCostsSpec, Scenario
from sim.workload import build as workload
from sim.workload.ir import TaskGraph
from sim.workload.size import Limits, check_limits


@dataclass
class RunResult:
    """One simulated step: the scenario, the task graph it ran, the trace (one row per task, sim.output.trace
    schema), the ``Summary``, the number of engine events and, on the contention network, the links' usage."""

    scenario: Scenario
    plan: Plan
    graph: TaskGraph
    trace: pd.DataFrame
    summary: Summary
    events: int
    links: pd.DataFrame | None = None  # per-link usage under the contention network
    link_segments: pd.DataFrame | None = None  # per-link load over time, when asked for

    def __repr__(self) -> str:  # the default would print the whole scenario, graph and trace (in a notebook, too)
        return (f"RunResult({self.scenario.name!r}: step {self.summary.step_time_s:.6g} s, MFU {self.summary.mfu:.1%}, "
                f"{len(self.trace):,} tasks)")


_TOPOLOGIES: dict[str, topology.Topology] = {}  # a sweep's or search's points mostly share one cluster


def build_topology(plan: Plan) -> topology.Topology:
    """The cluster's graph; with ``costs: calibrated``, the profile's measured link tiers replace the preset's.
    Built once per distinct cluster in a process (building 1024 GPUs' links takes longer than evaluating a step)."""
    scenario = plan.scenario
    key = scenario.cluster.model_dump_json() + scenario.costs.model_dump_json() + repr(scenario.variation.links)
    if key not in _TOPOLOGIES:
        if len(_TOPOLOGIES) >= 8:
            _TOPOLOGIES.clear()
        _TOPOLOGIES[key] = _build_topology(plan)
    return _TOPOLOGIES[key]


def _build_topology(plan: Plan) -> topology.Topology:
    scenario = plan.scenario
    c = scenario.cluster
    intra, inter, nvls, all_to_all = c.intra_node, c.inter_node, c.nvls, c.all_to_all
    if isinstance(scenario.costs, CalibratedCostsSpec) and plan.profile is not None:
        measured = plan.profile
        # A measured all-to-all tier stands on the ring's NVLink when the cluster names none (its default).
        all_to_all = measured.link("all_to_all", all_to_all or intra) if measured.all_to_all else all_to_all
        nvls = measured.link("nvls", nvls) if nvls is not None else None
        intra, inter = measured.link("intra_node", intra), measured.link("inter_node", inter)
    try:
        return topology.build(c.nodes, c.gpus_per_node, intra, inter, nics_per_node=c.nics_per_node,
                              nvlink_domain=c.nvlink_domain, fabric=c.fabric, pcie=c.pcie, nvls=nvls,
                              link_factors=scenario.variation.links, all_to_all=all_to_all)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def replay(scenario: Scenario, graph: TaskGraph, net: network.Network, record_links: bool = False,
           durations: Sequence[float | None] | None = None) -> engine.EngineResult:
    """The simpy replay where times depend on contention (or ``engine: event``), else the identical and much
    cheaper longest-path evaluation (see ``sim.engine.longest_path``); ``durations`` per task id replaces the
    graph's own."""
    if net.flow_level or scenario.engine == "event":
        return engine.simulate(graph, net, record_links=record_links, durations=durations)
    return longest_path.evaluate(graph, net, durations)


@contextmanager
def without_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector: a run allocates 10^5..10^6 small containers (tasks, dependency
    lists, events) whose reference counts free them anyway, and the collector's repeated scans of them were
    over half of a run's time (0.52 -> 0.23 s for a 69k-task layout). Cycles left by simpy's processes are
    collected after the run."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def check_physical(summary: Summary, scenario: Scenario) -> None:
    """Refuse a result no GPU can produce instead of printing it: a step that is not a finite positive time, or
    the FLOPs the kernels executed faster than the GPU's dense peak (HFU above 1). Where the scenario gave the
    speed (``costs: fixed``'s layer times, an end-to-end factor below 1, a measured profile, faster-than-nominal
    variation) the error names that field; otherwise it would be a simulator bug.

    HFU, not MFU: MFU counts Megatron's full s x s attention matrix, which a causal or sliding-window flash
    kernel never runs (sim.model.ops.Op.executed_flops), so at long context it may pass 1 on a valid scenario
    (GPT-OSS 120B at 131,072 tokens without recomputation: MFU 1.10, HFU 0.44; tests/test_executed_flops.py)."""
    check_step(summary.step_time_s, summary.hfu, scenario)


def check_step(step: float, hfu: float, scenario: Scenario) -> None:
    """``check_physical`` on the two figures it reads (a confirmation checks them without a ``Summary``)."""
    if not math.isfinite(step) or step <= 0:
        raise SimError(f"result: step time {step} s is not a finite positive time (a simulator bug; please report "
                       f"the scenario)")
    if hfu > 1.0 + 1e-9:  # a kernel at exactly the peak may round a last bit above it
        above = f"at HFU {hfu:.3g}, above the GPU's dense peak (HFU must be at most 1)"
        costs, variation = scenario.costs, scenario.variation
        if isinstance(costs, FixedCostsSpec):
            raise ConfigError(f"costs.forward: the given layer times run the model's kernels {above}")
        if costs.end_to_end_factor is not None and costs.end_to_end_factor < 1:
            raise ConfigError(f"costs.end_to_end_factor: {costs.end_to_end_factor} runs the kernels {above}")
        if isinstance(costs, CalibratedCostsSpec):
            raise ConfigError(f"costs.profile: its measured curves run the kernels {above}")
        if variation.jitter or any(factor < 1 for factor in variation.slowdown.values()):
            field = "variation.jitter" if variation.jitter else "variation.slowdown"
            raise ConfigError(f"{field}: faster-than-nominal compute runs the kernels {above}")
        raise SimError(f"result: HFU {hfu:.3g} is above 1 (a simulator bug; please report the scenario)")


def run(scenario: Scenario, record_links: bool = False, limits: Limits | None = None) -> RunResult:
    """Simulate ``scenario``'s step. ``limits`` (default ``Limits()``: ``--max-tasks`` / ``--max-memory``'s
    defaults) is checked against the run's estimated size before anything is built (``sim.workload.size``), so a
    run too big for the machine is one ``ResourceLimit`` line instead of exhausted memory."""
    with without_gc():
        return _run(scenario, record_links, limits or Limits())


@dataclass
class Simulated:
    """A step simulated but not yet summarised: the plan, topology, frozen task graph, the engine's times (from
    the last replay under SM contention) and the compute time NCCL's SMs added (0 without ``network.nccl_sms``)."""

    plan: Plan
    topology: topology.Topology
    graph: TaskGraph
    result: engine.EngineResult
    sm_stretch: float


def simulate(scenario: Scenario, record_links: bool, limits: Limits, lazy: bool = False) -> Simulated:
    """Plan, size check, topology, graph and replay(s): what ``run`` and a sweep's confirmation
    (``sim.explore.confirm``) share before they read the times. ``lazy``: stamped chains kept as records where
    the replay can evaluate them so (``workload.build``'s ``lazy``, ``engine.longest_path``; a confirmation's
    graph, which no trace reads), else the graph is built eagerly or made so (``TaskGraph.materialize``)."""
    plan = resolve(scenario)
    check_limits(plan, limits)  # before the topology and the graph: a runaway run fails here, in milliseconds
    topo = build_topology(plan)
    net = network.make(scenario.network.model, topo, scenario.network.algorithm, scenario.network.protocol,
                       plan.deepep_traffic)
    # Lazy only where the longest-path replay reads the graph alone (SM contention's rounds read its tasks).
    graph = workload.build(plan, lazy=lazy and not (net.flow_level or scenario.engine == "event"
                                                    or scenario.network.nccl_sms or plan.deepep_sms))
    result = replay(scenario, graph, net, record_links)
    sm_stretch = 0.0
    if scenario.network.nccl_sms or plan.deepep_sms:  # NCCL's / DeepEP's SMs slow the compute they overlap:
        # replay to a fixed point
        graph.materialize()  # the rounds read its tasks (a no-op: a graph with SM contention is built eagerly)

        def again(durations: Sequence[float | None]) -> tuple[list[float], list[float]]:
            nonlocal result
            result = replay(scenario, graph, net, record_links, durations)
            return result.start, result.end
        # The trace's times come from the last replay, which ran the stretched durations (returned, unused here:
        # nothing downstream reads a task's duration from the graph).
        _, sm_stretch = sm_contention.settle(graph, (result.start, result.end), again,
                                             scenario.cluster.gpu.sms or 1, scenario.network.nccl_sms,
                                             scenario.network.nccl_p2p_sms, plan.deepep_sms)
    return Simulated(plan, topo, graph, result, sm_stretch)


def _run(scenario: Scenario, record_links: bool, limits: Limits) -> RunResult:
    simulated = simulate(scenario, record_links, limits)
    plan, topo, graph, result, sm_stretch = (simulated.plan, simulated.topology, simulated.graph, simulated.result,
                                             simulated.sm_stretch)
    frame = trace.to_frame(graph, result.start, result.end)
    summary = summarize(frame, plan)
    check_physical(summary, scenario)
    if scenario.network.nccl_sms:  # compute time NCCL's SMs added on the rank that lost most
        summary = replace(summary, nccl_sm_stretch_s=sm_stretch)
    if scenario.ranks == "all":  # who decided the step (in the slice every stage is its own representative)
        path = critical_path(graph, result.start, result.end, result.arrival)
        summary = replace(summary, critical_rank=path.critical_rank,
                          critical_path_s=CriticalPathSeconds(
                              compute_by_rank={str(r): s for r, s in sorted(path.compute_s.items())},
                              comm_by_kind=path.comm_s, host=path.host_s),
                          collective_wait_s={str(r): s for r, s in sorted(path.wait_s.items())})
    links = segments = None
    if result.flows is not None:
        links = link_usage.usage_frame(topo, result.flows, summary.step_time_s)
        summary = replace(summary, busiest_links=link_usage.busiest(links), critical_link=link_usage.critical(links))
        if record_links:
            segments = link_usage.segments_frame(topo, result.flows)
    return RunResult(scenario, plan, graph, frame, summary, result.events, links, segments)
