"""Exact replay without an event queue, for networks whose times do not depend on what else is running.

In: a ``TaskGraph``, a network model that is not flow-level (``ideal`` or ``analytic``) and optionally
``durations`` per task id replacing the graph's (as in ``sim.engine.event.simulate``). Out: the same
``EngineResult`` the simpy engine gives (start and end of every task, bit for bit), with ``events`` = the
number of tasks evaluated.

Why this is exact: when every task's duration is known the moment it can start (compute tasks carry theirs;
an analytic collective's time depends only on op, bytes and group), the discrete-event replay of
``sim.engine.event`` computes, for each task, start = max(end of its stream predecessor, ends of its dependencies,
and for a rendezvous the latest member's arrival) and end = start + duration. That is the longest path through
the task DAG, so it can be evaluated by walking each stream's in-order list and suspending a stream only where
it waits on a task not yet evaluated, with none of simpy's per-event overhead (a test asserts identical
traces on every bundled scenario). Contention makes a transfer's time depend on the flows beside it; those
runs stay on the event engine.

Two walks compute the same longest path. Where no collective has several simulated members (slice mode, and
``ranks: all`` with TP folded only when nothing meets), ``_walk_ranks`` takes each rank's tasks in the order
they were emitted, which is a topological order within the rank (a task's stream predecessor and its own-rank
dependencies were emitted before it), and suspends a rank only where it waits on another rank's task (a pipeline
send); a task's start is the max of its stream predecessor's end and its dependencies' ends, read from one list
in which an unfinished task's end is +inf, so one comparison tells a blocked task. The stream walk below (any
graph, rendezvous included) suspends a stream at each cross-stream wait, which in a pass of alternating compute
and TP tasks is every task: on the 175B search's layouts the rank walk evaluated a step in about a third of the
time (issue 25). Both take the same maxima of the same floats and add the same durations, so the times are equal
bit for bit (tests/test_longest_path.py); should the emission order ever not be a schedule the ranks can follow,
the rank walk stops and the stream walk evaluates the graph (or names the deadlock).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import attrgetter

import numpy as np

from sim.engine.event import EngineResult, deadlock_error, task_durations
from sim.engine.rendezvous import Rendezvous
from sim.network.models import Network, transfer_time
from sim.workload.ir import TaskGraph


def evaluate(graph: TaskGraph, network: Network, durations: Sequence[float | None] | None = None) -> EngineResult:
    tasks = graph.tasks
    seconds_of = task_durations(graph, durations)
    nan = float("nan")
    start = [nan] * len(tasks)
    end = [nan] * len(tasks)
    done = bytearray(len(tasks))

    meets = Rendezvous(graph.shared_collectives())
    shared = set(meets.members)
    # Read once per task, not once per visit: its dependencies, its rendezvous key (only where some collective has
    # several simulated members: slice mode has none but DualPipe's meetings) and its seconds, a communication
    # task's priced once per (op, bytes, group, skew): a step repeats a few transfers many times.
    deps_of = list(map(attrgetter("deps"), tasks))
    key_of = [task.collective for task in tasks] if shared else []
    priced: dict[tuple[str, float, tuple[int, ...], float], float] = {}
    seconds: list[float] = list(seconds_of)  # type: ignore[arg-type]  # the Nones are replaced below
    transfer = attrgetter("op", "nbytes", "group", "skew")
    for task_id in [i for i, duration in enumerate(seconds) if duration is None]:
        key = transfer(tasks[task_id])
        value = priced.get(key)
        if value is None:
            value = priced[key] = transfer_time(network, *key)
        seconds[task_id] = value

    if not shared:
        walked = _walk_ranks(graph, seconds, deps_of)
        if walked is not None:
            return EngineResult(start=walked[0], end=walked[1], events=len(tasks), arrival=meets.arrival)

    orders = [graph.streams[key] for key in sorted(graph.streams)]
    position = [0] * len(orders)
    free_at = [0.0] * len(orders)
    waiting: dict[int, list[int]] = {}  # task -> streams suspended until it ends
    work = list(range(len(orders) - 1, -1, -1))

    def wake(task_id: int) -> None:
        streams = waiting.pop(task_id, None)
        if streams:
            work.extend(streams)

    while work:
        s = work.pop()
        order, i, ready_at = orders[s], position[s], free_at[s]
        count = len(order)
        while i < count:
            task_id = order[i]
            if done[task_id]:  # a rendezvous that ended while this stream was suspended on it
                ready_at = end[task_id]
                i += 1
                continue
            blocked = -1
            ready = ready_at
            for dep in deps_of[task_id]:
                if not done[dep]:
                    blocked = dep
                    break
                if end[dep] > ready:
                    ready = end[dep]
            if blocked >= 0:
                waiting.setdefault(blocked, []).append(s)
                break
            if shared and key_of[task_id] in shared:
                met = meets.arrive(key_of[task_id], task_id, ready)
                if met is None:
                    waiting.setdefault(task_id, []).append(s)
                    break
                released, arrived = met
                finish = released + seconds[task_id]
                for member in arrived:
                    start[member], end[member], done[member] = released, finish, 1
                    if member != task_id:
                        wake(member)
                ready_at = finish
            else:
                start[task_id] = ready
                ready_at = end[task_id] = ready + seconds[task_id]
                done[task_id] = 1
            if task_id in waiting:
                wake(task_id)
            i += 1
        position[s], free_at[s] = i, ready_at

    if not all(done):
        raise deadlock_error(graph, end)
    return EngineResult(start=start, end=end, events=len(tasks), arrival=meets.arrival)


def _walk_ranks(graph: TaskGraph, seconds: list[float], deps_of: list[Sequence[int]]
                ) -> tuple[list[float], list[float]] | None:
    """Start and end of every task of a graph without rendezvous, walking each rank's tasks in emission order
    (see the module's docstring); None if the walk cannot finish (the stream walk then decides)."""
    tasks = graph.tasks
    n = len(tasks)
    if n == 0:
        return [], []
    # Per task: its stream predecessor (n, a sentinel whose end is 0.0, for a stream's first task) and its rank;
    # the stream lists give both in numpy, a few calls per stream.
    previous = np.empty(n, dtype=np.int64)
    rank_of = np.empty(n, dtype=np.int64)
    for (rank, _), order in graph.streams.items():
        ids = np.array(order, dtype=np.int64)
        previous[ids[1:]] = ids[:-1]
        previous[ids[0]] = n
        rank_of[ids] = rank
    cuts = (np.flatnonzero(np.diff(rank_of)) + 1).tolist()  # runs of one rank's consecutive tasks
    lows, highs = [0, *cuts], [*cuts, n]
    prev = previous.tolist()
    inf = math.inf
    start = [math.nan] * n
    end = [inf] * n + [0.0]  # +inf: not yet evaluated; end[n]: the sentinel
    position = lows[:]
    waiting: dict[int, list[int]] = {}  # task -> runs suspended until it ends
    work = list(range(len(lows) - 1, -1, -1))
    while work:
        run = work.pop()
        i, high = position[run], highs[run]
        while i < high:
            ready = end[prev[i]]
            for dep in deps_of[i]:
                at = end[dep]
                if at > ready:
                    ready = at
            if ready == inf:  # waits on a task not yet evaluated (another rank's, or its own later one)
                blocker = prev[i] if end[prev[i]] == inf else next(d for d in deps_of[i] if end[d] == inf)
                waiting.setdefault(blocker, []).append(run)
                break
            start[i] = ready
            end[i] = ready + seconds[i]
            if waiting and i in waiting:
                work.extend(waiting.pop(i))
            i += 1
        position[run] = i
    if position != highs:
        return None
    del end[n]
    return start, end
