"""The task graph of one training step: its tasks and each (rank, stream)'s ordered task list.

In: tasks added by the workload emitters (``sim.workload.build``). Out: ``Task`` records (rank, stream, kind, name,
micro-batch, layer, dependencies, duration or bytes and group) and the ``TaskGraph`` the engines replay like
CUDA streams, with the rendezvous keys that match one collective's simulated members under ``ranks: all``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Task:
    id: int
    rank: int
    stage: int
    stream: str
    kind: str
    name: str
    microbatch: int
    layer: int
    deps: list[int]
    duration: float | None = None  # compute tasks; communication is timed by the network model
    op: str = ""  # all_reduce | all_gather | reduce_scatter | send
    nbytes: float = 0.0
    flops: float = 0.0
    group: tuple[int, ...] = ()  # collective group (global ranks), or (src, dst) of a send
    collective: int = -1  # rendezvous key shared by the simulated members of one collective


@dataclass
class TaskGraph:
    tasks: list[Task] = field(default_factory=list)
    streams: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    match_collectives: bool = True  # off in slice mode, where each group has one simulated member
    # ranks: all with TP ranks folded: each simulated rank (tp rank 0) stands for this many TP ranks in
    # lockstep, and its DP/PP transfers stand for theirs too (ranks r+1..r+lockstep-1: tp is the fastest dim).
    lockstep: int = 1
    # (group, n): the n-th collective a rank issues on a group is the same collective on every member.
    _issued: dict[tuple[int, tuple[int, ...]], int] = field(default_factory=dict, repr=False)
    _keys: dict[tuple[tuple[int, ...], int], int] = field(default_factory=dict, repr=False)

    def rendezvous_key(self, rank: int, kind: str, op: str, group: tuple[int, ...]) -> int:
        """The key shared by every simulated member of this collective (-1: nothing to meet: slice mode, a send,
        a group of one, or a folded TP group)."""
        if not (self.match_collectives and op and op != "send" and len(group) > 1
                and (self.lockstep == 1 or kind != "tp")):
            return -1
        issued = self._issued.get((rank, group), 0)
        self._issued[(rank, group)] = issued + 1
        return self._keys.setdefault((group, issued), len(self._keys))

    def shared_collectives(self) -> dict[int, int]:
        """Rendezvous key -> simulated members, for the collectives with more than one (the engines' meets)."""
        members: dict[int, int] = {}
        for task in self.tasks:
            if task.collective >= 0:
                members[task.collective] = members.get(task.collective, 0) + 1
        return {key: count for key, count in members.items() if count > 1}

    def add(self, rank: int, stage: int, stream: str, kind: str, name: str, microbatch: int, layer: int,
            deps: list[int], duration: float | None = None, op: str = "", nbytes: float = 0.0, flops: float = 0.0,
            group: tuple[int, ...] = (), collective: int = -1) -> int:
        task_id = len(self.tasks)
        if collective < 0:
            collective = self.rendezvous_key(rank, kind, op, group)
        # Positional: the build creates ~10^5 tasks per pipeline and keyword unpacking costs a third of it.
        self.tasks.append(Task(task_id, rank, stage, stream, kind, name, microbatch, layer, deps, duration, op,
                               nbytes, flops, group, collective))
        order = self.streams.get((rank, stream))
        if order is None:
            order = self.streams[(rank, stream)] = []
        order.append(task_id)
        return task_id
