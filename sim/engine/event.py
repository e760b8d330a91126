"""Discrete-event replay of a task graph (the only module that imports simpy).

In: a ``TaskGraph`` and a network model. Out: ``EngineResult``: the start and end time of every task and the
number of simpy events processed.

One simpy process per (rank, stream) walks that stream's ordered task list like a CUDA stream: wait until
every dependency has finished, run the task, record its start and end, signal done. A rank's streams run
concurrently, which is where compute/communication overlap comes from. A collective whose group has several
simulated members is a rendezvous: it starts when the last member arrives and all members end together.
Communication time comes from the network model when the task starts. With a flow-level network (``contention``: a
``sim.network.models.FlowLevelNetwork``) a transfer instead runs its phases: a latency, then its channels as flows
in a ``sim.network.flows.FlowNetwork`` that shares links max-min fairly; a timer per flow fires at its predicted
finish and is re-armed whenever other flows come or go. A TP collective whose links no other transfer ever uses
(``private_tp_transfers``: NVLink ports of its own GPUs, not crossed by any DP/PP route) would run alone at its
uncontended rate, which is its analytic time: it is timed so, and its bytes are booked on its links, without flows
(not when a link timeline is recorded). If the run ends with tasks not done, ``ScheduleDeadlock`` names the first
stuck task of each stream and what it waits on. ``durations`` (per task id, e.g. the compute durations SM
contention stretched) replaces the graph's own; the graph is only read.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import simpy
from simpy.events import NORMAL, EventPriority

from sim.engine.rendezvous import Rendezvous
from sim.errors import ScheduleDeadlock
from sim.network.flows import FlowNetwork, MirrorBroken
from sim.network.mirror import Mirror
from sim.network.models import FlowLevelNetwork, Network, TransferPhase, is_flow_level, transfer_time
from sim.parallel.grid import lockstep_groups
from sim.workload.ir import Kind, Task, TaskGraph


class _CountingEnvironment(simpy.Environment):
    """simpy environment that counts scheduled events (for the benchmark's events/s)."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduled = 0

    def schedule(self, event: simpy.Event, priority: EventPriority = NORMAL, delay: float = 0) -> None:
        self.scheduled += 1
        super().schedule(event, priority, delay)


@dataclass
class EngineResult:
    start: list[float]
    end: list[float]
    events: int
    flows: FlowNetwork | None = None  # link usage of a flow-level run
    arrival: dict[int, float] = field(default_factory=dict)  # rendezvous member -> when its rank reached it


def _describe(task: Task) -> str:
    where = f"rank {task.rank} {task.stream} {task.kind} {task.name}"
    if task.microbatch >= 0:
        where += f" mb {task.microbatch}"
    if task.layer >= 0:
        where += f" layer {task.layer}"
    return f"task {task.id} ({where})"


def deadlock_error(graph: TaskGraph, end: list[float]) -> ScheduleDeadlock:
    """The error for a replay that left tasks unfinished: the first stuck task of each stream and its waits."""
    tasks = graph.tasks
    stuck = [order[next(i for i, t in enumerate(order) if end[t] != end[t])]
             for order in graph.streams.values() if any(end[t] != end[t] for t in order)]
    lines = []
    for task_id in stuck[:4]:
        waiting = [d for d in tasks[task_id].deps if end[d] != end[d]]
        on = ", ".join(_describe(tasks[d]) for d in waiting[:2]) or "a collective rendezvous"
        lines.append(f"{_describe(tasks[task_id])} waits on {on}")
    more = f" (+{len(stuck) - 4} more streams)" if len(stuck) > 4 else ""
    return ScheduleDeadlock(f"{len(stuck)} stream(s) never finished: " + "; ".join(lines) + more)


def task_durations(graph: TaskGraph, durations: Sequence[float | None] | None) -> Sequence[float | None]:
    """Seconds per task id for the tasks that carry their own time (None: the network times it): ``durations``
    when given (one entry per task), else the graph's. Raises ValueError on a length mismatch."""
    if durations is None:
        return list(map(attrgetter("duration"), graph.tasks))
    if len(durations) != len(graph.tasks):
        raise ValueError(f"durations: {len(durations)} entries for a graph of {len(graph.tasks)} tasks")
    return durations


def private_tp_transfers(graph: TaskGraph, phases_of: Callable[[Task], tuple[TransferPhase, ...]]
                         ) -> set[tuple[str, float, tuple[int, ...]]]:
    """(op, bytes, group) of the TP collectives whose links carry nothing else: no DP/PP transfer's route and no
    other TP group's collective touches them (TP collectives of one group run one at a time on its stream). The
    optimizer's one-float all-reduces (gradient norm, found-inf) are not counted: they run after the step's last
    TP collective (the optimizer waits for every pass), and carry 4 bytes."""
    others: set[int] = set()
    seen: set[tuple[str, float, tuple[int, ...], str]] = set()
    tp: dict[tuple[str, float, tuple[int, ...]], set[int]] = {}
    for task in graph.tasks:
        if not task.op or task.duration is not None or task.kind == Kind.OPTIMIZER:
            continue
        key = (task.op, task.nbytes, task.group, task.kind)
        if key in seen:
            continue
        seen.add(key)
        links = {link for phase in phases_of(task) for channel in phase.channels for link, _ in channel.loads}
        if task.kind == Kind.TP:
            tp[key[:3]] = links
        else:
            others |= links
    owner: dict[int, tuple[int, ...]] = {}
    clash: set[tuple[int, ...]] = set()
    for (_, _, group), links in tp.items():
        for link in links:
            if owner.setdefault(link, group) != group:
                clash |= {group, owner[link]}
    return {key for key, links in tp.items() if not links & others and key[2] not in clash}


def lockstep_mirror(graph: TaskGraph, network: FlowLevelNetwork, seconds_of: Sequence[float | None],
                    phases_of: Callable[[Task], tuple[TransferPhase, ...]],
                    private: set[tuple[str, float, tuple[int, ...]]]
                    ) -> tuple[Mirror, set[tuple[Any, ...]], set[tuple[Any, ...]]] | None:
    """The link map under which every DP/PP transfer of a folded graph is its TP peers' copies
    (sim.network.mirror), the (op, bytes, group, skew) keys of those transfers, and the keys of the transfers
    outside the map whose flows cross its links (a group spanning the TP dimension, a TP collective run as flows:
    the mirror must stop before they start); None when some lockstep transfer is not a mirror of its copies
    (every transfer then runs all its copies as flows)."""
    mirror = Mirror(graph.lockstep, network.capacities)
    bundled: set[tuple[Any, ...]] = set()
    outside: dict[tuple[Any, ...], set[int]] = {}
    seen: set[tuple[Any, ...]] = set()
    for task in graph.tasks:
        if not task.op or seconds_of[task.id] is not None:
            continue
        key = (task.op, task.nbytes, task.group, task.skew)
        if key + (task.kind == Kind.TP,) in seen:
            continue
        seen.add(key + (task.kind == Kind.TP,))
        groups = lockstep_groups(task.group, graph.lockstep) if task.kind != Kind.TP else (task.group,)
        if len(groups) == 1:
            if task.kind != Kind.TP or key[:3] not in private:
                outside[key] = {link for phase in phases_of(task) for channel in phase.channels
                                for link, _ in channel.loads}
            continue
        if not mirror.add([network.transfer(task.op, task.nbytes, group, task.skew) for group in groups]):
            return None
        bundled.add(key)
    links = mirror.links()
    return mirror, bundled, {key for key, crossed in outside.items() if crossed & links}


def simulate(graph: TaskGraph, network: Network, record_links: bool = False,
             durations: Sequence[float | None] | None = None, mirror: bool = True) -> EngineResult:
    """Replay ``graph`` on ``network``. ``mirror``: on a flow-level network, solve the lockstep copies of a folded
    rank's transfers as one where they are provably alike (``lockstep_mirror``); the same times and link usage.
    A mirrored flow still running when a transfer outside the mirror crosses its links ends the mirrored replay,
    and the graph is replayed without it."""
    if mirror and is_flow_level(network) and graph.lockstep > 1:
        try:
            return _replay(graph, network, record_links, durations, True)
        except MirrorBroken:
            pass
    return _replay(graph, network, record_links, durations, False)


def _replay(graph: TaskGraph, network: Network, record_links: bool,
            durations: Sequence[float | None] | None, use_mirror: bool) -> EngineResult:
    env = _CountingEnvironment()
    tasks = graph.tasks
    seconds_of = task_durations(graph, durations)
    waiting: dict[int, simpy.Event] = {}  # task -> the event its dependants wait on, made on first need
    start = [float("nan")] * len(tasks)
    end = [float("nan")] * len(tasks)

    meets = Rendezvous(graph.shared_collectives())
    released: dict[int, float] = {}
    finished: dict[int, simpy.Event] = {key: env.event() for key in meets.members}

    flow_net = network if is_flow_level(network) else None
    flows = FlowNetwork(flow_net.capacities, record_links) if flow_net is not None else None
    # flow key -> [flows of its phase still running, the event the last one's end succeeds]
    pending: dict[int, list[Any]] = {}
    version: dict[int, int] = {}  # flow key -> the stamp of its live timer (until the flow ends)
    keys = itertools.count()  # flow keys in the order flows start (the solver sorts a component by them)

    last: list[Any] = [-1, -1.0, None]  # the newest timer: [env.scheduled after it, its time, its batch]

    def arm(finish: dict[int, float]) -> None:
        """A timer per flow at its finish time. A flow that ends when the newest timer fires, with nothing
        scheduled since that timer, joins its batch: simpy would have run the two timers one after the other
        (consecutive event ids at one time), so the batch fires its flows in the order they were armed."""
        now = env.now
        for key, when in finish.items():
            stamp = version[key] = version[key] + 1
            delay = max(0.0, when - now)
            at = now + delay  # the time simpy schedules the timer at
            if last[0] == env.scheduled and last[1] == at:
                last[2].append((key, stamp))
                continue
            batch = [(key, stamp)]
            timer = env.timeout(delay)
            timer.callbacks.append(functools.partial(fired, batch=batch))
            last[:] = env.scheduled, at, batch

    def fired(_event: simpy.Event, batch: list[tuple[int, int]]) -> None:  # a timer's callback
        for key, stamp in batch:
            fire(key, stamp)

    def fire(key: int, stamp: int) -> None:
        if version.get(key) != stamp or key not in pending:
            return  # a later rate change re-armed this flow
        assert flows is not None
        del version[key]
        phase = pending.pop(key)
        arm(flows.remove(key, env.now))
        phase[0] -= 1
        if phase[0] == 0:
            phase[1].succeed()

    def relay(_event: simpy.Event, joined: simpy.Event) -> None:
        joined.succeed()

    def run_phases(phases: tuple[TransferPhase, ...]) -> Generator[simpy.Event, None, None]:
        """A transfer's phases: each a latency, then its channels as flows. A phase of several flows ends when
        its last flow ends, on the event after that (where simpy's ``all_of`` over one event per flow would have
        resumed the transfer: one event after the last flow's)."""
        assert flows is not None
        for phase in phases:
            if phase.latency > 0:
                yield env.timeout(phase.latency)
            channels = phase.channels
            if not channels:
                continue
            done = env.event()
            record = [len(channels), done]
            for channel in channels:
                key = next(keys)
                version[key] = 0
                pending[key] = record
                arm(flows.add(key, channel.loads, channel.nbytes, channel.rate_cap, env.now))
            if len(channels) == 1:
                yield done
            else:
                joined = env.event()
                done.callbacks.append(functools.partial(relay, joined=joined))
                yield joined

    merged: dict[tuple[str, float, tuple[int, ...], float], tuple[TransferPhase, ...]] = {}

    def mirrored(task: Task) -> tuple[TransferPhase, ...]:
        """The transfer's phases; a folded rank's DP/PP transfer carries its lockstep TP peers' flows too."""
        assert flow_net is not None
        transfer = flow_net.transfer
        if graph.lockstep == 1 or task.kind == Kind.TP:
            return transfer(task.op, task.nbytes, task.group, task.skew)
        key = (task.op, task.nbytes, task.group, task.skew)
        if key not in merged:
            peers = [transfer(task.op, task.nbytes, group, task.skew)
                     for group in lockstep_groups(task.group, graph.lockstep)]
            merged[key] = tuple(TransferPhase(max(p.latency for p in same),
                                              tuple(ch for p in same for ch in p.channels))
                                for same in zip(*peers, strict=True))
        return merged[key]

    private = private_tp_transfers(graph, mirrored) if flows is not None and not record_links else set()
    bundled: set[tuple[Any, ...]] = set()  # mirrored transfers: copy 0's flows stand for all (lockstep_mirror)
    crossing: set[tuple[Any, ...]] = set()  # transfers outside the mirror that cross its links
    if use_mirror and flows is not None and flow_net is not None:
        found = lockstep_mirror(graph, flow_net, seconds_of, mirrored, private)
        if found is not None and found[0].images:
            flows.images, bundled, crossing = dict(found[0].images), found[1], found[2]

    def flow_phases(task: Task) -> tuple[TransferPhase, ...]:
        """The phases a transfer runs as flows: copy 0's alone while the mirror holds, else ``mirrored``."""
        assert flows is not None and flow_net is not None
        if flows.images:
            key = (task.op, task.nbytes, task.group, task.skew)
            if task.kind != Kind.TP and key in bundled:
                return flow_net.transfer(*key)
            if key in crossing:
                flows.unmirror()
        return mirrored(task)
    # per (op, bytes, group, skew) of a TP collective: a lone one's time and registered link bookings
    # (FlowNetwork.register_lone), or None where it runs as flows
    alone: dict[tuple[Any, ...], tuple[float, int] | None] = {}

    def lone_seconds(task: Task) -> float | None:
        """A communication task's seconds when it needs no flows (None: it runs as flows): a lone TP collective
        (its links booked: ``FlowNetwork.book_lone``), or any transfer on a network without flows."""
        if flows is None:
            return transfer_time(network, task.op, task.nbytes, task.group, task.skew)
        if task.kind != Kind.TP:
            return None
        key = (task.op, task.nbytes, task.group, task.skew)
        try:
            lone = alone[key]
        except KeyError:  # a TP collective repeats every layer and micro-batch: its time and bookings once
            lone = alone[key] = lone_transfer(task) if key[:3] in private else None
        if lone is None:
            return None
        flows.book_lone(lone[1])
        return lone[0]

    def lone_transfer(task: Task) -> tuple[float, int]:
        """A lone TP collective's uncontended time and its registered link bookings."""
        assert flows is not None
        phases = mirrored(task)
        return (sum(phase.latency + max((ch.nbytes / ch.rate_cap for ch in phase.channels), default=0.0)
                    for phase in phases),
                flows.register_lone([row for phase in phases for channel in phase.channels
                                     for row in flows.alone_rows(channel.loads, channel.nbytes, channel.rate_cap)]))

    def communicate(task: Task) -> Generator[simpy.Event, None, None]:
        """A task's time: its own duration, a lone transfer's time, or its flows."""
        seconds = seconds_of[task.id]
        if seconds is None:
            seconds = lone_seconds(task)
            if seconds is None:
                yield from run_phases(flow_phases(task))
                return
        if seconds > 0:
            yield env.timeout(seconds)

    def run_shared(task: Task, event: simpy.Event) -> Generator[simpy.Event, None, None]:
        yield from communicate(task)
        event.succeed()

    def stream(order: list[int]) -> Generator[simpy.Event, None, None]:
        timeout = env.timeout
        for task_id in order:
            task = tasks[task_id]
            for dep in task.deps:
                if end[dep] != end[dep]:  # not finished: wait for it (an event only for tasks waited on)
                    waiter = waiting.get(dep)
                    if waiter is None:
                        waiter = waiting[dep] = env.event()
                    yield waiter
            shared = finished.get(task.collective)
            if shared is not None:  # every member waits for the last; the last one runs the transfer once
                met = meets.arrive(task.collective, task_id, env.now)
                if met is not None:
                    released[task.collective] = met[0]
                    env.process(run_shared(task, shared))
                yield shared
                start[task_id] = released[task.collective]
            else:  # communicate(task), inlined: the same events
                start[task_id] = env.now
                seconds = seconds_of[task_id]
                if seconds is None:
                    seconds = lone_seconds(task)
                    if seconds is None:
                        yield from run_phases(flow_phases(task))
                        seconds = 0.0
                if seconds > 0:
                    yield timeout(seconds)
            end[task_id] = env.now
            waiter = waiting.pop(task_id, None)
            if waiter is not None:
                waiter.succeed()

    for key in sorted(graph.streams):
        env.process(stream(graph.streams[key]))
    env.run()

    if any(t != t for t in end):
        raise deadlock_error(graph, end)
    if flows is not None:
        flows.close(env.now)
    return EngineResult(start=start, end=end, events=env.scheduled, flows=flows, arrival=meets.arrival)
