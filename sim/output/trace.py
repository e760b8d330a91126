"""The output contract: one row per executed task.

In: the ``TaskGraph`` and the engine's start/end times (``to_frame``). Out: a pandas DataFrame with fixed columns
and dtypes (``TRACE_COLUMNS``), and its Parquet/CSV and Chrome/Perfetto JSON writers. The headline numbers
computed from a trace (step time, MFU, bubble, exposed communication, memory) are ``sim.output.summary``.
"""

from __future__ import annotations

import json
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.workload.ir import TaskGraph

TRACE_COLUMNS: dict[str, str] = {
    "task": "int64", "rank": "int32", "stage": "int32", "stream": "object", "kind": "object", "name": "object",
    "microbatch": "int32", "layer": "int32", "start_s": "float64", "end_s": "float64", "bytes": "int64",
    "flops": "float64",
}


def to_frame(graph: TaskGraph, start: list[float], end: list[float]) -> pd.DataFrame:
    tasks = graph.tasks
    n = len(tasks)
    fields = ("rank", "stage", "stream", "kind", "name", "microbatch", "layer", "nbytes", "flops")
    # One C-level pass over the tasks, then typed arrays: letting pandas infer 10^5-row lists of objects costs
    # more than building the tasks did.
    values = dict(zip(fields, zip(*map(attrgetter(*fields), tasks), strict=True), strict=True)) if n \
        else {f: () for f in fields}

    def column(name: str, dtype: str) -> np.ndarray:
        return np.array(values[name], dtype=object) if dtype == "object" else np.fromiter(values[name], dtype, n)

    def names(name: str) -> np.ndarray:
        """A column of exact ``str``: a task may carry a ``Stream``/``Kind`` member (equal to its string), and the
        trace must not depend on that class (YAML cannot write it; a pickled frame would import it). A member and
        its string are equal keys, so both map to the plain string: one dict lookup per row, half the cost of
        ``str()`` per row."""
        plain = {value: str(value) for value in set(values[name])}
        return np.array(list(map(plain.__getitem__, values[name])), dtype=object)

    frame = pd.DataFrame({
        "task": np.arange(n, dtype="int64"), "rank": column("rank", "int32"), "stage": column("stage", "int32"),
        "stream": names("stream"), "kind": names("kind"), "name": column("name", "object"),
        "microbatch": column("microbatch", "int32"), "layer": column("layer", "int32"),
        "start_s": np.asarray(start, dtype="float64"), "end_s": np.asarray(end, dtype="float64"),
        "bytes": np.rint(np.fromiter(values["nbytes"], "float64", n)).astype("int64"),
        "flops": column("flops", "float64"),
    }, copy=False)
    return frame.astype(TRACE_COLUMNS)


# -------------------------------------------------------------------------------------------------- writers


def write_trace(trace: pd.DataFrame, path: Path) -> None:
    if path.suffix == ".csv":
        trace.to_csv(path, index=False, float_format="%.12g")
    else:
        trace.to_parquet(path, index=False, engine="pyarrow", compression="zstd")


def read_trace(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
    return frame.astype(TRACE_COLUMNS)


def chrome_trace(trace: pd.DataFrame, link_segments: pd.DataFrame | None = None) -> dict[str, Any]:
    """Chrome/Perfetto trace events: one process per rank, one thread per stream, times in microseconds; with
    link segments (contention network), a "links" process with one load counter (fraction of capacity) per link."""
    events: list[dict[str, Any]] = []
    if link_segments is not None and len(link_segments):
        links_pid = int(trace["rank"].max()) + 1
        events.append({"ph": "M", "name": "process_name", "pid": links_pid, "args": {"name": "links"}})
        for row in link_segments.itertuples(index=False):
            name = f"{row.src}->{row.dst}"
            events.append({"ph": "C", "pid": links_pid, "name": name, "ts": row.start_s * 1e6,
                           "args": {"load": round(float(row.load_fraction), 6)}})
            events.append({"ph": "C", "pid": links_pid, "name": name, "ts": row.end_s * 1e6, "args": {"load": 0}})
    for rank in sorted(trace["rank"].unique()):
        events.append({"ph": "M", "name": "process_name", "pid": int(rank), "args": {"name": f"rank {rank}"}})
    for row in trace.itertuples(index=False):
        args = {"task": row.task, "microbatch": row.microbatch, "layer": row.layer}
        if row.bytes:
            args["bytes"] = row.bytes
        label = row.name if row.microbatch < 0 else f"{row.name} mb{row.microbatch}"
        events.append({"ph": "X", "pid": int(row.rank), "tid": row.stream, "name": label, "cat": row.kind,
                       "ts": row.start_s * 1e6, "dur": (row.end_s - row.start_s) * 1e6, "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(trace: pd.DataFrame, path: Path, link_segments: pd.DataFrame | None = None) -> None:
    path.write_text(json.dumps(chrome_trace(trace, link_segments), default=int))
