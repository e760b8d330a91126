"""ranks: all folds each TP group into one process (its ranks run in lockstep); the result is the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim import runner
from sim.engine import event as engine
from sim.network import models as network
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload import build as workload

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
SPINE = SCENARIOS / "llama2-7b_h100-32_spine.yaml"


@pytest.mark.parametrize("extra", [[], ["cluster.fabric.oversubscription=1"], ["cluster.fabric.nodes_per_leaf=1"]],
                         ids=lambda e: ",".join(e) or "4:1")
def test_folding_tp_groups_keeps_times_and_link_bytes(extra: list[str]) -> None:
    scenario = load_scenario(SPINE, extra)
    net = network.make(scenario.network.model, runner.build_topology(resolve(scenario)), scenario.network.algorithm)
    every, folded = workload.build(resolve(scenario), fold=False), workload.build(resolve(scenario))
    assert folded.lockstep == 8 and len(every.tasks) == 8 * len(folded.tasks)
    a, b = engine.simulate(every, net), engine.simulate(folded, net)
    assert max(b.end) == pytest.approx(max(a.end), rel=1e-12)
    assert a.flows is not None and b.flows is not None
    assert set(a.flows.links) == set(b.flows.links)
    for link, usage in a.flows.links.items():  # every link carried the same bytes
        assert b.flows.links[link].bytes == pytest.approx(usage.bytes, rel=1e-9, abs=1.0)
    # The folded process of TP group g runs each stream's tasks exactly when rank 8g (tp rank 0) did unfolded.
    for (rank, stream), order in folded.streams.items():
        unfolded = every.streams[(rank, stream)]
        assert [b.start[t] for t in order] == pytest.approx([a.start[t] for t in unfolded], rel=1e-9, abs=1e-12)
        assert [folded.tasks[t].name for t in order] == [every.tasks[t].name for t in unfolded]


def test_no_folding_when_ranks_of_a_group_differ() -> None:
    assert workload.folds_tp(resolve(load_scenario(SPINE)))
    assert not workload.folds_tp(resolve(load_scenario(SPINE, ["variation.slowdown={3: 1.1}"])))
    assert not workload.folds_tp(resolve(load_scenario(SPINE, ["variation.jitter=0.01"])))
    assert not workload.folds_tp(resolve(load_scenario(SPINE, ["variation.links={nic0.3: 0}"])))
    assert not workload.folds_tp(resolve(load_scenario(SPINE, ["ranks=slice"])))
    assert not workload.folds_tp(resolve(load_scenario(SPINE, ["fold_tp=false"])))
    assert workload.build(resolve(load_scenario(SPINE, ["variation.slowdown={3: 1.1}"]))).lockstep == 1


def test_tp_collectives_alone_on_their_links_are_timed_without_flows_with_the_same_result() -> None:
    scenario = load_scenario(SPINE)
    net = network.make(scenario.network.model, runner.build_topology(resolve(scenario)), scenario.network.algorithm)
    graph = workload.build(resolve(scenario))
    mirrored = lambda task: net.transfer(task.op, task.nbytes, task.group)  # noqa: E731  (TP: no mirrors)
    private = engine.private_tp_transfers(graph, mirrored)
    assert private and all(group in {tuple(range(8 * g, 8 * g + 8)) for g in range(4)} for _, _, group in private)
    fast = engine.simulate(graph, net)  # private TP collectives timed directly, bytes booked
    full = engine.simulate(graph, net, record_links=True)  # every transfer as flows
    assert fast.end == pytest.approx(full.end, rel=1e-12, abs=1e-15)
    assert fast.events < full.events
    assert fast.flows is not None and full.flows is not None
    for link, usage in full.flows.links.items():
        booked = fast.flows.links[link]
        assert booked.bytes == pytest.approx(usage.bytes, rel=1e-9)
        assert booked.busy_s == pytest.approx(usage.busy_s, rel=1e-9)
        assert booked.saturated_s == pytest.approx(usage.saturated_s, rel=1e-9, abs=1e-12)
        assert booked.peak_load == pytest.approx(usage.peak_load, rel=1e-9)
