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
"""

from __future__ import annotations

from collections.abc import Sequence

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
    deps_of = [task.deps for task in tasks]
    key_of = [task.collective for task in tasks] if shared else []
    priced: dict[tuple[str, float, tuple[int, ...], float], float] = {}
    seconds: list[float] = []
    for task_id, duration in enumerate(seconds_of):
        if duration is None:
            task = tasks[task_id]
            key = (task.op, task.nbytes, task.group, task.skew)
            if key not in priced:
                priced[key] = transfer_time(network, task.op, task.nbytes, task.group, task.skew)
            duration = priced[key]
        seconds.append(duration)

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
