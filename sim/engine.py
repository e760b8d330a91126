"""Discrete-event replay of a task graph (the only module that imports simpy).

In: a ``TaskGraph`` and a network model. Out: ``EngineResult``: the start and end time of every task and the
number of simpy events processed.

One simpy process per (rank, stream) walks that stream's ordered task list like a CUDA stream: wait until
every dependency has finished, run the task, record its start and end, signal done. A rank's streams run
concurrently, which is where compute/communication overlap comes from. A collective whose group has several
simulated members is a rendezvous: it starts when the last member arrives and all members end together.
Communication time comes from the network model when the task starts. If the run ends with tasks not done,
``ScheduleDeadlock`` names the first stuck task of each stream and what it waits on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator

import simpy

from sim.errors import ScheduleDeadlock
from sim.network import Network
from sim.workload import Task, TaskGraph


class _CountingEnvironment(simpy.Environment):
    """simpy environment that counts scheduled events (for the benchmark's events/s)."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduled = 0

    def schedule(self, event: simpy.Event, priority: int = 1, delay: float = 0) -> None:  # type: ignore[override]
        self.scheduled += 1
        super().schedule(event, priority, delay)


@dataclass
class EngineResult:
    start: list[float]
    end: list[float]
    events: int


def _describe(task: Task) -> str:
    where = f"rank {task.rank} {task.stream} {task.kind} {task.name}"
    if task.microbatch >= 0:
        where += f" mb {task.microbatch}"
    if task.layer >= 0:
        where += f" layer {task.layer}"
    return f"task {task.id} ({where})"


def simulate(graph: TaskGraph, network: Network) -> EngineResult:
    env = _CountingEnvironment()
    tasks = graph.tasks
    done = [env.event() for _ in tasks]
    start = [float("nan")] * len(tasks)
    end = [float("nan")] * len(tasks)

    members: dict[int, int] = {}
    for task in tasks:
        if task.collective >= 0:
            members[task.collective] = members.get(task.collective, 0) + 1
    arrived: dict[int, int] = {}
    released: dict[int, simpy.Event] = {key: env.event() for key, count in members.items() if count > 1}

    def duration_of(task: Task) -> float:
        if task.duration is not None:
            return task.duration
        if task.op == "send":
            return network.p2p_time(task.nbytes, task.group[0], task.group[1])
        return network.collective_time(task.op, task.nbytes, task.group)

    def stream(order: list[int]) -> Generator[simpy.Event, None, None]:
        for task_id in order:
            task = tasks[task_id]
            for dep in task.deps:
                if not done[dep].processed:
                    yield done[dep]
            rendezvous = released.get(task.collective)
            if rendezvous is not None:
                arrived[task.collective] = arrived.get(task.collective, 0) + 1
                if arrived[task.collective] == members[task.collective]:
                    rendezvous.succeed()
                yield rendezvous
            start[task_id] = env.now
            seconds = duration_of(task)
            if seconds > 0:
                yield env.timeout(seconds)
            end[task_id] = env.now
            done[task_id].succeed()

    for key in sorted(graph.streams):
        env.process(stream(graph.streams[key]))
    env.run()

    stuck = [order[next(i for i, t in enumerate(order) if end[t] != end[t])]
             for order in graph.streams.values() if any(end[t] != end[t] for t in order)]
    if stuck:
        lines = []
        for task_id in stuck[:4]:
            waiting = [d for d in tasks[task_id].deps if end[d] != end[d]]
            on = ", ".join(_describe(tasks[d]) for d in waiting[:2]) or "a collective rendezvous"
            lines.append(f"{_describe(tasks[task_id])} waits on {on}")
        more = f" (+{len(stuck) - 4} more streams)" if len(stuck) > 4 else ""
        raise ScheduleDeadlock(f"{len(stuck)} stream(s) never finished: " + "; ".join(lines) + more)
    return EngineResult(start=start, end=end, events=env.scheduled)
