"""The longest-path evaluation is the simpy replay, bit for bit, wherever no time depends on contention."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim import runner
from sim.engine import event as engine
from sim.engine import longest_path
from sim.errors import ScheduleDeadlock
from sim.network import models as network
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload import build as workload
from sim.workload.ir import TaskGraph

SCENARIOS = sorted((Path(__file__).resolve().parent.parent / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("ranks", ["slice", "all"])
@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_identical_to_event_replay(path: Path, ranks: str) -> None:
    scenario = load_scenario(path)
    if scenario.cluster.nodes * scenario.cluster.gpus_per_node > 64 and ranks == "all":
        pytest.skip("every rank of 1024 GPUs is the benchmark's job")
    if scenario.network.model == "contention":  # the same scenario on its closed-form network
        scenario = scenario.model_copy(update={"network": scenario.network.model_copy(update={"model": "analytic"})})
    scenario = scenario.model_copy(update={"ranks": ranks})
    graph = workload.build(resolve(scenario))
    net = network.make(scenario.network.model, runner.build_topology(resolve(scenario)), scenario.network.algorithm)
    events, evaluated = engine.simulate(graph, net), longest_path.evaluate(graph, net)
    assert evaluated.start == events.start
    assert evaluated.end == events.end
    assert evaluated.events == len(graph.tasks)


def test_runner_picks_the_event_engine_for_contention_and_when_asked() -> None:
    path = Path(__file__).resolve().parent.parent / "scenarios" / "tiny.yaml"
    scenario = load_scenario(path)
    fast = runner.run(scenario)
    slow = runner.run(scenario.model_copy(update={"engine": "event"}))
    assert fast.events == len(fast.graph.tasks) < slow.events  # simpy schedules more than one event per task
    assert fast.trace.equals(slow.trace)


def test_deadlock_names_the_stuck_tasks() -> None:
    graph = TaskGraph(match_collectives=False)
    a = graph.add(0, 0, "compute", "forward", "a", 0, 0, [], duration=1.0)
    b = graph.add(0, 0, "tp", "tp", "b", 0, 0, [], op="all_reduce", nbytes=1.0, group=(0, 1))
    graph.tasks[a].deps.append(b)
    graph.tasks[b].deps.append(a)
    with pytest.raises(ScheduleDeadlock, match="2 stream\\(s\\) never finished: task 0 .* waits on task 1"):
        longest_path.evaluate(graph, network.IdealNetwork())
    with pytest.raises(ScheduleDeadlock, match="2 stream\\(s\\) never finished"):
        engine.simulate(graph, network.IdealNetwork())


def test_a_dependency_on_a_later_emitted_task_is_evaluated() -> None:
    """The rank walk takes a rank's tasks in emission order; a task that waits on its own rank's later task (on
    another stream) stops it, and the stream walk evaluates the graph: the same times as the event replay. With
    another rank's task emitted between them, the rank's tasks are two runs and the rank walk finishes itself."""
    for between in (False, True):
        graph = TaskGraph(match_collectives=False)
        a = graph.add(0, 0, "compute", "forward", "a", 0, 0, [], duration=1.0)
        if between:
            graph.add(1, 1, "compute", "forward", "x", 0, 0, [a], duration=0.25)
        b = graph.add(0, 0, "tp", "tp", "b", 0, 0, [], duration=0.5)
        graph.tasks[a].deps.append(b)
        c = graph.add(0, 0, "compute", "forward", "c", 0, 0, [b], duration=2.0)
        graph.freeze()
        net = network.IdealNetwork()
        events, evaluated = engine.simulate(graph, net), longest_path.evaluate(graph, net)
        assert evaluated.start == events.start
        assert evaluated.end == events.end
        assert evaluated.start[a] == evaluated.end[b] == 0.5
        assert evaluated.end[c] == evaluated.end[a] + 2.0 == 3.5
        walked = longest_path._walk_ranks(graph, [task.duration for task in graph.tasks],
                                          [task.deps for task in graph.tasks])
        assert (walked is None) is not between
