"""NCCL kernels hold SMs: compute that overlaps a collective or a send runs slower.

In: the task graph, one replay's start and end per task, the GPU's SM count and how many SMs an in-flight
collective and an in-flight send hold. Out: the compute tasks' durations stretched by the SMs that overlapping
NCCL kernels held (``stretch``), and ``settle``, which replays until those durations stop changing and returns
them per task id (the graph keeps its base durations: the replays take the stretched ones as an override).

Why. NCCL runs one CTA per channel, each on its own SM, for the whole life of a collective, including the time
it waits on the network (NCCL's ``connect.cc``: rings are duplicated to ``2 x`` the searched channels; one
channel = one CTA). A large GEMM tile needs a whole SM, so while ``n`` of ``S`` SMs are held the GPU computes
at ``(S - n) / S`` of its rate. Measured: an all-gather holds 24 of an H100's 132 SMs (NVIDIA developer forum),
and Lee et al. (arXiv:2507.03114) measured an 18.9 % mean compute slowdown under overlap on NVLink A100/H100s,
about ``24 / (132 - 24)``.

A compute task of base duration ``d`` whose span saw, on average, ``n`` SMs held finishes at
``T = d / (1 - n / S)``: the work done, ``(1 - n/S) T``, equals ``d``. When collectives run depends on ``T``, so
the replay is repeated with the stretched durations until they agree (a fixed point, reached in a few rounds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sim.hardware.sms import on_fewer_sms
from sim.network.deepep import OPS as DEEPEP_OPS
from sim.workload.ir import Stream, TaskGraph

COMPUTE_STREAM = Stream.COMPUTE
MAX_ROUNDS = 12
TOLERANCE_S = 1e-6  # the rounds stop once no compute task moves by more than a microsecond


def _holders(graph: TaskGraph, collective_sms: int, p2p_sms: int,
             deepep_sms: int = 0) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per rank: the ids of the communication tasks that hold SMs beside its compute stream, and how many each
    holds: NCCL's collectives and sends, and DeepEP's dispatch/combine (an ``ep`` task of a ``deepep_*`` op,
    sim.network.deepep.OPS), ``deepep_sms`` each."""
    held: dict[int, tuple[list[int], list[int]]] = {}
    for task in graph.tasks:
        if not task.op or task.stream == COMPUTE_STREAM:
            continue  # a blocking collective on the compute stream overlaps no compute on that stream
        if task.op in DEEPEP_OPS:  # timed by its closed form, or by its flows on the contention network
            sms = deepep_sms
        else:
            sms = p2p_sms if task.op == "send" else collective_sms
        if sms:
            ids, counts = held.setdefault(task.rank, ([], []))
            ids.append(task.id)
            counts.append(sms)
    return {rank: (np.array(ids), np.array(counts, dtype=float)) for rank, (ids, counts) in held.items()}


def _held_profiles(holders: dict[int, tuple[np.ndarray, np.ndarray]], start: np.ndarray,
                   end: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per rank: the times where the held-SM count changes and the integral of held SMs up to each of them."""
    profiles = {}
    for rank, (ids, counts) in holders.items():
        times = np.concatenate((start[ids], end[ids]))
        order = np.argsort(times, kind="stable")
        times = times[order]
        held = np.cumsum(np.concatenate((counts, -counts))[order])  # SMs held from times[i] to times[i+1]
        area = np.concatenate(([0.0], np.cumsum(held[:-1] * np.diff(times))))
        profiles[rank] = (times, area)
    return profiles


def _integral(times: np.ndarray, area: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Held-SM seconds from the first change up to each time in ``at`` (piecewise linear in between)."""
    return np.interp(at, times, area, left=0.0, right=float(area[-1]))


def _compute_by_rank(graph: TaskGraph) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per rank: its compute tasks' ids and base durations."""
    ids: dict[int, list[int]] = {}
    for task in graph.tasks:
        if task.stream == COMPUTE_STREAM and task.duration is not None:
            ids.setdefault(task.rank, []).append(task.id)
    return {rank: (np.array(group), np.array([graph.tasks[i].duration for i in group]))
            for rank, group in ids.items()}


def stretch(compute: dict[int, tuple[np.ndarray, np.ndarray]], current: dict[int, np.ndarray],
            holders: dict[int, tuple[np.ndarray, np.ndarray]], start: list[float], end: list[float], sms: int) -> float:
    """Each rank's compute durations (``current``, updated in place) from their base and the SMs held during
    their spans in this replay; returns the largest change of any duration (seconds)."""
    starts, ends = np.asarray(start), np.asarray(end)
    profiles = _held_profiles(holders, starts, ends)
    moved = 0.0
    for rank, (index, base) in compute.items():
        if rank not in profiles:
            continue  # no collective ever ran on this GPU: its durations stay at their base
        times, area = profiles[rank]
        span = ends[index] - starts[index]
        held = _integral(times, area, ends[index]) - _integral(times, area, starts[index])
        mean_held = np.divide(held, span, out=np.zeros_like(span), where=span > 0)
        new = on_fewer_sms(base, mean_held, sms)  # at least one SM keeps computing
        moved = max(moved, float(np.abs(new - current[rank]).max()))
        current[rank] = new
    return moved


def settle(graph: TaskGraph, first: tuple[list[float], list[float]],
           replay: Callable[[Sequence[float | None]], tuple[list[float], list[float]]], sms: int,
           collective_sms: int, p2p_sms: int, deepep_sms: int = 0) -> tuple[list[float | None], float]:
    """From a first replay at the base durations: stretch the compute durations, replay with them (``replay``
    takes the durations per task id and returns the replay's start and end), and repeat until they are stable
    (at most ``MAX_ROUNDS`` replays). Returns the durations of the last replay, per task id (``Task.duration``
    with the compute stream's stretched; the caller keeps that replay), and the compute seconds added on the
    rank that gained most. The graph is only read."""
    compute, holders = _compute_by_rank(graph), _holders(graph, collective_sms, p2p_sms, deepep_sms)
    current = {rank: base.copy() for rank, (_, base) in compute.items()}
    durations: list[float | None] = [task.duration for task in graph.tasks]
    start, end = first
    for _ in range(MAX_ROUNDS):
        if stretch(compute, current, holders, start, end, sms) <= TOLERANCE_S:
            break
        for rank, (index, _) in compute.items():
            for task_id, seconds in zip(index.tolist(), current[rank].tolist(), strict=True):
                durations[task_id] = seconds
        start, end = replay(durations)
    added = max((float((current[rank] - base).sum()) for rank, (_, base) in compute.items()), default=0.0)
    return durations, added
