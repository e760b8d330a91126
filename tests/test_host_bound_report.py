"""Host-bound time reported as what it is (docs/summary.md, schema version 2): the compute stream's wait for the
host to issue a MoE layer pass behind the token dispatcher's host sync (sim.costs.host,
docs/mechanisms/moe_host_sync.md) is ``host_bound_fraction``, not part of ``bubble_fraction``; on the critical path
the host's seconds are ``critical_path_s.host``, never a communication kind. Checked against the closed form on
one stage, against the task graph's own dependencies on pipelined and overlapped layouts, and against the
bubble as version 1 defined it."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pandas as pd
import pytest
from test_moe_host_sync import _doc as host_sync_doc

from sim import runner
from sim.cli.tables import summary_table
from sim.output.summary import _merge
from sim.plan import resolve
from sim.runner import RunResult
from sim.spec.scenario import Scenario, load_scenario, scenario_from_dict
from sim.workload.ir import COMPUTE_KINDS, Kind, Stream

from conftest import SCENARIOS

TP4 = SCENARIOS / "validation" / "moe" / "mz-qwen3-235b-h100-256-deepep-tp4.yaml"
BUSY_KINDS = (*COMPUTE_KINDS, Kind.TP)  # the bubble's busy set: compute passes and blocking TP collectives


def _small(ranks: str = "slice", **moe: Any) -> Scenario:
    """tests/test_moe_host_sync.py's layer: one MoE layer of a small model on 8 GPUs (ep 8, DeepEP), one stage,
    4 micro-batches, each pass's device time well under the host's ~3.2 ms to issue it."""
    return scenario_from_dict({**host_sync_doc(**moe), "ranks": ranks})


@cache
def _run(path: Any, overrides: tuple[str, ...] = ()) -> RunResult:
    """A bundled scenario's run, once per module (the Qwen3 row takes seconds)."""
    return runner.run(load_scenario(path, list(overrides)))


def _pipeline_end(trace: pd.DataFrame) -> float:
    return float(trace.loc[trace["kind"].isin(COMPUTE_KINDS), "end_s"].max())


def _length(starts: Any, ends: Any) -> float:
    merged = _merge(np.asarray(starts, float), np.asarray(ends, float))
    return float(np.sum(merged[1] - merged[0]))


def _version1_bubble(trace: pd.DataFrame) -> float:
    """Schema version 1's bubble fraction, restated: per rank 1 - (union of its compute passes and TP collectives,
    cut at the last forward/backward's end) / that end, the mean over ranks."""
    end = _pipeline_end(trace)
    busy = trace[trace["kind"].isin(BUSY_KINDS)]
    return float(np.mean([1.0 - _length(rows["start_s"], np.minimum(rows["end_s"], end)) / end
                          for _, rows in busy.groupby("rank")]))


def _outside(starts: np.ndarray, ends: np.ndarray, busy_starts: np.ndarray, busy_ends: np.ndarray) -> float:
    """Length of the disjoint intervals (starts, ends) outside the disjoint sorted intervals (busy_starts,
    busy_ends): each interval's length less the busy time inside it, from the busy time's running total."""
    total = np.concatenate([[0.0], np.cumsum(busy_ends - busy_starts)])

    def covered(points: np.ndarray) -> np.ndarray:  # busy seconds before each point
        i = np.searchsorted(busy_starts, points, side="right") - 1
        inside = np.clip(np.minimum(points, busy_ends[np.clip(i, 0, None)]) - busy_starts[np.clip(i, 0, None)], 0,
                         None)
        return np.where(i >= 0, total[np.clip(i, 0, None)] + inside, 0.0)

    return float(np.sum(ends - starts) - np.sum(covered(ends) - covered(starts)))


def _graph_host_bound(result: RunResult) -> dict[int, float]:
    """Each rank's host-bound seconds read from the task graph instead of the trace: a ``moe_host_wait`` waits for
    its issue (``Kind.HOST``), the pass's last task and its compute-stream predecessor; where the issue ended last,
    the compute stream idled from the later of the other two to the issue's end. The union of those intervals per
    rank, less its compute stream's and TP collectives' busy time (what the bubble counts as busy)."""
    graph, trace = result.graph, result.trace
    start, end = trace["start_s"].to_numpy(), trace["end_s"].to_numpy()
    before: dict[int, int] = {}
    for (_, stream), order in graph.streams.items():
        if stream == Stream.COMPUTE:
            before.update(zip(order[1:], order[:-1], strict=True))
    gaps: dict[int, list[tuple[float, float]]] = {}
    for task in graph.tasks:
        if task.name != "moe_host_wait":
            continue
        issue = next(d for d in task.deps if graph.tasks[d].kind == Kind.HOST)
        others = [end[d] for d in task.deps if d != issue] + ([end[before[task.id]]] if task.id in before else [])
        if end[issue] > max(others):
            assert start[task.id] == end[issue]
            gaps.setdefault(task.rank, []).append((max(others), end[issue]))
    stop = _pipeline_end(trace)
    seconds = {}
    for rank, rows in trace.groupby("rank"):
        spans = gaps.get(int(rank), [])
        if not spans:
            seconds[int(rank)] = 0.0
            continue
        gap_starts, gap_ends = _merge(np.array([s for s, _ in spans]), np.minimum([e for _, e in spans], stop))
        working = rows[rows["kind"].isin(BUSY_KINDS) | (rows["stream"] == Stream.COMPUTE)]
        busy = _merge(working["start_s"].to_numpy(), working["end_s"].to_numpy())
        seconds[int(rank)] = _outside(gap_starts, gap_ends, *busy)
    return seconds


def test_a_single_stage_idles_by_host_minus_device_in_every_pass() -> None:
    """Closed form: one stage, every MoE layer pass host-bound (its device time under the host's issue time).
    A pass issued from its first task's start lasts max(device, host) (docs/mechanisms/moe_host_sync.md), so
    the compute stream idles host - device after each pass's device work: host_bound_fraction x the time to
    the last forward/backward = sum over passes of (host - device), device being the same pass's span without
    the sync; the step grows by exactly that. The bubble keeps only the rest of version 1's idle."""
    on, off = runner.run(_small()), runner.run(_small(host_sync=False))
    host = resolve(_small()).moe_host_seconds
    assert set(on.trace["rank"]) == {0}
    compute = off.trace[(off.trace["stream"] == Stream.COMPUTE) & (off.trace["layer"] == 0)]
    spans = compute.groupby(["kind", "microbatch"]).agg(start=("start_s", "min"), end=("end_s", "max"))
    excess = [host[str(kind)] - (row.end - row.start) for (kind, _), row in spans.iterrows()]
    assert len(excess) == 8 and min(excess) > 1e-3  # 4 forward and 4 backward passes, each host-bound by > 1 ms
    expected = sum(excess)
    summary = on.summary
    assert summary.host_bound_fraction * _pipeline_end(on.trace) == pytest.approx(expected, rel=1e-9)
    assert summary.step_time_s - off.summary.step_time_s == pytest.approx(expected, rel=1e-9)
    assert summary.host_bound_fraction > 0.6  # 21 ms of a 32 ms pipeline
    assert summary.bubble_fraction + summary.host_bound_fraction == pytest.approx(_version1_bubble(on.trace),
                                                                                   abs=1e-12)
    # what is left as bubble is the same idle seconds as without the sync (here the exposed dispatch/combine)
    bubble_s = summary.bubble_fraction * _pipeline_end(on.trace)
    assert bubble_s == pytest.approx(off.summary.bubble_fraction * _pipeline_end(off.trace), rel=1e-6)
    assert off.summary.host_bound_fraction == 0.0


@pytest.mark.parametrize("case", ["qwen3-235b tp4", "mixtral interleaved", "small layer, F&B pairs"])
def test_the_host_bound_time_is_what_the_graph_waited_for(case: str) -> None:
    """On pipelined and overlapped layouts, the trace-only rule (``summary.host_bound_seconds``) gives each rank
    the compute stream's waits for the host that the task graph's dependencies say it had; the bubble plus the
    host-bound fraction is version 1's bubble; the stage-wise bubble counts the host-bound seconds as busy. Cases:
    the Qwen3 tp 4 row (pp 8, vpp 4, SP: forward host-bound, backward device-bound); Mixtral
    8x7B dropless (pp 4, vpp 8, alltoall) at 100 us per eager op; the small layer under ``moe.a2a_overlap``,
    whose merged F&B pairs issue two passes back to back on the host while the compute stream interleaves them."""
    result = {
        "qwen3-235b tp4": lambda: _run(TP4),
        "mixtral interleaved": lambda: _run(SCENARIOS / "mixtral-8x7b_h100-64.yaml", (
            "training.global_batch=64", "moe.pad_to_capacity=false", "moe.capacity_factor=null",
            "costs.eager_op_overhead=100 us")),
        "small layer, F&B pairs": lambda: runner.run(_small(a2a_overlap=True)),
    }[case]()
    summary, trace = result.summary, result.trace
    end = _pipeline_end(trace)
    graph = _graph_host_bound(result)
    assert summary.host_bound_fraction == pytest.approx(np.mean([s / end for s in graph.values()]), rel=1e-9)
    assert summary.host_bound_fraction > 0.05
    assert summary.bubble_fraction + summary.host_bound_fraction == pytest.approx(_version1_bubble(trace), abs=1e-12)
    assert summary.bubble_fraction > 0  # pipeline bubbles and exposed exchanges remain
    compute = trace[trace["kind"].isin(COMPUTE_KINDS)]
    spans = compute.groupby("rank")["end_s"].max() - compute.groupby("rank")["start_s"].min()
    busy = (compute["end_s"] - compute["start_s"]).groupby(compute["rank"]).sum()
    assert summary.bubble_rate_stagewise == pytest.approx(
        (spans.max() - (busy + pd.Series(graph)).max()) / spans.max(), rel=1e-9)


def test_the_qwen3_tp4_rows_bubble_splits_into_bubble_and_host_bound() -> None:
    """The Qwen3-235B tp 4 validation row: its forward passes are host-bound (3.36 ms of host against ~1.5 ms of
    device), so most of version 1's bubble was the host; without the sync nothing is host-bound and the bubble is
    version 1's."""
    on = _run(TP4).summary
    off = _run(TP4, ("moe.host_sync=false",))
    assert on.host_bound_fraction > on.bubble_fraction
    assert off.summary.host_bound_fraction == 0.0
    assert off.summary.bubble_fraction == _version1_bubble(off.trace)


def test_the_critical_path_reports_the_host_as_its_own_category() -> None:
    """ranks: all. The critical path's compute, communication and host seconds sum to the step time; the host's
    issue time is ``critical_path_s.host``, never ``comm_by_kind["host"]``; without the sync it is 0."""
    for scenario, hosts in ((_small("all"), True), (_small("all", host_sync=False), False),
                            (load_scenario(SCENARIOS / "pipeline-4x8.yaml", ["ranks=all"]), False)):
        summary = runner.run(scenario).summary
        path = summary.critical_path_s
        assert path is not None
        assert "host" not in path.comm_by_kind
        assert (path.host > 0) is hosts
        total = sum(path.compute_by_rank.values()) + sum(path.comm_by_kind.values()) + path.host
        assert total == pytest.approx(summary.step_time_s, rel=1e-12)
    # the small layer's path runs through the host's issue of every pass: 8 passes x (host - the first task)
    assert runner.run(_small("all")).summary.critical_path_s.host > 0.02  # type: ignore[union-attr]


def test_a_dense_run_is_not_host_bound_and_its_bubble_is_version_1s() -> None:
    """No host sync, no host-bound time: a dense run's bubble is version 1's to the bit."""
    for name in ("tiny.yaml", "pipeline-4x8.yaml"):
        result = runner.run(load_scenario(SCENARIOS / name))
        assert result.summary.host_bound_fraction == 0.0
        assert result.summary.bubble_fraction == _version1_bubble(result.trace)


def test_sim_runs_table_shows_the_host_bound_share_only_where_there_is_one() -> None:
    def rows(scenario: Scenario) -> dict[str, str]:
        table = summary_table(runner.run(scenario).summary)
        return dict(zip(table.columns[0].cells, table.columns[1].cells, strict=True))  # type: ignore[arg-type]

    host_bound = rows(_small("all"))
    assert host_bound["host-bound fraction"].endswith("%") and float(host_bound["host-bound fraction"][:-1]) > 60
    assert "s issuing MoE passes" in host_bound["host on the critical path"]
    plain = rows(_small("all", host_sync=False))
    assert "host-bound fraction" not in plain and "host on the critical path" not in plain
