"""Confirm a layout by simulation: the figures a sweep's or search's results table holds, without a trace.

In: a validated ``Scenario`` and its run budget (``Limits``). Out: ``Figures``: step time, tokens/s, TFLOP/s per
GPU, MFU, HFU, both bubble rates, exposed communication per kind, peak memory and whether it fits, the
micro-batches, GPUs and tasks: each equal, bit for bit, to the same field of ``sim.runner.run(scenario).summary``
(tests/test_confirm.py compares them on layouts of every kind the search explores).

Why it exists (issue 25, must-show 4: the best 1,000 layouts confirmed in under 60 s with two processes): a full
run turns the replayed graph into the trace DataFrame (ten columns, strings included, 10^5 rows per layout) and
summarises it; on the 175B search's best layouts that was half of a confirmation's CPU time (0.33 of 0.62 s per
layout, 2026-11-25, before the summary itself went to numpy). Here the same simulation (``runner.simulate``:
plan, graph, replay) is read straight from the task graph into a few numpy arrays (rank, kind, compute stream,
FLOPs) and each figure is computed by the summary's own functions on the same values in the same order
(``summary.per_rank``: bubble fractions and exposed communication; ``rates``; ``stagewise_bubble_rate``), so no
rule is restated here. The memory timeline (``workload.footprint.memory_timeline``) gets a frame of only the rows
it reads (``footprint.TIMELINE_KINDS``: compute passes, offload copies, data-parallel collectives; about 40% of
the tasks), which gives the same timeline because it keeps only those rows of a full trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import numpy as np
import pandas as pd

from sim import runner
from sim.output.summary import exposed_kinds, per_rank, rank_positions, rates, stagewise_bubble_rate
from sim.output.trace import TRACE_COLUMNS
from sim.spec.scenario import Scenario
from sim.workload.footprint import TIMELINE_KINDS, memory_timeline
from sim.workload.ir import COMPUTE_KINDS, Kind, Stream, TaskGraph
from sim.workload.size import Limits

_KINDS: tuple[Kind, ...] = tuple(Kind)
_KIND_CODE: dict[str, int] = {kind: code for code, kind in enumerate(_KINDS)}  # a Kind hashes as its string
_KIND_NAMES = [str(kind) for kind in _KINDS]  # code -> the trace's plain string
_KIND_NAME = np.array(_KIND_NAMES, dtype=object)
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
    exposed_comm_s: dict[str, float]
    peak_memory_bytes: float
    fits_in_memory: bool
    microbatches: int
    num_gpus: int
    tasks: int


def confirm(scenario: Scenario, limits: Limits | None = None) -> Figures:
    """Simulate ``scenario``'s step as ``sim.runner.run`` does (same engine, SM-contention rounds, size check and
    physical check) and return its table figures. Raises what ``run`` raises."""
    with runner.without_gc():
        simulated = runner.simulate(scenario, False, limits or Limits())
        return _figures(simulated)


def _figures(simulated: runner.Simulated) -> Figures:
    plan, graph = simulated.plan, simulated.graph
    tasks = graph.tasks
    n = len(tasks)
    rank = np.fromiter(map(attrgetter("rank"), tasks), np.int64, n)
    kind = np.fromiter(map(_KIND_CODE.__getitem__, map(attrgetter("kind"), tasks)), np.int8, n)
    on_compute = np.fromiter(map(Stream.COMPUTE.__eq__, map(attrgetter("stream"), tasks)), bool, n)
    flops = np.fromiter(map(attrgetter("flops"), tasks), np.float64, n)
    start = np.asarray(simulated.result.start, dtype=np.float64)
    end = np.asarray(simulated.result.end, dtype=np.float64)

    step = float(end.max())
    pipeline_end = float(end[np.isin(kind, _COMPUTE)].max())
    ranks = per_rank(rank_positions(rank), start, end, kind, _KIND_NAMES, on_compute, exposed_kinds(plan), step,
                     pipeline_end)
    # Each simulated rank stands for its replicas: executed FLOPs per GPU = mean over simulated ranks (pandas'
    # grouped sum, as the summary's, so the figure is the same to the last bit).
    hardware_flops_per_gpu = float(pd.Series(flops).groupby(rank).sum().mean())
    figures = rates(plan, step, hardware_flops_per_gpu)

    timeline_rows = _timeline_frame(graph, rank, kind, start, end)
    memory = memory_timeline(timeline_rows, plan)
    peak_memory = max(m["total"] for m in memory.values())
    runner.check_step(step, figures.hfu, plan.scenario)
    return Figures(step_time_s=step, tokens_per_s=figures.tokens_per_s, tflops_per_gpu=figures.tflops_per_gpu,
                   mfu=figures.mfu, hfu=figures.hfu, bubble_fraction=float(np.mean(ranks.bubbles)),
                   bubble_rate_stagewise=stagewise_bubble_rate(timeline_rows), exposed_comm_s=ranks.exposed,
                   peak_memory_bytes=peak_memory,
                   fits_in_memory=bool(peak_memory <= plan.scenario.cluster.gpu.hbm_capacity),
                   microbatches=plan.microbatches, num_gpus=plan.num_gpus, tasks=n)


def _timeline_frame(graph: TaskGraph, rank: np.ndarray, kind: np.ndarray, start: np.ndarray,
                    end: np.ndarray) -> pd.DataFrame:
    """The trace's rows of ``TIMELINE_KINDS`` (compute passes among them, which is all the stage-wise bubble
    rate reads), in task order, with the columns and dtypes of ``sim.output.trace.to_frame``."""
    ids = np.flatnonzero(np.isin(kind, _TIMELINE))
    kept = list(map(graph.tasks.__getitem__, ids.tolist()))
    count = len(kept)

    def column(field: str, dtype: str) -> np.ndarray:
        return np.fromiter(map(attrgetter(field), kept), dtype, count)

    return pd.DataFrame({
        "task": ids.astype("int64"), "rank": rank[ids].astype(TRACE_COLUMNS["rank"]),
        "stage": column("stage", TRACE_COLUMNS["stage"]), "kind": pd.Series(_KIND_NAME[kind[ids]], dtype=object),
        "name": pd.Series(list(map(attrgetter("name"), kept)), dtype=object),
        "microbatch": column("microbatch", TRACE_COLUMNS["microbatch"]),
        "layer": column("layer", TRACE_COLUMNS["layer"]), "start_s": start[ids], "end_s": end[ids],
        "bytes": np.rint(column("nbytes", "float64")).astype(TRACE_COLUMNS["bytes"]),
    }, copy=False)
