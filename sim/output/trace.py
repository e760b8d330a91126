"""The output contract: one row per executed task.

In: the ``TaskGraph`` and the engine's start/end times (``to_frame``). Out: a pandas DataFrame with fixed columns
and dtypes (``TRACE_COLUMNS``), and its Parquet/CSV and Chrome/Perfetto JSON writers. The headline numbers
computed from a trace (step time, MFU, bubble, exposed communication, memory) are ``sim.output.summary``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.output.summary import exposed_intervals
from sim.workload.ir import COMM_KINDS, CP_COMM_KINDS, MOE_COMM_KINDS, STREAMS, TaskGraph

TRACE_COLUMNS: dict[str, str] = {
    "task": "int64", "rank": "int32", "stage": "int32", "stream": "object", "kind": "object", "name": "object",
    "microbatch": "int32", "layer": "int32", "start_s": "float64", "end_s": "float64", "bytes": "int64",
    "flops": "float64", "op": "object",
}
# ``op``: a communication task's collective (all_reduce | all_gather | reduce_scatter | all_to_all | send), "" for
# compute: the charts tell an FSDP all-gather from its reduce-scatter by it, though both are kind ``dp``.


def to_frame(graph: TaskGraph, start: list[float], end: list[float]) -> pd.DataFrame:
    tasks = graph.tasks
    n = len(tasks)
    # One C-level pass over the tasks per column into a typed array: letting pandas infer 10^5-row lists of
    # objects costs more than building the tasks did, and transposing rows of all ten fields at once
    # (zip(*map(attrgetter(*fields), tasks))) took 0.19 CPU s on 175B's 158,521 tasks against 0.05 s this way.
    def values(name: str) -> Iterator[Any]:
        return map(attrgetter(name), tasks)

    def column(name: str, dtype: str) -> np.ndarray | pd.Series:
        return _strings(np.fromiter(values(name), object, n)) if dtype == "object" \
            else np.fromiter(values(name), dtype, n)

    def names(name: str) -> pd.Series:
        """A column of exact ``str``: a task may carry a ``Stream``/``Kind`` member (equal to its string), and the
        trace must not depend on that class (YAML cannot write it; a pickled frame would import it). A member and
        its string are equal keys, so both map to the plain string: one dict lookup per row, half the cost of
        ``str()`` per row."""
        plain = {value: str(value) for value in set(values(name))}
        return _strings(np.fromiter(map(plain.__getitem__, values(name)), object, n))

    frame = pd.DataFrame({
        "task": np.arange(n, dtype="int64"), "rank": column("rank", "int32"), "stage": column("stage", "int32"),
        "stream": names("stream"), "kind": names("kind"), "name": column("name", "object"),
        "microbatch": column("microbatch", "int32"), "layer": column("layer", "int32"),
        "start_s": np.asarray(start, dtype="float64"), "end_s": np.asarray(end, dtype="float64"),
        "bytes": np.rint(np.fromiter(values("nbytes"), "float64", n)).astype("int64"),
        "flops": column("flops", "float64"), "op": names("op"),
    }, copy=False)
    return frame.astype(TRACE_COLUMNS)


def _strings(values: np.ndarray) -> pd.Series:
    """An object column kept as ``object``: pandas 3 infers its ``str`` dtype (Arrow-backed) from a bare array of
    Python strings, and converting that back to the trace's ``object`` took 0.22 of a 175B run's 0.25 CPU s in
    ``to_frame`` (pandas 3.1: ``StringDtype`` inference, ``ArrowStringArray._from_sequence`` then ``to_numpy``)."""
    return pd.Series(values, dtype=object, copy=False)


# -------------------------------------------------------------------------------------------------- writers


# The Parquet columns worth a dictionary: few distinct values each. ``task``, ``start_s`` and ``end_s`` are (nearly)
# all distinct, so Arrow's default dictionary-encodes each only to fall back to plain pages: on 175B's 158,521 rows
# that was 0.025 of the writer's 0.057 CPU s (pyarrow 26, zstd). The data read back is the same.
DICTIONARY_COLUMNS = ("rank", "stage", "stream", "kind", "name", "microbatch", "layer", "bytes", "flops", "op")


def write_trace(trace: pd.DataFrame, path: Path) -> None:
    """The trace as CSV (``path`` ending in .csv) or zstd Parquet with pandas' schema metadata, as
    ``DataFrame.to_parquet`` writes it (``read_trace`` and ``pd.read_parquet`` read back the same frame)."""
    if path.suffix == ".csv":
        trace.to_csv(path, index=False, float_format="%.12g")
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    # What pandas' to_parquet does (pandas/io/parquet.py, PyArrowImpl.write: from_pandas, then write_table), with
    # the dictionary columns chosen; a trace carries no ``attrs`` for it to store.
    table = pa.Table.from_pandas(trace, preserve_index=False)
    pq.write_table(table, path, compression="zstd",
                   use_dictionary=[c for c in DICTIONARY_COLUMNS if c in trace.columns])


def read_trace(path: Path) -> pd.DataFrame:
    # keep_default_na=False: a compute task's empty ``op`` (and a name such as "NA") stays a string, not NaN
    frame = pd.read_csv(path, keep_default_na=False) if path.suffix == ".csv" else pd.read_parquet(path)
    if "op" not in frame:  # a trace written before the column existed
        frame["op"] = ""
    return frame.astype(TRACE_COLUMNS)


# Trace Event Format (Chrome's "Trace Event Format" document, docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQ
# tj7wkPjd8aO8wrdEWp1E; Perfetto's JSON importer, perfetto/src/trace_processor/importers/json): ``pid``/``tid`` are
# integers; names come from ``M`` (metadata) events ``process_name``/``thread_name``, order from
# ``process_sort_index``/``thread_sort_index``. A string tid is accepted by Perfetto only through a fallback its
# source calls brittle, so threads here are numbered: tid = the stream's index in ``Stream`` (the charts' order).
STREAM_TIDS: dict[str, int] = {str(stream): index for index, stream in enumerate(STREAMS)}
US = 1e6  # the format's timestamps are microseconds
# Each rank's exposed communication (its transfers while its compute stream idles: the summary's exposed_comm_s
# rule, ``exposed_intervals``) on a thread of its own after the streams, one slice per interval and kind.
EXPOSED_TID = len(STREAMS)
EXPOSED_THREAD = "exposed comm"


def _flow_events(graph: TaskGraph, trace: pd.DataFrame) -> list[dict[str, Any]]:
    """Flow (arrow) events for the step's cross-rank dependencies, in the format's flow v1 form: an ``s`` event
    inside the producing slice and an ``f`` event with ``bp: "e"`` (bind to the enclosing slice) inside the
    consuming one, both with the same ``id`` and ``cat``. Two sources: a task that depends on a task of another
    rank (a pipeline send -> the neighbour stage's pass), cat ``pp``; and the simulated members of one collective
    (one rendezvous key), an arrow from the lowest rank's member to each other member, cat ``collective``.
    Ids are numbered in task order, so the same graph gives the same events."""
    rank = trace["rank"].to_numpy()
    start = trace["start_s"].to_numpy()
    stream = trace["stream"].to_numpy()
    events: list[dict[str, Any]] = []

    def arrow(src: int, dst: int, cat: str) -> None:
        flow_id = len(events) // 2
        events.append({"ph": "s", "id": flow_id, "cat": cat, "name": cat, "pid": int(rank[src]),
                       "tid": STREAM_TIDS[stream[src]], "ts": float(start[src]) * US})
        events.append({"ph": "f", "bp": "e", "id": flow_id, "cat": cat, "name": cat, "pid": int(rank[dst]),
                       "tid": STREAM_TIDS[stream[dst]], "ts": float(start[dst]) * US})

    members: dict[int, list[int]] = {}
    for task in graph.tasks:
        for dep in task.deps:
            if rank[dep] != rank[task.id]:
                arrow(dep, task.id, "pp")
        if task.collective >= 0:
            members.setdefault(task.collective, []).append(task.id)
    for key in sorted(members):
        first, *others = sorted(members[key], key=lambda t: (int(rank[t]), t))
        for other in others:
            arrow(first, other, "collective")
    return events


def _exposed_events(trace: pd.DataFrame) -> list[dict[str, Any]]:
    """Complete events, cat ``exposed``, on each rank's ``EXPOSED_TID`` thread: per communication kind (tp, pp, dp,
    ep, cp), the intervals its transfers run while the rank's compute stream is idle."""
    kinds = [str(kind) for kind in (*COMM_KINDS, *MOE_COMM_KINDS, *CP_COMM_KINDS)]
    events: list[dict[str, Any]] = []
    for rank, rows in trace.groupby("rank", sort=True):
        compute = rows[rows["stream"] == "compute"]
        comm = rows[(rows["stream"] != "compute") & rows["kind"].isin(kinds)]
        for kind in kinds:
            of_kind = comm[comm["kind"] == kind]
            if of_kind.empty:
                continue
            starts, ends = exposed_intervals(of_kind["start_s"].to_numpy(), of_kind["end_s"].to_numpy(),
                                             compute["start_s"].to_numpy(), compute["end_s"].to_numpy())
            events.extend({"ph": "X", "pid": int(rank), "tid": EXPOSED_TID, "name": f"exposed {kind}",
                           "cat": "exposed", "ts": float(a) * US, "dur": float(b - a) * US, "args": {"kind": kind}}
                          for a, b in zip(starts, ends, strict=True))
    return events


def chrome_trace(trace: pd.DataFrame, link_segments: pd.DataFrame | None = None,
                 graph: TaskGraph | None = None) -> dict[str, Any]:
    """Chrome/Perfetto trace events: one process per rank (pid = rank), one thread per stream (tid = the
    stream's index in ``Stream``), each named by ``process_name``/``thread_name`` metadata and ordered by the
    sort-index metadata; complete (``X``) events in microseconds; each rank's exposed communication on an
    ``exposed comm`` thread (``_exposed_events``); with the ``graph`` the trace came from, flow
    events for the cross-rank dependencies (``_flow_events``); with link segments (contention network), a
    "links" process with one load counter (fraction of capacity) per link."""
    events: list[dict[str, Any]] = []
    ranks = [int(rank) for rank in sorted(trace["rank"].unique())]
    for rank in ranks:
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
    used = trace[["rank", "stream"]].drop_duplicates()
    for rank, stream in sorted(zip(used["rank"].astype(int), used["stream"], strict=True),
                               key=lambda pair: (pair[0], STREAM_TIDS[pair[1]])):
        tid = STREAM_TIDS[stream]
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": stream}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid, "args": {"sort_index": tid}})
    exposed = _exposed_events(trace)
    for rank in sorted({event["pid"] for event in exposed}):
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": EXPOSED_TID,
                       "args": {"name": EXPOSED_THREAD}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": EXPOSED_TID,
                       "args": {"sort_index": EXPOSED_TID}})
    if link_segments is not None and len(link_segments):
        links_pid = (ranks[-1] if ranks else -1) + 1
        events.append({"ph": "M", "name": "process_name", "pid": links_pid, "tid": 0, "args": {"name": "links"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": links_pid, "tid": 0,
                       "args": {"sort_index": links_pid}})
        for row in link_segments.itertuples(index=False):
            name = f"{row.src}->{row.dst}"
            events.append({"ph": "C", "pid": links_pid, "tid": 0, "name": name, "ts": row.start_s * US,
                           "args": {"load": round(float(row.load_fraction), 6)}})
            events.append({"ph": "C", "pid": links_pid, "tid": 0, "name": name, "ts": row.end_s * US,
                           "args": {"load": 0}})
    for row in trace.itertuples(index=False):
        args = {"task": row.task, "microbatch": row.microbatch, "layer": row.layer}
        if row.bytes:
            args["bytes"] = row.bytes
        label = row.name if row.microbatch < 0 else f"{row.name} mb{row.microbatch}"
        events.append({"ph": "X", "pid": int(row.rank), "tid": STREAM_TIDS[row.stream], "name": label,
                       "cat": row.kind, "ts": row.start_s * US, "dur": (row.end_s - row.start_s) * US, "args": args})
    events.extend(exposed)
    if graph is not None:
        events.extend(_flow_events(graph, trace))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(trace: pd.DataFrame, path: Path, link_segments: pd.DataFrame | None = None,
                       graph: TaskGraph | None = None) -> None:
    path.write_text(json.dumps(chrome_trace(trace, link_segments, graph), default=int))
