"""DualPipe's overlapped F&B pair in the task graph: the two passes' tasks re-ordered to take turns.

In: a task graph being built, the emitting rank and the task ids where an issued unit's forward pass, its backward
pass and what follows them begin (``_StageEmitter.close_unit``, sim.workload.build). Out: the rank's stream lists
re-ordered in place so that the passes' blocks alternate at their MoE split points, the B-to-F edges this makes
point forward moved back, and the unit's new last task. Used by DualPipe's pairs and Megatron's combined 1F1B
under ``moe.a2a_overlap`` (docs/mechanisms/dualpipe.md, a2a_overlap.md); ``sim.explore.pair_replay`` prices the
same cut in closed form.
"""

from __future__ import annotations

from sim.workload.ir import EP_STREAM, TaskGraph


def interleave_pair(graph: TaskGraph, rank: int, forward: int, backward: int, end: int) -> int | None:
    """DualPipe's overlapped F&B pair (DeepSeek-V3 report Sec. 3.2.1, Fig. 4; the DualPipe repo's
    ``overlapped_forward_backward``): the forward of one micro-batch (tasks ``forward``..``backward``-1) and the
    backward of another (``backward``..``end``-1) take turns on the compute stream, so each one's MoE dispatch
    and combine (stream ``ep``) run under the other's compute. Each pass is cut into blocks at its MoE split
    points, before every compute task that waits for an ``ep`` exchange (forward: attention+router | experts |
    unpermute, next layer's attention+router | ...; backward mirrored), and the blocks alternate, F first as
    the code issues them. The tasks and their edges stay; only each stream's order inside the unit changes
    (F's and B's own orders kept). An edge from a B task to an F task that now comes later (Megatron's
    synchronous TP wait on the last collective issued) moves to the last F task on that stream issued before
    it. A pair of dense layers has no cut and keeps its order (F then B). ``rank``: the emitting rank, whose streams
    hold the pair. Returns the unit's new last task where no W pass follows the pair (``end`` is the graph's end:
    the pair's last compute task in the new order), else None (the emitter's ``tail`` stays)."""
    tasks = graph.tasks

    def cut(first: int, last: int) -> list[list[int]]:
        parts: list[list[int]] = [[]]
        for task in tasks[first:last]:
            if (task.stream == "compute" and parts[-1]
                    and any(tasks[dep].stream == EP_STREAM for dep in task.deps if dep >= first)):
                parts.append([])
            parts[-1].append(task.id)
        return parts

    f_parts, b_parts = cut(forward, backward), cut(backward, end)
    if len(f_parts) == 1 and len(b_parts) == 1:
        return None
    order: list[int] = []
    for i in range(max(len(f_parts), len(b_parts))):
        order += (f_parts[i] if i < len(f_parts) else []) + (b_parts[i] if i < len(b_parts) else [])
    position = {task: i for i, task in enumerate(order)}
    last_on: dict[str, int] = {}  # stream -> the last F task on it so far in the new order
    for task_id in order:
        task = tasks[task_id]
        if task_id >= backward:
            moved = [dep for dep in task.deps if forward <= dep < backward and position[dep] > position[task_id]]
            if moved:
                deps = list(task.deps)  # a stamped task's are a tuple already
                for dep in moved:
                    deps.remove(dep)
                    earlier = last_on.get(tasks[dep].stream)
                    if earlier is not None and earlier not in deps:
                        deps.append(earlier)
                task.deps = tuple(deps)
        else:
            last_on[task.stream] = task_id
    for (owner, _), stream_order in graph.streams.items():
        if owner != rank:
            continue
        start = len(stream_order)  # the unit's tasks are the last on each of this rank's streams
        while start and stream_order[start - 1] >= forward:
            start -= 1
        mine = set(stream_order[start:])
        stream_order[start:] = ([task for task in order if task in mine]
                                + [task for task in stream_order[start:] if task >= end])
    if end == len(tasks):  # no W pass after the pair: the unit ends with the pair's last compute task
        return max((t for t in order if tasks[t].stream == "compute"), key=position.__getitem__)
    return None
