"""Run one scenario end to end, in memory.

In: a validated ``Scenario``. Out: ``RunResult`` with the task graph, the trace DataFrame, the summary and
the number of simulated events. This is the data flow of ARCHITECTURE.md in one place (topology -> network,
workload -> task graph, engine -> trace -> summary), shared by the CLI, sweeps and benchmarks. No files are
written here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from sim import engine, network, topology, trace, workload
from sim.config import Scenario


@dataclass
class RunResult:
    scenario: Scenario
    graph: workload.TaskGraph
    trace: pd.DataFrame
    summary: dict[str, Any]
    events: int


def run(scenario: Scenario) -> RunResult:
    cluster = scenario.cluster
    topo = topology.build(cluster.nodes, cluster.gpus_per_node, cluster.intra_node, cluster.inter_node)
    net = network.make(scenario.network.model, topo)
    graph = workload.build(scenario)
    result = engine.simulate(graph, net)
    frame = trace.to_frame(graph, result.start, result.end)
    return RunResult(scenario, graph, frame, trace.summarize(frame, scenario), result.events)
