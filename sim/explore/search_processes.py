"""The screen shared out over forked processes (``sim search -j``), its rows put back in order.

In: a base ``Scenario``, its layouts, an ``Estimator`` and a process count. Out: ``_partition``, the layouts' indices in
shares of about equal work, each (pp, tp) group (``_group``) in one share so that a process seldom prices what another
does; ``_screen_in_processes``, ``_screen_columns`` (sim.explore.search_screen) in one forked process per share
(``_screen_worker``), their progress relayed and their rows put back in the layouts' order, equal to the screen in one
process; ``_usable_cpus``.
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import multiprocessing.connection
import operator
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from sim.explore import layout_table
from sim.explore.estimate import Estimator
from sim.explore.search_screen import _ESTIMATE_COLUMNS, _Columns, _screen_columns
from sim.explore.search_space import Layout
from sim.spec.scenario import Scenario


def _usable_cpus() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _partition(space: list[Layout], parts: int) -> list[list[int]]:
    """``space``'s indices in ``parts`` shares of about equal work, each group (``_group``: a (pp, tp), and the
    zero-bubble layouts of one pp) in one share: most parts an estimator keeps follow the pipeline and the TP
    degree (a stage's structure, tails, activations and layer times; layouts of one (pp, tp) on one cluster share
    their dp) or, for zero-bubble schedules, the pipeline and the micro-batch count (the schedule's order), so a
    process seldom prices what another one does. A layout's work is taken as
    1 + pp/40 (the 175B and Mixtral screens, 2026-11-26: 60-104 us a layout at pp 2-8, 102-143 at pp 16, 167-183
    at pp 32). Where that leaves one share more than ``_MOST`` of the work, each (pp, tp, schedule) is a group
    instead. Two shares: the split of the groups with the least work in the larger share (every split tried, up
    to ``_SPLITS_TRIED``); else largest groups first, each to the share with the least work so far. ``space``'s
    order within a share. The 175B screen's two shares, each priced alone one after the other (2026-11-26, load
    5-8): 1.83-1.86 and 1.89-2.04 CPU s (3.60-4.11 in one process); by (pp, tp) alone 1.86-1.97 and 2.00-2.11;
    by pp alone 1.50 and 2.15-2.17."""
    for key in (_group, lambda layout: (layout.pp, layout.tp, layout.schedule)):
        groups: dict[Any, list[int]] = {}
        for index, layout in enumerate(space):
            groups.setdefault(key(layout), []).append(index)
        work = {name: len(indices) * (1 + space[indices[0]].pp / 40) for name, indices in groups.items()}
        shares = _split(groups, work, parts)
        total = sum(work.values())
        if max(sum(work[name] for name in share) for share in shares) <= _MOST * total:
            break
    return [sorted(i for name in share for i in groups[name]) for share in shares if share]


def _group(layout: Layout) -> tuple[int, int]:
    """``_partition``'s group of a layout: (pp, tp), or (pp, 0) for every zero-bubble layout of that depth,
    whatever its tp: their stage-level replays need the schedule's order per (schedule, pp, micro-batches), and
    building it (ZB-V's tries every fill variant) costs more than what one (pp, tp) shares across schedules."""
    return (layout.pp, 0) if layout.schedule.startswith(("zb", "dualpipe")) else (layout.pp, layout.tp)


def _split(groups: dict[Any, list[int]], work: dict[Any, float], parts: int) -> list[list[Any]]:
    """The groups' names in ``parts`` shares (``_partition``)."""
    names = sorted(groups, key=lambda name: -work[name])
    if parts == 2 and 2 ** len(names) <= _SPLITS_TRIED:
        total = sum(work.values())
        best, best_larger = names, total
        for mask in range(2 ** (len(names) - 1)):  # the first group always in the first share
            first = [name for bit, name in enumerate(names) if not mask >> bit & 1]
            larger = max(sum(work[name] for name in first), total - sum(work[name] for name in first))
            if larger < best_larger:
                best, best_larger = first, larger
        return [best, [name for name in names if name not in best]]
    shares: list[list[Any]] = [[] for _ in range(parts)]
    loads = [0.0] * parts
    for name in names:
        least = loads.index(min(loads))
        shares[least].append(name)
        loads[least] += work[name]
    return shares


_MOST = 0.6  # the largest share of the work _partition leaves to one process of two by (pp, tp) alone
_SPLITS_TRIED = 2 ** 16


def _screen_in_processes(base: Scenario, space: list[Layout], estimator: Estimator,
                         on_progress: Callable[[int, int], None] | None, jobs: int,
                         codes: layout_table.Codes) -> _Columns:
    """``_screen_columns`` in ``jobs`` forked processes, each over one share of ``space`` (``_partition``) with a
    copy of ``estimator`` (its topology and cost model built once, here); their rows put back in ``space``'s
    order. Each process reports its progress every ``SCREEN_PROGRESS_EVERY`` layouts."""
    context = multiprocessing.get_context("fork")
    shares = _partition(space, jobs)
    if len(shares) < 2:  # one group: nothing to share out
        return _screen_columns(base, space, estimator, on_progress, codes)
    sys.stdout.flush()  # a forked child must not write this process's buffered output a second time
    sys.stderr.flush()
    workers, pipes = [], []
    # The children's collector leaves what they inherit alone (Python's gc.freeze advice for fork): a collection
    # in a child would traverse this process's whole heap (after an earlier screen in this process, 0.7 CPU s more
    # for the 175B screen's two children, 2026-11-26) and copy the pages it touches.
    gc.freeze()
    try:
        for share in shares:
            receive, send = context.Pipe(duplex=False)
            rows = np.asarray(share)
            worker = context.Process(target=_screen_worker, daemon=True,
                                     args=(base, [space[i] for i in share], estimator, send,
                                           {name: column[rows] for name, column in codes.items()}))
            worker.start()
            send.close()
            workers.append(worker)
            pipes.append(receive)
    finally:
        gc.unfreeze()
    done = [0] * len(shares)
    results: dict[int, _Columns] = {}
    try:
        while len(results) < len(shares):
            for pipe in multiprocessing.connection.wait([p for i, p in enumerate(pipes) if i not in results]):
                part = next(i for i, p in enumerate(pipes) if p is pipe)
                try:
                    message: tuple[str, Any] = pipes[part].recv()
                except EOFError:
                    raise RuntimeError(f"a screening process ended without its rows (exit code "
                                       f"{workers[part].exitcode})") from None
                kind, payload = message
                if kind == "error":
                    raise RuntimeError(f"a screening process failed: {payload}")
                if kind == "done":
                    results[part] = payload
                    done[part] = len(shares[part])
                else:
                    done[part] = payload
                if on_progress is not None and kind == "progress":
                    on_progress(sum(done), len(space))
    finally:
        for worker in workers:
            if worker.is_alive() and len(results) < len(shares):
                worker.terminate()
            worker.join()
    # the shares' rows one after another, then each row of space taken from there (the same objects, in its order)
    back = np.argsort(np.concatenate([np.asarray(share) for share in shares]), kind="stable").tolist()

    def in_order(parts: list[list[Any]]) -> list[Any]:
        joined = list(itertools.chain.from_iterable(parts))
        return [joined[i] for i in back] if len(back) < 2 else list(operator.itemgetter(*back)(joined))

    status = in_order([results[part][0] for part in range(len(shares))])
    estimates = {name: in_order([results[part][1][name] for part in range(len(shares))]) for name in _ESTIMATE_COLUMNS}
    if on_progress is not None:
        on_progress(len(space), len(space))
    return status, estimates


def _screen_worker(base: Scenario, space: list[Layout], estimator: Estimator,
                   send: multiprocessing.connection.Connection, codes: layout_table.Codes) -> None:
    """A screening process: ``_screen_columns`` over its share, its progress and then its rows sent back."""
    try:
        columns = _screen_columns(base, space, estimator, lambda done, total: send.send(("progress", done)), codes)
        send.send(("done", columns))
    except BaseException as error:  # noqa: BLE001 - any failure goes back to the parent as one line
        send.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        send.close()
