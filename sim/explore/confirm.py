"""Confirm a layout by simulation: the figures a sweep's or search's results table holds, without a trace.

In: a validated ``Scenario`` and its run budget (``Limits``). Out: ``Figures``: step time, tokens/s, TFLOP/s per
GPU, MFU, HFU, both bubble rates, the host-bound fraction, exposed communication per kind, peak memory and whether
it fits, the micro-batches, GPUs and tasks: each equal, bit for bit, to the same field of
``sim.runner.run(scenario).summary`` (tests/test_confirm.py compares them on layouts of every kind the search
explores).

Why it exists (issue 25, must-show 4: the best 1,000 layouts confirmed in under 60 s with two processes): a full
run turns the replayed graph into the trace DataFrame (ten columns, strings included, 10^5 rows per layout) and
summarises it; on the 175B search's best layouts that was half of a confirmation's CPU time (0.33 of 0.62 s per
layout, 2026-11-25, before the summary itself went to numpy). Here the same simulation (``runner.simulate``:
plan, graph, replay) is read straight from the task graph into a few numpy arrays (rank, kind, compute stream,
FLOPs) and each figure is computed by the summary's own functions on the same values in the same order
(``summary.per_rank``: bubble and host-bound fractions and exposed communication; ``rates``;
``stagewise_bubble_rate``), so no rule is restated here. The memory timeline (``workload.footprint.memory_timeline``)
gets a frame of only the rows it reads (``footprint.TIMELINE_KINDS``: compute passes, offload copies,
data-parallel collectives; about 40% of the tasks), which gives the same timeline because it keeps only those
rows of a full trace.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from operator import attrgetter

import numpy as np
import pandas as pd

from sim import runner
from sim.output.summary import exposed_kinds, per_rank, rank_positions, rates, stagewise_bubble
from sim.output.trace import TRACE_COLUMNS
from sim.spec.scenario import Scenario
from sim.workload.footprint import TIMELINE_KINDS, TimelineRows, memory_timeline
from sim.workload.ir import COMPUTE_KINDS, KINDS, Kind, Stream, TaskGraph
from sim.workload.size import Limits

_KINDS: tuple[Kind, ...] = KINDS  # the codes footprint.TimelineRows reads
_KIND_CODE: dict[str, int] = {kind: code for code, kind in enumerate(_KINDS)}  # a Kind hashes as its string
_KIND_NAMES = [str(kind) for kind in _KINDS]  # code -> the trace's plain string
_COMPUTE = np.array([_KIND_CODE[kind] for kind in COMPUTE_KINDS])
_TIMELINE = np.array([_KIND_CODE[kind] for kind in TIMELINE_KINDS])


@dataclass(frozen=True)
class Figures:
    """A simulated step's results-table figures, named and valued as the ``Summary`` fields they equal
    (``peak_memory_bytes`` is ``Summary.peak_memory_bytes.max``)."""

    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    hfu: float
    bubble_fraction: float
    bubble_rate_stagewise: float
    host_bound_fraction: float
    exposed_comm_s: dict[str, float]
    peak_memory_bytes: float
    fits_in_memory: bool
    microbatches: int
    num_gpus: int
    tasks: int


# glibc's mallopt(3) parameters (malloc.h) and the values a confirming process sets (``_keep_freed_memory``).
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_MALLOPTS = ((_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 512 << 20), (_M_TOP_PAD, 64 << 20))
_heap_kept = False


def _keep_freed_memory() -> None:
    """Lets this process keep the memory a confirmation frees for the next one (glibc only; elsewhere nothing).

    Each layout allocates and frees 10^5-element arrays and lists (a 175B layout's graph, times and columns, a
    megabyte each) and 10^5 small objects; by default glibc serves a block over 128 KiB with its own mmap and
    returns it with munmap, and gives the heap's free top back to the kernel past 128 KiB, so every layout faulted
    its memory in again: 3,200-3,700 minor page faults and 7-9 ms of system time a layout, about 8% of its CPU
    (50 of the best 1,000 175B layouts, 2026-11-26). With blocks up to 32 MiB (glibc's largest mmap threshold)
    served from the heap, up to 512 MiB of free heap kept and the heap grown 64 MiB at a time: 300-900 faults and
    1-3 ms. Fixed values: glibc's dynamic threshold stops once they are set. The process's peak memory is what it
    was; only giving freed memory back to the kernel waits for the process's end (a search worker, a sweep)."""
    global _heap_kept
    if _heap_kept:
        return
    _heap_kept = True
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's C library (glibc; musl has no mallopt)
    except (OSError, AttributeError):
        return
    for parameter, value in _MALLOPTS:
        mallopt(parameter, value)


def confirm(scenario: Scenario, limits: Limits | None = None) -> Figures:
    """Simulate ``scenario``'s step as ``sim.runner.run`` does (same engine, SM-contention rounds, size check and
    physical check) and return its table figures. Raises what ``run`` raises. The first call in a process sets
    how its C library keeps freed memory (``_keep_freed_memory``)."""
    _keep_freed_memory()
    with runner.without_gc():
        simulated = runner.simulate(scenario, False, limits or Limits(), lazy=True)
        figures = _figures(simulated)
        # Freed before the collector is back: its allocation count still holds the graph's 10^5..10^6 objects,
        # and the first allocation after gc.enable() would make it scan them all while they are alive (0.03 CPU s
        # of a 175B layout's confirmation, 2026-11-26); freed, they leave the count as it was.
        del simulated
    return figures


def _figures(simulated: runner.Simulated) -> Figures:
    plan, graph = simulated.plan, simulated.graph
    columns = _Columns.of(graph)
    rank, kind = columns.rank, columns.kind
    n = len(rank)
    start = np.asarray(simulated.result.start, dtype=np.float64)
    end = np.asarray(simulated.result.end, dtype=np.float64)

    step = float(end.max())
    pipeline_end = float(end[np.isin(kind, _COMPUTE)].max())
    ranks = per_rank(rank_positions(rank), start, end, kind, _KIND_NAMES, columns.on_compute, exposed_kinds(plan),
                     step, pipeline_end)
    # Each simulated rank stands for its replicas: executed FLOPs per GPU = mean over simulated ranks (pandas'
    # grouped sum, as the summary's, so the figure is the same to the last bit).
    hardware_flops_per_gpu = float(pd.Series(columns.flops).groupby(rank).sum().mean())
    figures = rates(plan, step, hardware_flops_per_gpu)

    timeline_rows = _timeline_rows(graph, columns, start, end)
    memory = memory_timeline(timeline_rows, plan)
    peak_memory = max(m["total"] for m in memory.values())
    compute_rows = np.isin(timeline_rows.kind, _COMPUTE)
    stagewise = stagewise_bubble(timeline_rows.rank[compute_rows], timeline_rows.start[compute_rows],
                                 timeline_rows.end[compute_rows], ranks.host_bound_s)
    runner.check_step(step, figures.hfu, plan.scenario)
    return Figures(step_time_s=step, tokens_per_s=figures.tokens_per_s, tflops_per_gpu=figures.tflops_per_gpu,
                   mfu=figures.mfu, hfu=figures.hfu, bubble_fraction=float(np.mean(ranks.bubbles)),
                   bubble_rate_stagewise=stagewise, host_bound_fraction=float(np.mean(ranks.host_bound)),
                   exposed_comm_s=ranks.exposed,
                   peak_memory_bytes=peak_memory,
                   fits_in_memory=bool(peak_memory <= plan.scenario.cluster.gpu.hbm_capacity),
                   microbatches=plan.microbatches, num_gpus=plan.num_gpus, tasks=n)


@dataclass(frozen=True)
class _Columns:
    """The task columns the figures read, in task order: rank, whether on its rank's compute stream, kind code,
    FLOPs, micro-batch and layer."""

    rank: np.ndarray
    on_compute: np.ndarray
    kind: np.ndarray
    flops: np.ndarray
    microbatch: np.ndarray
    layer: np.ndarray

    @classmethod
    def of(cls, graph: TaskGraph) -> _Columns:
        """Read from the graph: the tasks made one by one from their stream lists (rank, compute stream: a few
        numpy calls per stream) and fields; a lazy graph's stamped chains (``TaskGraph.stamps``) from each chain's
        entries, repeated for its stamps (a few numpy calls per chain), micro-batch and layer from the records (a
        chain spanning several layers: its entries' layers, ``Chain.layers``)."""
        tasks = graph.tasks
        n = len(tasks)
        rank = np.empty(n, dtype=np.int64)
        on_compute = np.zeros(n, dtype=bool)
        plain = np.zeros(n, dtype=bool)  # the tasks made one by one (all, if eager): those in the stream lists
        for (owner, stream), order in graph.streams.items():
            ids = np.array(order, dtype=np.int64)
            rank[ids] = owner
            plain[ids] = True
            if stream == Stream.COMPUTE:
                on_compute[ids] = True
        kind = np.empty(n, dtype=np.int8)
        flops = np.empty(n, dtype=np.float64)
        microbatch = np.empty(n, dtype=TRACE_COLUMNS["microbatch"])
        layer = np.empty(n, dtype=TRACE_COLUMNS["layer"])
        records = graph.stamp_table()
        if len(records):
            # Every chain's entries end to end (``at``: where each chain's begin), then each stamped task's id and
            # entry: stamp j's tasks are firsts[j] + 0..K-1 (the tasks no stream list holds, ascending: the stamps
            # in task order) and its chain's entries at[c] + 0..K-1, so entry = id - firsts[j] + at[c].
            protos = [proto for chain in graph.chains for proto in chain.protos]
            sizes = np.array([len(chain.protos) for chain in graph.chains], dtype=np.int64)
            at = np.cumsum(sizes) - sizes
            chain_of = records[:, 1]
            size = sizes[chain_of]
            ids = np.flatnonzero(~plain)
            if len(ids) != int(size.sum()):
                raise AssertionError(f"lazy graph: {len(ids)} tasks outside the stream lists, its stamps cover "
                                     f"{int(size.sum())}")
            entry = ids - np.repeat(records[:, 0] - at[chain_of], size)
            rank[ids] = np.repeat(np.array([chain.rank for chain in graph.chains], dtype=np.int64), sizes)[entry]
            on_compute[ids] = np.array([proto.stream == Stream.COMPUTE for proto in protos], dtype=bool)[entry]
            kind[ids] = np.array([_KIND_CODE[proto.kind] for proto in protos], dtype=np.int8)[entry]
            flops[ids] = np.array([proto.flops for proto in protos], dtype=np.float64)[entry]
            microbatch[ids] = np.repeat(records[:, 2], size)
            # A task's layer: its stamp's, or its entry's where the chain spans several (a lazy graph's pass).
            stamp_layer = np.repeat(records[:, 3], size)
            spanning = [chain for chain in graph.chains if chain.layers is not None]
            if spanning:
                entry_layers = np.full(len(protos), np.iinfo(np.int64).min, dtype=np.int64)
                for chain in spanning:
                    entry_layers[at[chain.index]:at[chain.index] + len(chain.entries)] = chain.layers or ()
                own = entry_layers[entry]
                stamp_layer = np.where(own != np.iinfo(np.int64).min, own, stamp_layer)
            layer[ids] = stamp_layer
        ids = np.flatnonzero(plain) if len(graph.stamps) else np.arange(n)
        made = list(map(tasks.__getitem__, ids.tolist()))
        count = len(made)
        kind[ids] = np.fromiter(map(_KIND_CODE.__getitem__, map(attrgetter("kind"), made)), np.int8, count)
        flops[ids] = np.fromiter(map(attrgetter("flops"), made), np.float64, count)
        microbatch[ids] = np.fromiter(map(attrgetter("microbatch"), made), microbatch.dtype, count)
        layer[ids] = np.fromiter(map(attrgetter("layer"), made), layer.dtype, count)
        return cls(rank, on_compute, kind, flops, microbatch, layer)


def _timeline_rows(graph: TaskGraph, columns: _Columns, start: np.ndarray, end: np.ndarray) -> TimelineRows:
    """The trace's rows of ``TIMELINE_KINDS`` (compute passes among them, which is all the stage-wise bubble
    rate reads), in task order, as the columns ``TimelineRows.of_trace`` reads from a trace. Names and bytes
    (rounded to the trace's integers) are read on the offload and data-parallel rows only, the only ones whose
    names and bytes it reads (the compute rows get "" and 0; a stamped task's are its chain's proto's, which
    ``graph.tasks`` holds at its place); a rank's stage is its tasks' (each emitter stamps its own on all of
    them)."""
    tasks = graph.tasks
    ids = np.flatnonzero(np.isin(columns.kind, _TIMELINE))
    count = len(ids)
    rows_rank, rows_kind = columns.rank[ids], columns.kind[ids]
    stage_of = {owner: tasks[order[0]].stage for (owner, _), order in graph.streams.items()}
    ranks = np.unique(rows_rank)
    stage = np.array([stage_of[owner] for owner in ranks.tolist()], dtype=TRACE_COLUMNS["stage"])[
        np.searchsorted(ranks, rows_rank)]
    other = np.flatnonzero(~np.isin(rows_kind, _COMPUTE))  # offload copies and data-parallel collectives
    others = list(map(tasks.__getitem__, ids[other].tolist()))
    name = np.full(count, "", dtype=object)
    name[other] = list(map(attrgetter("name"), others))
    nbytes = np.zeros(count, dtype=TRACE_COLUMNS["bytes"])
    nbytes[other] = np.rint(np.fromiter(map(attrgetter("nbytes"), others), np.float64, len(others)))
    return TimelineRows(rank=rows_rank, stage=stage, kind=rows_kind, name=name,
                        microbatch=columns.microbatch[ids], layer=columns.layer[ids],
                        start=start[ids], end=end[ids], nbytes=nbytes)
