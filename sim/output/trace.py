"""The output contract: one row per executed task, and the summary computed from it.

In: the ``TaskGraph`` and the engine's start/end times (``to_frame``); a trace DataFrame and its Scenario
(``summarize``). Out: a pandas DataFrame with fixed columns and dtypes (``TRACE_COLUMNS``), Parquet/CSV and
Chrome/Perfetto JSON writers, and a ``Summary`` dict: step time, tokens/s, TFLOP/s per GPU, MFU/HFU, bubble
fraction, exposed communication per kind, peak memory per rank and whether it fits.

Definitions. MFU uses model FLOPs without recomputation (Korthikanti et al. 2022 eq. 7); HFU the FLOPs the
trace executed. Bubble fraction of a rank = 1 - (time its compute stream or blocking TP collectives are busy)
/ (time until the last forward/backward of the step ends), averaged over simulated ranks; with fixed costs
and an ideal network it is (p-1)/(m+p-1). Exposed communication of a kind = time that kind's collectives run
while the rank's compute stream is idle (worst rank reported).
"""

from __future__ import annotations

import json
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sim.model.memory import peak_usage, with_allocator
from sim.model.transformer import model_flops_per_step
from sim.plan import Plan
from sim.workload.ir import COMM_KINDS, COMPUTE_KINDS, Kind, Stream, TaskGraph
from sim.workload.memory_plan import states_and_buffers

if TYPE_CHECKING:
    pass

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
    values = dict(zip(fields, zip(*map(attrgetter(*fields), tasks)))) if n else {f: () for f in fields}

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


# ------------------------------------------------------------------------------------------------ intervals


def _merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted disjoint (starts, ends)."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], np.maximum.accumulate(ends[order])
    new = np.concatenate([[True], starts[1:] > ends[:-1]])
    group_end = np.concatenate([np.flatnonzero(new)[1:] - 1, [len(starts) - 1]])
    return starts[new], ends[group_end]


def _covered(points: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Length of the merged intervals (starts, ends) lying before each point."""
    if len(starts) == 0:
        return np.zeros_like(points)
    before = np.concatenate([[0.0], np.cumsum(ends - starts)])
    idx = np.searchsorted(starts, points, side="right") - 1
    safe = np.clip(idx, 0, None)
    partial = np.clip(np.minimum(points, ends[safe]) - starts[safe], 0, None)
    return np.where(idx >= 0, before[safe] + partial, 0.0)


def _exposed(comm: pd.DataFrame, compute_union: tuple[np.ndarray, np.ndarray]) -> float:
    starts, ends = _merge(comm["start_s"].to_numpy(), comm["end_s"].to_numpy())
    total = float(np.sum(ends - starts))
    hidden = _covered(ends, *compute_union) - _covered(starts, *compute_union)
    return total - float(np.sum(hidden))


# -------------------------------------------------------------------------------------------------- summary


def _unit_spans(trace: pd.DataFrame, unit_layers: int) -> pd.DataFrame:
    """First start and last end of each (rank, micro-batch, phase, FSDP unit)'s compute."""
    layered = trace[(trace["layer"] >= 0) & trace["kind"].isin(COMPUTE_KINDS)]
    phase = np.where(layered["kind"] == "forward", "fwd", "bwd")
    return layered.assign(phase=phase, unit=layered["layer"] // unit_layers).groupby(
        ["rank", "microbatch", "phase", "unit"]).agg(first=("start_s", "min"), last=("end_s", "max"))


def _memory(trace: pd.DataFrame, plan: Plan) -> dict[int, dict[str, float]]:
    """Per simulated rank: sharded model states, plus the peak of activations, gathered weights (ZeRO-3/FSDP)
    and not-yet-reduced gradients (ZeRO-2/3) over the step, each taken from when the trace allocates and
    frees them."""
    # Per layer, the bytes it stashes (the plan's partial-recompute rule), and the layer being rebuilt.
    stash_bytes = np.array([plan.stash_bytes(layer) for layer in range(plan.model.num_layers)])
    # A layer's activations are stashed at the end of its forward and freed by its last backward pass (the
    # weight-gradient pass W when the schedule splits the backward).
    layered = trace[(trace["layer"] >= 0) & trace["kind"].isin(("forward", "backward", "weight"))]
    layered = layered.assign(kind=layered["kind"].replace({"weight": "backward"}))
    ends = layered.groupby(["rank", "kind", "microbatch", "layer"])["end_s"].max()
    spans = _unit_spans(trace, plan.unit_layers) if plan.zero_stage >= 2 else None
    result: dict[int, dict[str, float]] = {}
    for rank, stage in trace.groupby("rank")["stage"].first().items():
        rows = trace[trace["rank"] == rank]
        resident, host = states_and_buffers(plan, int(stage))
        stash = ends.loc[(rank, "forward")]
        free = ends.loc[(rank, "backward")].to_numpy()
        sizes = stash_bytes[stash.index.get_level_values("layer").to_numpy()]
        parts = {"activations": (stash.to_numpy(), free, sizes)}
        if spans is not None:
            parts |= _gather_and_grad_buffers(rows, spans.loc[rank], plan)
        dynamic = peak_usage(parts)
        dynamic["activations"] += plan.rebuild_bytes
        entry = resident | {name: value for name, value in dynamic.items() if name != "total"}
        memory = plan.scenario.memory
        result[int(rank)] = with_allocator(entry, memory.reserved, memory.allocator_overhead) | {"host": host}
    return result


def _gather_and_grad_buffers(rows: pd.DataFrame, spans: pd.DataFrame,
                             plan: Plan) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Gathered weights live from their all-gather's start until the unit's compute in that phase ends (until
    its backward for SHARD_GRAD_OP's forward gather); a unit's full gradients from the start of its backward
    until their reduce-scatter ends (DeepSpeed ZeRO-2: until its backward ends, see below)."""
    def span(mb: pd.Series, phase: str | pd.Series, unit: pd.Series) -> pd.DataFrame:
        keys = pd.MultiIndex.from_arrays([mb, pd.Series(phase, index=mb.index) if isinstance(phase, str) else phase,
                                          unit])
        return spans.reindex(keys)

    unit_layers = plan.unit_layers
    gathers = rows[rows["name"].isin(("param_gather_fwd", "param_gather_bwd"))]
    unit = gathers["layer"] // unit_layers
    keep_to_backward = plan.zero_stage < 3
    phase = pd.Series(np.where((gathers["name"] == "param_gather_bwd") | keep_to_backward, "bwd", "fwd"),
                      index=gathers.index)
    gathered = (gathers["start_s"].to_numpy(), span(gathers["microbatch"], phase, unit)["last"].to_numpy(),
                gathers["bytes"].to_numpy(float))
    reduces = rows[rows["name"] == "grad_reduce_scatter"]
    backward = span(reduces["microbatch"], "bwd", reduces["layer"] // unit_layers)
    freed = reduces["end_s"].to_numpy()
    if plan.zero_stage == 2 and not plan.flat_params:
        # DeepSpeed ZeRO-2 (contiguous_gradients): a gradient is copied into one of the two reduction buckets,
        # counted as comm_buffers, as soon as its layer's backward produces it, and autograd's copy is freed
        # (stage_1_and_2.py, reduce_independent_p_g_buckets_and_remove_grads). However far the reduce-scatters
        # lag, fresh gradients do not pile up.
        freed = np.minimum(freed, backward["last"].to_numpy())
    grads = (backward["first"].to_numpy(), freed, reduces["bytes"].to_numpy(float))
    return {"gathered_weights": gathered, "unreduced_gradients": grads}


def stagewise_bubble_rate(trace: pd.DataFrame) -> float:
    """Qi et al. ICLR 2024 Sec. 5.3: (cost - busy) / cost with cost the longest stage's span from its first
    to its last compute task, and busy that stage's compute time (the skew between stages' starts is not a
    bubble there: their optimizer step does not synchronize the stages)."""
    compute = trace[trace["kind"].isin(COMPUTE_KINDS)]
    spans = compute.groupby("rank").agg(first=("start_s", "min"), last=("end_s", "max"))
    cost = float((spans["last"] - spans["first"]).max())
    busy = float((compute["end_s"] - compute["start_s"]).groupby(compute["rank"]).sum().max())
    return max(0.0, (cost - busy) / cost) if cost > 0 else 0.0  # clamp float noise of a zero bubble


def summarize(trace: pd.DataFrame, plan: Plan) -> dict[str, Any]:
    step = float(trace["end_s"].max())
    compute = trace[trace["kind"].isin(COMPUTE_KINDS)]
    pipeline_end = float(compute["end_s"].max())
    bubbles, exposed = [], {kind: 0.0 for kind in COMM_KINDS}
    for _, rows in trace.groupby("rank"):
        compute_rows = rows[rows["stream"] == Stream.COMPUTE]
        union = _merge(compute_rows["start_s"].to_numpy(), compute_rows["end_s"].to_numpy())
        busy_rows = rows[rows["kind"].isin((*COMPUTE_KINDS, Kind.TP))]
        busy_ends = np.minimum(busy_rows["end_s"].to_numpy(), pipeline_end)
        busy_starts, busy_ends = _merge(busy_rows["start_s"].to_numpy(), busy_ends)
        busy = float(np.sum(busy_ends - busy_starts))
        bubbles.append(1.0 - busy / pipeline_end if pipeline_end > 0 else 0.0)
        for kind in COMM_KINDS:
            exposed[kind] = max(exposed[kind], _exposed(rows[rows["kind"] == kind], union))

    scenario = plan.scenario
    gpus = plan.num_gpus
    peak = scenario.cluster.gpu.peak(plan.dtype)
    model_flops = model_flops_per_step(plan.model, plan.global_batch, plan.seq_len)
    # Each simulated rank stands for its tp*dp replicas: executed FLOPs per GPU = mean over simulated ranks.
    hardware_flops_per_gpu = float(trace.groupby("rank")["flops"].sum().mean())
    tflops = model_flops / gpus / step / 1e12 if step > 0 else 0.0
    memory = _memory(trace, plan)
    peak_memory = max(m["total"] for m in memory.values())
    tokens = plan.global_batch * plan.seq_len
    return {
        "scenario": scenario.name,
        "seed": scenario.seed,
        "num_gpus": gpus,
        "layout": {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "sequence_parallel": plan.sequence_parallel},
        "schedule": scenario.schedule,
        "microbatches": plan.microbatches,
        "step_time_s": step,
        "tokens_per_s": tokens / step if step > 0 else 0.0,
        "model_flops_per_step": model_flops,
        "tflops_per_gpu": tflops,
        "mfu": tflops * 1e12 / peak,
        "hardware_tflops_per_gpu": hardware_flops_per_gpu / step / 1e12 if step > 0 else 0.0,
        "hfu": hardware_flops_per_gpu / step / peak if step > 0 else 0.0,
        "bubble_fraction": float(np.mean(bubbles)),
        "bubble_rate_stagewise": stagewise_bubble_rate(trace),
        "exposed_comm_s": exposed,
        "peak_memory_bytes": {"max": peak_memory, "per_rank": {str(r): m["total"] for r, m in memory.items()}},
        "memory_breakdown_bytes": {str(r): m for r, m in memory.items()},
        "host_memory_bytes": max(m["host"] for m in memory.values()),  # CPU offload, per rank
        "hbm_capacity_bytes": scenario.cluster.gpu.hbm_capacity,
        "fits_in_memory": bool(peak_memory <= scenario.cluster.gpu.hbm_capacity),
        "tasks": int(len(trace)),
    }


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
