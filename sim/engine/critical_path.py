"""Which rank (and link) decided the step: the critical path through an executed task graph.

In: the ``TaskGraph``, the engine's start and end times, and each rendezvous member's arrival time. Out:
``CriticalPath``: the task ids from the step's last task back to the first, the seconds it spends per rank in
compute, per kind in communication and on the host behind a host sync (``Kind.HOST``: issuing MoE layer passes
behind the token dispatcher's sync, sim.costs.host; the trainer's metric sync, sim.workload.train_metrics; neither
compute nor communication, so its own category), the rank with
the most compute on it (``critical_rank``), and the seconds every rank waited at collectives for the last member
(straggler cost). Compute, communication and host seconds are the path's tasks' lengths: each task starts when
the one the path continues from ends, so they sum to the step's length.

Walking back: a task started when the latest of its stream predecessor and its dependencies ended; a
collective started when its last member arrived, so the path continues from that member's predecessors.
Ties (equal end times) go to the dependency over the stream predecessor, so a wait is attributed to what was
waited for.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from sim.workload.ir import COMPUTE_KINDS, Kind, TaskGraph


@dataclass
class CriticalPath:
    tasks: list[int]
    compute_s: dict[int, float] = field(default_factory=dict)  # rank -> compute seconds on the path
    comm_s: dict[str, float] = field(default_factory=dict)  # kind -> communication seconds on the path
    host_s: float = 0.0  # seconds on the path the host works behind a host sync (Kind.HOST: MoE issue, metrics)
    wait_s: dict[int, float] = field(default_factory=dict)  # rank -> seconds its collectives waited for others

    @property
    def critical_rank(self) -> int:
        return max(self.compute_s, key=lambda rank: (self.compute_s[rank], -rank)) if self.compute_s else 0


def critical_path(graph: TaskGraph, start: list[float], end: list[float],
                  arrival: dict[int, float]) -> CriticalPath:
    tasks = graph.tasks
    before: dict[int, int] = {}
    for order in graph.streams.values():
        for previous, task_id in itertools.pairwise(order):
            before[task_id] = previous
    members: dict[int, list[int]] = {}
    for task_id in arrival:
        members.setdefault(tasks[task_id].collective, []).append(task_id)

    result = CriticalPath([])
    for task_id, arrived in arrival.items():
        rank = tasks[task_id].rank
        result.wait_s[rank] = result.wait_s.get(rank, 0.0) + start[task_id] - arrived
    current = max(range(len(tasks)), key=lambda i: (end[i], -i)) if tasks else -1
    while current >= 0:
        task = tasks[current]
        result.tasks.append(current)
        seconds = end[current] - start[current]
        if task.kind in COMPUTE_KINDS or task.kind == Kind.OPTIMIZER:
            result.compute_s[task.rank] = result.compute_s.get(task.rank, 0.0) + seconds
        elif task.kind == Kind.HOST:  # the CPU (a MoE layer's issue, the metric sync): no GPU compute, no transfer
            result.host_s += seconds
        else:
            kind = str(task.kind)  # a plain string for the summary (YAML cannot write a Kind member)
            result.comm_s[kind] = result.comm_s.get(kind, 0.0) + seconds
        if task.collective in members and len(members[task.collective]) > 1:  # continue from the last arrival
            current = max(members[task.collective], key=lambda m: (arrival[m], -m))
            task = tasks[current]
        candidates = list(task.deps) + ([before[current]] if current in before else [])
        current = max(candidates, key=lambda c: (end[c], c in task.deps, -c)) if candidates else -1
    return result
