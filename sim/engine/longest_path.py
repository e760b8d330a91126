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

A lazy graph (``TaskGraph.lazy``: stamped layer chains kept as records, a sweep's confirmation) is walked the same
way, rank by rank in task order, by ``_walk_stamped``, which evaluates a stamped chain as one unit: each chain's
rule (which task waits on which: its stream predecessor inside the chain or the rank's stream before it, the task
emitted before it, the blocking TP collective, the pass's upstream send on its first task) is compiled once into
straight-line Python (``_chain_function``) that takes the same maxima of the same floats and adds the same
durations in the same order as the walk above, so its times are equal bit for bit to the materialized graph's
(tests/test_lazy_graph.py); 0.0, below every time, stands for a dependency a stamp does not have. A lazy graph's
whole pipeline pass is one such chain, its send the last entry (``_StageEmitter._pass_chain``): a rank suspended
on that send is woken after the call that evaluated it. A chain the
compiler does not cover (an edge out of the chain other than those), an edge added to a stamped task other than
a chain's first, a rendezvous, a stall or given ``durations``: the graph is materialized and evaluated as above.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from operator import attrgetter

import numpy as np

from sim.engine.event import EngineResult, deadlock_error, task_durations
from sim.engine.rendezvous import Rendezvous
from sim.network.models import Network, transfer_time
from sim.workload.ir import STAMP_FIELDS, STREAMS, Chain, Stream, TaskGraph

_STREAM_CODE = {stream: code for code, stream in enumerate(STREAMS)}  # a Stream hashes as its string


def evaluate(graph: TaskGraph, network: Network, durations: Sequence[float | None] | None = None) -> EngineResult:
    # Communication priced once per (op, bytes, group, skew): a step repeats a few transfers many times.
    priced: dict[tuple[str, float, tuple[int, ...], float], float] = {}

    def price(key: tuple[str, float, tuple[int, ...], float]) -> float:
        value = priced.get(key)
        if value is None:
            value = priced[key] = transfer_time(network, *key)
        return value

    if graph.stamps:  # a lazy graph: its chains as units where they can be, else its tasks made
        if durations is None:
            walked = _walk_stamped(graph, price)
            if walked is not None:
                return EngineResult(start=walked[0], end=walked[1], events=len(graph.tasks))
        graph.materialize()
    tasks = graph.tasks
    seconds_of = task_durations(graph, durations)
    nan = float("nan")
    start = [nan] * len(tasks)
    end = [nan] * len(tasks)
    done = bytearray(len(tasks))

    meets = Rendezvous(graph.shared_collectives())
    shared = set(meets.members)
    # Read once per task, not once per visit: its dependencies, its rendezvous key (only where some collective has
    # several simulated members: slice mode has none but DualPipe's meetings) and its seconds.
    deps_of = list(map(attrgetter("deps"), tasks))
    key_of = [task.collective for task in tasks] if shared else []
    seconds: list[float] = list(seconds_of)  # type: ignore[arg-type]  # the Nones are replaced below
    transfer = attrgetter("op", "nbytes", "group", "skew")
    for task_id in [i for i, duration in enumerate(seconds) if duration is None]:
        seconds[task_id] = price(transfer(tasks[task_id]))

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


def _walk_stamped(graph: TaskGraph, price: Callable[[tuple[str, float, tuple[int, ...], float]], float]
                  ) -> tuple[list[float], list[float]] | None:
    """Start and end of every task of a lazy graph (see the module's docstring), each rank's tasks and stamps in
    task order; None where it does not apply (a rendezvous key: a lazy graph's stamped tasks have none) or cannot
    finish."""
    tasks, stamps, late = graph.tasks, graph.stamps, graph.late
    n = len(tasks)
    count = len(stamps) // STAMP_FIELDS
    records = graph.stamp_table()
    firsts = records[:, 0]
    if late and not set(late) <= set(firsts.tolist()):
        return None
    # Per chain: its function, its entries' seconds and its sends' entries (a pass's chain ends with its send,
    # which the next stage waits for: checked after each call).
    compiled: list[tuple[Callable[..., None], tuple[float, ...], tuple[int, ...]]] = []
    for chain in graph.chains:
        function = _chain_function(*_chain_rule(chain))
        if function is None:
            return None
        compiled.append((function, tuple(duration if duration is not None else price((op, nbytes, group, skew))
                                         for _, _, _, duration, op, nbytes, _, group, skew, *_ in chain.entries),
                         tuple(k for k, entry in enumerate(chain.entries) if entry[0] == Stream.PP)))
    chains = graph.chains
    chain_size = np.array([len(chain.entries) for chain in chains], dtype=np.int64)
    chain_rank = np.array([chain.rank for chain in chains], dtype=np.int64)
    # The tasks no stamp covers.
    chain_of, sizes = records[:, 1], chain_size[records[:, 1]]
    inside = np.zeros(n + 1, dtype=np.int64)
    inside[firsts] += 1
    inside[firsts + sizes] -= 1
    plain = np.flatnonzero(np.cumsum(inside[:n]) == 0)
    # Runs of stamps a chain function evaluates in one call (its loop): the same chain stamped layer after layer,
    # each stamp after the one before it and taking the blocking collective it left, as TaskGraph.stamp recorded
    # them, and no edge added to a later one's first task.
    links = np.array([chain.follows and chain.entries[-1][0] != chain.stream for chain in chains], dtype=bool)
    leaves = np.array([chain.leaves if chain.consumer >= 0 and chain.leaves >= 0 else -1 for chain in chains],
                      dtype=np.int64)
    follows = np.where(links[chain_of], firsts + sizes - 1, -1)
    takes = np.where(leaves[chain_of] >= 0, firsts + leaves[chain_of], -1)
    continues = np.zeros(count, dtype=bool)
    continues[1:] = ((chain_of[1:] == chain_of[:-1]) & (firsts[1:] == firsts[:-1] + sizes[:-1])
                     & (records[1:, 4] == follows[:-1]) & (records[1:, 5] == takes[:-1]))
    if late:
        continues &= ~np.isin(firsts, list(late))
    heads = np.flatnonzero(~continues)
    length = np.zeros(count, dtype=np.int64)
    length[heads] = np.diff(np.append(heads, count))
    plain_tasks = list(map(tasks.__getitem__, plain.tolist()))
    if max(map(attrgetter("collective"), plain_tasks), default=-1) >= 0:  # a rendezvous (DualPipe's meetings)
        return None
    # Every item read whole from one tuple (no lookup per visit): a plain task as (id, its dependencies, seconds,
    # stream code), a run of stamps as (-1, the chain's function, its entries' seconds, its sends' entries, first
    # task, the task its first stamp follows, the blocking collective it takes (-1: none: end[-1] is the sentinel
    # 0.0), the stamps, the edges added to its first task or None).
    seconds_of = [task.duration if task.duration is not None else
                  price((task.op, task.nbytes, task.group, task.skew)) for task in plain_tasks]
    objects: list[tuple] = list(zip(plain.tolist(), map(attrgetter("deps"), plain_tasks), seconds_of,
                                    [_STREAM_CODE[stream] for stream in map(attrgetter("stream"), plain_tasks)],
                                    strict=True))
    head_records = records[heads]
    objects += [(-1, *compiled[chain], first, follow, take, stamped, late.get(first))
                for first, chain, follow, take, stamped in zip(
                    head_records[:, 0].tolist(), head_records[:, 1].tolist(), head_records[:, 4].tolist(),
                    head_records[:, 5].tolist(), length[heads].tolist(), strict=True)]
    # Every rank's items in task order.
    position = np.concatenate([plain, firsts[heads]])
    rank = np.concatenate([np.fromiter(map(attrgetter("rank"), plain_tasks), np.int64, len(plain_tasks)),
                           chain_rank[chain_of[heads]]])
    order = np.lexsort((position, rank))
    ordered = list(map(objects.__getitem__, order.tolist()))
    bounds = [0, *(np.flatnonzero(np.diff(rank[order])) + 1).tolist(), len(ordered)] if n else [0]
    runs = [ordered[low:high] for low, high in zip(bounds[:-1], bounds[1:], strict=True)]

    inf = math.inf
    start = [math.nan] * (n + 1)
    end = [inf] * n + [0.0]  # +inf: not yet evaluated; end[-1] = end[n]: a record's -1, below every time
    free = [[0.0] * len(STREAMS) for _ in runs]  # each rank's streams: the end of the last task on each so far
    at_item = [0] * len(runs)
    waiting: dict[int, list[int]] = {}  # task -> ranks suspended until it ends (pipeline sends)
    stamped_waits = 0  # how many of them are stamped tasks (none in the bundled scenarios)
    work = list(range(len(runs) - 1, -1, -1))
    while work:
        run = work.pop()
        items, i, fa = runs[run], at_item[run], free[run]
        count = len(items)
        blocker = -1
        while i < count:
            item = items[i]
            code = item[0]
            if code >= 0:
                _, deps, seconds, stream = item
                ready = fa[stream]
                for dep in deps:
                    at = end[dep]
                    if at > ready:
                        ready = at
                if ready == inf:  # waits on a task not yet evaluated (another rank's, or its own later one)
                    blocker = next(d for d in deps if end[d] == inf)
                    break
                start[code] = ready
                end[code] = fa[stream] = ready + seconds
                if waiting and code in waiting:
                    work.extend(waiting.pop(code))
            else:
                _, function, seconds_of, sends, first, follow, take, stamped, lates = item
                upstream = 0.0
                if lates is not None:
                    for dep in lates:
                        at = end[dep]
                        if at > upstream:
                            upstream = at
                    if upstream == inf:
                        blocker = next(d for d in lates if end[d] == inf)
                        break
                function(fa, end[follow], end[take], upstream, first, start, end, seconds_of, stamped)
                if sends and waiting:  # a rank suspended on one of these sends
                    size = len(seconds_of)
                    for at_stamp in range(first, first + stamped * size, size):
                        for k in sends:
                            if at_stamp + k in waiting:
                                work.extend(waiting.pop(at_stamp + k))
                if stamped_waits:
                    last = first + stamped * len(seconds_of)
                    for task_id in [task_id for task_id in waiting if first <= task_id < last]:
                        stamped_waits -= 1
                        work.extend(waiting.pop(task_id))
            i += 1
        at_item[run] = i
        if blocker >= 0:
            waiting.setdefault(blocker, []).append(run)
            # A proto stands there: a stamped task, other than a pass's send, that the calls above do not check.
            if tasks[blocker].id != blocker and tasks[blocker].stream != Stream.PP and len(waiting[blocker]) == 1:
                stamped_waits += 1
    if any(i != len(items) for i, items in zip(at_item, runs, strict=True)):
        return None
    del start[n], end[n]
    return start, end


def _chain_rule(chain: Chain) -> tuple[tuple[int, ...], tuple[bool, ...], tuple[tuple[int, ...], ...],
                                       tuple[bool, ...], tuple[bool, ...]]:
    """A chain's dependency rule (``Chain.stamp``): each entry's stream code, ``prev``, ``extra`` offsets, whether
    it waits for the blocking TP collective and whether it becomes it."""
    entries = chain.entries
    return (tuple(_STREAM_CODE[entry[0]] for entry in entries), tuple(bool(entry[9]) for entry in entries),
            tuple(tuple(entry[10]) for entry in entries), tuple(bool(entry[11]) for entry in entries),
            tuple(bool(entry[12]) for entry in entries))


@lru_cache(maxsize=1024)
def _chain_function(streams: tuple[int, ...], prevs: tuple[bool, ...], extras: tuple[tuple[int, ...], ...],
                    waits: tuple[bool, ...], becomes: tuple[bool, ...]) -> Callable[..., None] | None:
    """A chain's evaluation as straight-line Python, compiled once per rule (a search's layouts share a few):
    ``function(fa, A, B, L, first, start, end, d, count)`` evaluates ``count`` stamps of the chain one after the
    other from task ``first``, with ``fa`` the rank's stream ends (updated), ``A`` the end of the task the first
    stamp follows (0.0 where ``Chain.stamp`` gives its first task no edge to it), ``B`` the end of the blocking
    TP collective before it, ``L`` the latest end of the edges added to its first task, ``d`` the entries'
    seconds; it writes their start and end times. Each task's start is the maximum of its stream's end and its
    dependencies' ends, in ``Chain.stamp``'s edges, as the rank walk takes it; its end that plus its seconds. A
    later stamp follows the one before it (its last task, where the first entry takes an edge to it on another
    stream) and takes the blocking collective that one left. None for a chain with an edge out of it other than
    these."""
    count = len(streams)
    used = list(dict.fromkeys(streams))
    lines = ["def run(fa, A, B, L, first, start, end, d, count):",
             f"    {', '.join(f'd{k}' for k in range(count))}, = d",
             *(f"    f{j} = fa[{code}]" for j, code in enumerate(used)),
             f"    for first in range(first, first + count * {count}, {count}):"]
    blocking: int | None = -1  # -1: the one given at the stamp (B); k: entry k; None: no blocking collective
    for k in range(count):
        j = used.index(streams[k])
        deps: list[str] = []
        if prevs[k]:
            if k == 0:
                deps.append("A")
            elif streams[k - 1] != streams[k]:
                deps.append(f"e{k - 1}")
        for back in extras[k]:
            if not 0 < back <= k:
                return None
            deps.append(f"e{k - back}")
        if waits[k] and blocking is not None:
            deps.append("B" if blocking == -1 else f"e{blocking}")
            blocking = None
        if k == 0:
            deps.append("L")
        lines.append(f"        r = f{j}")
        lines += [f"        if {dep} > r:\n            r = {dep}" for dep in dict.fromkeys(deps)]
        lines.append(f"        s{k} = r")
        lines.append(f"        e{k} = f{j} = r + d{k}")
        if becomes[k]:
            blocking = k
    lines.append(f"        start[first:first + {count}] = {', '.join(f's{k}' for k in range(count))},")
    lines.append(f"        end[first:first + {count}] = {', '.join(f'e{k}' for k in range(count))},")
    # What the next stamp reads (TaskGraph.stamp's record of it): the last task, the collective left blocking.
    lines.append(f"        A = e{count - 1}" if prevs[0] and streams[-1] != streams[0] else "        A = 0.0")
    if blocking is None or blocking >= 0:  # else the one given passes through, still B
        lines.append(f"        B = e{blocking}" if blocking is not None else "        B = 0.0")
    lines.append("        L = 0.0")
    lines += [f"    fa[{code}] = f{j}" for j, code in enumerate(used)]
    namespace: dict[str, Callable[..., None]] = {}
    exec(compile("\n".join(lines), f"<chain of {count} tasks>", "exec"), namespace)  # the text built above
    return namespace["run"]
