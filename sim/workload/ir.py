"""The task graph of one training step: its tasks and each (rank, stream)'s ordered task list.

In: tasks added by the workload emitters (``sim.workload.build``), then ``TaskGraph.freeze()`` once the last
edge is in. Out: ``Task`` records (rank, stream, kind, name, micro-batch, layer, dependencies, duration or bytes
and group) and the ``TaskGraph`` the engines replay like CUDA streams, with the rendezvous keys that match one
collective's simulated members under ``ranks: all``; the names of the streams (``Stream``) and task kinds
(``Kind``).

A graph built ``lazy`` (``sim.workload.build.build(plan, lazy=True)``, a sweep's confirmation) keeps each stamped
layer chain as one record (``TaskGraph.stamps``: its ``Chain`` and where it was stamped) instead of its ``Task``
objects, which were most of a confirmation's build and freeing (issue 25); ``TaskGraph.materialize`` makes them,
the same tasks the eager build makes, for whatever reads tasks one by one.

This module is the seam between the builder and everything that reads a graph (the engines in ``sim.engine``,
the critical path, the trace in ``sim.output``, the charts): they import it, never the builder, so it imports
only the standard library. Stream and kind names are ``StrEnum`` members, equal to (and hashing as) their plain
strings, so a task may carry either and the trace's columns hold the same strings as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from operator import attrgetter
from typing import Any


class Stream(StrEnum):
    """A rank's execution streams (CUDA streams; ``host`` is the CPU). Declaration order is the charts' lane order."""

    COMPUTE = "compute"
    TP = "tp"  # Megatron's tensor-parallel collectives
    PP = "pp"  # pipeline sends
    DP = "dp"  # the data-parallel process group's NCCL stream
    DP_REPLICA = "dp_replica"  # HYBRID_SHARD's inter-node process group
    OFFLOAD = "offload"  # PCIe copies of ZeRO-Offload
    HOST = "host"  # the CPU: ZeRO-Offload's optimizer step, MoE layer issue, the trainer's metric sync loops
    EP = "ep"  # a MoE layer's token dispatch and combine (expert-parallel process groups)
    EXPERT_DP = "expert_dp"  # expert gradients and weights over the expert-data-parallel group
    CP = "cp"  # context parallelism's attention exchanges (ring KV sends, KV all-gather, Ulysses all-to-all)


class Kind(StrEnum):
    """What a task does: the trace's ``kind`` column."""

    FORWARD = "forward"
    BACKWARD = "backward"  # the input gradient, and the weight gradient unless the schedule splits it off
    WEIGHT = "weight"  # the split weight-gradient pass of zero-bubble schedules
    RECOMPUTE = "recompute"  # activation recomputation before a backward
    OPTIMIZER = "optimizer"
    TP = "tp"
    PP = "pp"
    DP = "dp"
    OFFLOAD = "offload"
    EP = "ep"  # token dispatch / combine of a MoE layer
    CP = "cp"  # context-parallel attention exchanges
    HOST = "host"  # the CPU behind a host sync: issuing a MoE layer pass (sim.costs.host), the metric sync


STREAMS: tuple[Stream, ...] = tuple(Stream)
KINDS: tuple[Kind, ...] = tuple(Kind)  # a kind's code in columnar readers (footprint.TimelineRows)
NCCL_STREAM, REPLICA_STREAM = Stream.DP, Stream.DP_REPLICA
OFFLOAD_STREAM, HOST_STREAM = Stream.OFFLOAD, Stream.HOST
EP_STREAM, EXPERT_DP_STREAM = Stream.EP, Stream.EXPERT_DP
CP_STREAM = Stream.CP
COMPUTE_KINDS: tuple[Kind, ...] = (Kind.FORWARD, Kind.BACKWARD, Kind.WEIGHT, Kind.RECOMPUTE)  # the model's passes
COMM_KINDS: tuple[Kind, ...] = (Kind.TP, Kind.PP, Kind.DP)  # the summary's exposed communication, per kind
MOE_COMM_KINDS: tuple[Kind, ...] = (Kind.EP,)  # reported beside them for a MoE model
CP_COMM_KINDS: tuple[Kind, ...] = (Kind.CP,)  # reported beside them with context parallelism (cp > 1)


@dataclass(slots=True)
class Task:
    id: int
    rank: int
    stage: int
    stream: str  # a ``Stream`` value
    kind: str  # a ``Kind`` value
    name: str
    microbatch: int
    layer: int
    deps: Sequence[int]  # a list while the graph is built (a stamped layer's: a tuple already), a tuple once frozen
    duration: float | None = None  # compute tasks; communication is timed by the network model
    op: str = ""  # all_reduce | all_gather | reduce_scatter | send
    nbytes: float = 0.0
    flops: float = 0.0
    group: tuple[int, ...] = ()  # collective group (global ranks), or (src, dst) of a send
    collective: int = -1  # rendezvous key shared by the simulated members of one collective
    skew: float = 1.0  # an all-to-all's max/mean bytes per receiving rank (MoE routing imbalance; the network's)


STAMP_FIELDS = 6  # a lazy graph's stamp record: first task, chain, micro-batch, layer, follows, takes (TaskGraph)
# A recorded chain's entry (``sim.workload.chain_emit``, ``_stamp_entry``): the task's fields, then its chain rule.
ChainEntry = tuple  # (stream, kind, name, duration, op, nbytes, flops, group, skew, prev, extra, waits_tp, becomes,
#                     keyed, append)


class Chain:
    """One layer's tasks as recorded from the first layer a stage emitted (forward, backward with or without
    recomputation, weight-gradient pass; MoE, frozen), stamped again for every other layer with the same chain.

    ``entries`` are the recorded tasks' fields and chain rules, ``protos`` the recorded tasks themselves (a lazy
    graph holds them at the positions of the tasks stamped from them, for their static fields: stream, kind,
    name, duration, bytes, FLOPs, group), ``rank`` and ``stage`` the emitter's, ``index`` its place in
    ``TaskGraph.chains``, ``stream`` its first task's; ``layers``: each entry's layer where a chain spans several
    (a lazy graph's whole pipeline pass, its send included: ``_StageEmitter._pass_chain``), None where every task
    takes the layer given at the stamp. What of the stamp's surroundings its tasks read is decided here once:
    ``follows``,
    whether the first task depends on the task emitted before the stamp (when that one is on another stream);
    ``consumer``, the entry that takes the blocking TP collective given at the stamp (-1: none does); ``leaves``,
    the entry that is blocking at the end (-1: the one given, if no entry consumed it; -2: none)."""

    __slots__ = ("entries", "protos", "rank", "stage", "index", "stream", "follows", "consumer", "leaves", "layers")

    def __init__(self, entries: list[ChainEntry], protos: list[Task], rank: int, stage: int, index: int,
                 layers: tuple[int, ...] | None = None) -> None:
        self.entries, self.protos, self.rank, self.stage, self.index = entries, protos, rank, stage, index
        self.layers = layers
        self.stream = entries[0][0]  # the first task's
        self.follows = bool(entries[0][9])
        state = -1  # -1: the blocking collective given at the stamp; -2: none; k: entry k
        self.consumer = -1
        for k, entry in enumerate(entries):
            if entry[11] and state != -2:  # waits_tp: takes the blocking collective (TaskEmitter._blocking)
                if state == -1:
                    self.consumer = k
                state = -2
            if entry[12]:  # becomes the blocking one
                state = k
        self.leaves = state

    def stamp(self, tasks: list[Task], mb: int, layer: int, after: int | None, blocking_tp: int | None,
              key: Callable[[int, str, str, tuple[int, ...]], int]) -> tuple[int | None, int | None]:
        """Emits the chain's tasks for ``layer`` of micro-batch ``mb`` after task ``after``, appending them to
        ``tasks`` and their stream lists (TaskGraph.add and _StageEmitter._blocking, inlined: 10^5..10^6 tasks per
        build) with ``blocking_tp`` the blocking TP collective before it. Returns the last task and the blocking
        TP collective after it."""
        rank, stage = self.rank, self.stage
        task_id = len(tasks)
        after_stream = tasks[after].stream if after is not None else None
        layers = self.layers or (layer,) * len(self.entries)
        for (stream, kind, name, duration, op, nbytes, flops, group, skew, prev, extra, waits_tp, becomes, keyed,
             append), layer in zip(self.entries, layers, strict=True):
            # A stamped task's dependencies are final (a tuple, as freeze() would make them): the pass's first
            # task may still get its upstream send (TaskGraph.add_dependency copies them into a list then).
            deps: tuple[int, ...] = (after,) if prev and after is not None and after_stream != stream else ()
            if extra:
                deps += tuple([task_id - back for back in extra])
            if waits_tp and blocking_tp is not None:  # _blocking: the compute waits for the blocking collective
                if blocking_tp not in deps:
                    deps += (blocking_tp,)
                blocking_tp = None
            tasks.append(Task(task_id, rank, stage, stream, kind, name, mb, layer, deps, duration, op, nbytes,
                              flops, group, key(rank, kind, op, group) if keyed else -1, skew))
            append(task_id)
            after, after_stream = task_id, stream
            if becomes:
                blocking_tp = task_id
            task_id += 1
        return after, blocking_tp


@dataclass
class TaskGraph:
    tasks: list[Task] = field(default_factory=list)
    streams: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    match_collectives: bool = True  # off in slice mode, where each group has one simulated member
    # ranks: all with TP ranks folded: each simulated rank (tp rank 0) stands for this many TP ranks in
    # lockstep, and its DP/PP transfers stand for theirs too (ranks r+1..r+lockstep-1: tp is the fastest dim).
    lockstep: int = 1
    # The chains the emitters recorded (``Chain.index``). A lazy graph keeps each stamp of one as a record of
    # STAMP_FIELDS ints, one after the other in ``stamps`` (first task, chain index, micro-batch, layer, the task
    # its first task follows and the blocking TP collective one of its tasks takes, -1 for none; ``stamp``; one
    # flat list: numpy reads it in one call, 3x faster than a list of tuples) while ``tasks`` holds the chain's
    # protos at their positions; ``late``: edges added to such tasks by ``add_dependency``. Only in slice mode (no
    # rendezvous keys to hand out in stamping order).
    lazy: bool = False
    chains: list[Chain] = field(default_factory=list)
    stamps: list[int] = field(default_factory=list)
    late: dict[int, list[int]] = field(default_factory=dict)
    frozen: bool = field(default=False, init=False)  # set by ``freeze``: no task or edge may be added after
    # (group, n): the n-th collective a rank issues on a group is the same collective on every member.
    _issued: dict[tuple[int, tuple[int, ...]], int] = field(default_factory=dict, repr=False)
    _keys: dict[tuple[tuple[int, ...], int], int] = field(default_factory=dict, repr=False)
    _lists: list[int] = field(default_factory=list, repr=False)  # tasks whose deps are a list, for freeze

    def rendezvous_key(self, rank: int, kind: str, op: str, group: tuple[int, ...]) -> int:
        """The key shared by every simulated member of this collective (-1: nothing to meet: slice mode, a send,
        a group of one, or a folded TP group)."""
        if not (self.match_collectives and op and op != "send" and len(group) > 1
                and (self.lockstep == 1 or kind != Kind.TP)):
            return -1
        issued = self._issued.get((rank, group), 0)
        self._issued[(rank, group)] = issued + 1
        return self._keys.setdefault((group, issued), len(self._keys))

    def meeting_key(self, group: tuple[int, ...]) -> int:
        """The key of a group's one collective whose members are all simulated in either mode (DualPipe's copy
        pairs, two pipeline stages' ranks of one TP and DP index): they meet even in slice mode, where each would
        otherwise move the group's bytes on its own."""
        return self._keys.setdefault((group, -1), len(self._keys))

    def shared_collectives(self) -> dict[int, int]:
        """Rendezvous key -> simulated members, for the collectives with more than one (the engines' meets)."""
        members: dict[int, int] = {}
        if max(map(attrgetter("collective"), self.tasks), default=-1) < 0:  # slice mode: none (a C-level pass)
            return members
        for task in self.tasks:
            if task.collective >= 0:
                members[task.collective] = members.get(task.collective, 0) + 1
        return {key: count for key, count in members.items() if count > 1}

    def add(self, rank: int, stage: int, stream: str, kind: str, name: str, microbatch: int, layer: int,
            deps: list[int], duration: float | None = None, op: str = "", nbytes: float = 0.0, flops: float = 0.0,
            group: tuple[int, ...] = (), collective: int = -1, skew: float = 1.0) -> int:
        if self.frozen:
            raise RuntimeError(f"task graph is frozen: cannot add {kind} task {name!r} on rank {rank}")
        task_id = len(self.tasks)
        if collective < 0:
            collective = self.rendezvous_key(rank, kind, op, group)
        # Positional: the build creates ~10^5 tasks per pipeline and keyword unpacking costs a third of it.
        self.tasks.append(Task(task_id, rank, stage, stream, kind, name, microbatch, layer, deps, duration, op,
                               nbytes, flops, group, collective, skew))
        self._lists.append(task_id)
        order = self.streams.get((rank, stream))
        if order is None:
            order = self.streams[(rank, stream)] = []
        order.append(task_id)
        return task_id

    def add_dependency(self, task_id: int, on: int) -> None:
        """An edge to a task emitted after ``task_id``: a pipeline stage's pass waits for the neighbour stage's
        send, which is emitted later because stages are emitted one after the other (that order fixes the task
        ids, and so the traces). The one edge the builder adds after emitting a task; refused once frozen."""
        if self.frozen:
            raise RuntimeError(f"task graph is frozen: cannot add an edge to task {task_id}")
        task = self.tasks[task_id]
        if task.id != task_id:  # a lazy stamp's proto stands there: the edge is kept apart until materialize()
            self.late.setdefault(task_id, []).append(on)
        elif isinstance(task.deps, list):
            task.deps.append(on)
        else:  # a stamped task's (sim.workload.build): a tuple from the start, and still one
            task.deps = (*task.deps, on)

    def freeze(self) -> None:
        """Ends the build: every task's dependencies become a tuple (no edge can be appended any more) and
        ``add`` refuses new tasks. The engines and the SM-contention rounds read a frozen graph and never write
        it (contention returns its stretched durations instead), so a run's graph is the graph that was built.
        Raises ValueError naming a stream or kind that is not a ``Stream`` / ``Kind`` value.

        ``Task`` itself stays a plain slots dataclass: a frozen one takes 6x as long to construct (3.8 vs 0.6 s
        per 10^6 tasks, measured), and a build makes 10^5..10^6 of them. Only the tasks ``add`` made (and those
        ``add_dependency`` gave a list) are read: a stamped layer's tasks carry tuples from the start and the kinds
        of the tasks they were recorded from (``sim.workload.build``); a pass over every task was a fifth of a 175B
        layout's build (0.03 of 0.16 CPU s)."""
        unknown = {stream for _, stream in self.streams} - set(Stream)
        if unknown:
            raise ValueError(f"task graph: unknown stream(s) {', '.join(sorted(unknown))}; "
                             f"streams are {', '.join(Stream)}")
        # The other tasks' are tuples already, and each repeats the kind of a task add() made (a stamped layer
        # copies the one it recorded), so the kinds checked here are every kind in the graph.
        added = list(map(self.tasks.__getitem__, self._lists))
        for task in added:
            task.deps = tuple(task.deps)
        self._lists = []
        unknown = set(map(attrgetter("kind"), added)) - set(Kind)
        if unknown:
            raise ValueError(f"task graph: unknown kind(s) {', '.join(sorted(unknown))}; kinds are {', '.join(Kind)}")
        self.frozen = True

    def stamp(self, chain: Chain, mb: int, layer: int, after: int | None, blocking_tp: int | None
              ) -> tuple[int | None, int | None]:
        """A layer chain stamped after ``after`` with ``blocking_tp`` the blocking TP collective before it: its tasks
        (eager) or its record (``lazy``; ``stamps``). Returns the chain's last task and the blocking TP collective
        after it."""
        if not self.lazy:
            return chain.stamp(self.tasks, mb, layer, after, blocking_tp, self.rendezvous_key)
        tasks = self.tasks
        first = len(tasks)
        # What the stamp's tasks read of its surroundings (-1: nothing): the task before it, where the first task
        # depends on it (Chain.stamp's edge), and the blocking collective, where an entry takes it.
        follows = after if after is not None and chain.follows and tasks[after].stream != chain.stream else -1
        takes = blocking_tp if blocking_tp is not None and chain.consumer >= 0 else -1
        self.stamps += (first, chain.index, mb, layer, follows, takes)
        tasks.extend(chain.protos)
        leaves = chain.leaves
        return len(tasks) - 1, (blocking_tp if leaves == -1 else None if leaves == -2 else first + leaves)

    def stamp_table(self) -> Any:
        """The stamps' records as one read-only int64 numpy array, a row of ``STAMP_FIELDS`` each (``stamps``),
        made once for a frozen graph: the replay (``sim.engine.longest_path``) and a confirmation's figures
        (``sim.explore.confirm``) both read it, and converting the list costs about 0.1 us an int (0.9 ms for a
        175B layout's 9,400 stamps)."""
        import numpy as np  # here: the IR itself needs no numpy, and its importers that never call this neither

        # Kept in the instance's dict, not as a field: one more field slowed the build's attribute stores (5%).
        table = vars(self).get("_stamp_table")
        if table is None:
            table = np.array(self.stamps, dtype=np.int64).reshape(-1, STAMP_FIELDS)
            table.flags.writeable = False
            if self.frozen:  # no stamp can be added any more (materialize, which empties them, drops it)
                vars(self)["_stamp_table"] = table
        return table

    def records(self) -> Iterator[tuple[int, int, int, int, int, int]]:
        """The stamps' records, one tuple each (``stamps``)."""
        fields = iter(self.stamps)
        return zip(*[fields] * STAMP_FIELDS, strict=True)  # type: ignore[return-value]

    def materialize(self) -> None:
        """Makes a lazy graph's stamped tasks: each chain stamped again in task order, the same ``Task`` objects,
        dependencies (``late`` edges appended as ``add_dependency`` would have) and stream lists the eager build
        makes (tests/test_lazy_graph.py compares them). Nothing to do on an eager graph."""
        if not self.stamps:
            return
        old, late = self.tasks, self.late
        for order in self.streams.values():  # refilled in task order below (each list holds its ids ascending)
            order.clear()
        tasks: list[Task] = []
        streams = self.streams
        for first, chain, mb, layer, after, blocking_tp in self.records():
            for task in old[len(tasks):first]:
                tasks.append(task)
                streams[(task.rank, task.stream)].append(task.id)
            # The record's -1s stand where Chain.stamp would make no edge of the task or collective given.
            self.chains[chain].stamp(tasks, mb, layer, after if after >= 0 else None,
                                     blocking_tp if blocking_tp >= 0 else None, self.rendezvous_key)
        for task in old[len(tasks):]:
            tasks.append(task)
            streams[(task.rank, task.stream)].append(task.id)
        for task_id, ons in late.items():
            task = tasks[task_id]
            task.deps = (*task.deps, *ons)
        self.tasks, self.stamps, self.late = tasks, [], {}
        vars(self).pop("_stamp_table", None)
