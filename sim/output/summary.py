"""The summary of a run: the headline numbers of one simulated step, computed from its trace.

In: a trace DataFrame (``sim.output.trace`` schema) and its ``Plan`` (``summarize``); the memory timeline comes
from ``sim.workload.footprint.memory_timeline``. Out: a ``Summary``, a
frozen dataclass: step time, tokens/s, TFLOP/s per GPU, MFU/HFU, bubble and host-bound fractions, exposed
communication per kind, peak memory per rank and whether it fits; the runner adds the optional fields (NCCL's SM
stretch; the critical rank and path with ``ranks: all``; the busiest and the critical link on the ``contention``
network).
``Summary.to_dict()`` is the ``summary.json`` a run directory holds (``Summary.to_json()`` its text, finite numbers
only): ``schema_version`` first, then every field in
every mode (an optional figure that does not apply is null), and ``Summary.from_dict`` reads it back;
``json_schema()`` is its JSON Schema (docs/summary.schema.json, described in docs/summary.md).

Definitions. MFU uses model FLOPs without recomputation (Korthikanti et al. 2022 eq. 7); HFU the FLOPs the
trace executed, each task's ``flops`` being what its kernels' time was priced on (``Op.executed_flops``: a causal
flash kernel's executed tiles, not MFU's full matrix), so HFU <= 1 and may be below MFU. Bubble fraction of a
rank = 1 - (time its compute stream or blocking TP collectives are busy + its host-bound time) / (time until the
last forward/backward of the step ends, ``pipeline_end``), averaged over simulated ranks; with fixed costs and an
ideal network it is (p-1)/(m+p-1). Host-bound fraction of a rank = its host-bound time / ``pipeline_end``,
averaged alike: the host-bound time is the compute stream's idle after a MoE layer pass's device work until the
host has issued the pass (behind the token dispatcher's host sync, sim.costs.host; ``host_bound_seconds`` says
exactly which idle), so it is idle time the bubble fraction counted before (schema version 1) and the two add
up to that figure; 0 without a host sync.
Exposed communication of a kind = time that kind's collectives run while the rank's compute stream is idle (worst
rank reported).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import pandas as pd
import pydantic

from sim.errors import SimError
from sim.model.flops import logits_forward_flops
from sim.model.params import active_params, total_params
from sim.output.planning import Planning, planning
from sim.plan import Plan
from sim.workload.footprint import memory_timeline
from sim.workload.ir import COMM_KINDS, COMPUTE_KINDS, CP_COMM_KINDS, MOE_COMM_KINDS, Kind, Stream

# summary.json's schema version: bump it when a key is renamed or removed or its meaning changes (adding a key
# keeps the version: readers ignore keys they do not know). docs/summary.md lists the keys.
# Version 2: ``bubble_fraction`` no longer counts the compute stream's wait for the host (now
# ``host_bound_fraction``), and ``critical_path_s`` holds the host's seconds as ``host``, no longer as
# ``comm_by_kind["host"]``.
SCHEMA_VERSION = 2


def non_finite(value: Any, path: str = "") -> tuple[str, float] | None:
    """The dotted path and value of the first float in ``value`` (dicts and lists, walked in order) that is NaN or
    infinite; None if there is none."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = non_finite(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


@dataclass(frozen=True)
class Layout:
    """The parallel layout the step ran with (degrees of tensor, pipeline and data parallelism)."""

    tp: int
    pp: int
    dp: int
    sequence_parallel: bool
    cp: int = 1  # context parallelism (tp x cp x pp x dp = the GPUs)
    ep: int = 1  # expert parallelism (folded over tp x cp x dp)


@dataclass(frozen=True)
class PeakMemory:
    """Peak bytes per GPU over the step: the largest simulated rank's (``max``) and each rank's, keyed by the
    rank as a string (as in summary.json)."""

    max: float
    per_rank: dict[str, float]


@dataclass(frozen=True)
class CriticalPathSeconds:
    """Seconds the step's critical path spends computing on each rank, communicating per kind (tp, pp, dp, ep, cp,
    ...) and on the host issuing MoE layer passes behind the dispatcher's host sync (``host``; sim.costs.host),
    which is neither; the three sum to the step time."""

    compute_by_rank: dict[str, float]
    comm_by_kind: dict[str, float]
    host: float


@dataclass(frozen=True)
class BusyLink:
    """A link of the ``contention`` network: "src->dst", its tier, the fraction of the step's capacity it
    carried, and the seconds it was saturated."""

    link: str
    tier: str
    utilization: float
    saturated_s: float


@dataclass(frozen=True)
class SaturatedLink:
    """The link saturated longest (the one that throttled transfers most)."""

    link: str
    tier: str
    saturated_s: float


@dataclass(frozen=True)
class Summary:
    """The headline numbers of one step (the fields and units of summary.json; times in seconds, memory in bytes,
    per-rank maps keyed by the rank as a string). The fields after ``tasks`` are optional: None when the run
    did not compute them (null in ``to_dict()``)."""

    scenario: str
    seed: int
    num_gpus: int
    layout: Layout
    schedule: str
    microbatches: int
    step_time_s: float
    tokens_per_s: float
    model_flops_per_step: float
    parameters_total: int  # the model's parameters (sim.model.params.total_params)
    parameters_active: int | None  # MoE: parameters a token passes through (active_params); None for a dense model
    tflops_per_gpu: float
    mfu: float
    mfu_causal: float | None  # MFU with causal attention counted over s(s+1)/2 pairs (Plan.causal_model_flops_per_step)
    hardware_tflops_per_gpu: float
    hfu: float
    bubble_fraction: float
    bubble_rate_stagewise: float
    host_bound_fraction: float  # compute idle waiting for the host to issue a MoE layer pass (host_bound_seconds)
    exposed_comm_s: dict[str, float]  # kind (tp, pp, dp; ep: MoE; cp: cp > 1) -> seconds, worst rank
    peak_memory_bytes: PeakMemory
    memory_breakdown_bytes: dict[str, dict[str, float]]  # rank -> part (weights, activations, ..., total) -> bytes
    host_memory_bytes: float  # CPU offload, per rank
    hbm_capacity_bytes: float
    fits_in_memory: bool
    planning: Planning  # time-to-train, GPU-hours, energy and cost of a token budget (sim.output.planning)
    tasks: int
    # Added by the runner (sim.runner.run):
    nccl_sm_stretch_s: float | None = None  # network.nccl_sms: compute time NCCL's SMs added on the worst rank
    critical_rank: int | None = None  # ranks: all
    critical_path_s: CriticalPathSeconds | None = None  # ranks: all
    collective_wait_s: dict[str, float] | None = None  # ranks: all; rank -> seconds waiting for the last member
    busiest_links: list[BusyLink] | None = None  # contention network
    critical_link: SaturatedLink | None = None  # contention network; None there too when no link saturated

    def to_dict(self) -> dict[str, Any]:
        """summary.json: ``schema_version``, then every field in field order as plain dicts and lists, the
        optional ones null where the run did not compute them: the same key set in every mode."""
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}

    def to_json(self) -> str:
        """summary.json's text: ``to_dict()`` as indented JSON with sorted keys. NaN and infinity are not JSON
        (RFC 8259 Sec. 6; Python's ``json`` would write ``NaN`` / ``Infinity``, which strict readers refuse), so a
        value that is not a finite number is a ``SimError`` naming its field, never an invalid file. The runner's
        ``check_physical`` refuses an impossible step first; this is the writer's own guard."""
        data = self.to_dict()
        where = non_finite(data)
        if where is not None:
            field, value = where
            raise SimError(f"summary.{field}: {value} is not a finite number, which summary.json cannot hold (a "
                           f"simulator bug; please report the scenario)")
        return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Summary:
        """The inverse of ``to_dict`` (e.g. a run directory's summary.json). Unknown keys raise TypeError, and so
        does a ``schema_version`` other than this module's (a file without one is read as version 1)."""
        values = dict(data)
        version = values.pop("schema_version", 1)
        if version != SCHEMA_VERSION:
            raise TypeError(f"summary.json: schema_version {version} is not {SCHEMA_VERSION}, the one this "
                            "version of clustersim reads")
        values["layout"] = Layout(**values["layout"])
        values["peak_memory_bytes"] = PeakMemory(**values["peak_memory_bytes"])
        values["planning"] = Planning(**values["planning"])
        if values.get("critical_path_s") is not None:
            values["critical_path_s"] = CriticalPathSeconds(**values["critical_path_s"])
        if values.get("busiest_links") is not None:
            values["busiest_links"] = [BusyLink(**link) for link in values["busiest_links"]]
        if values.get("critical_link") is not None:
            values["critical_link"] = SaturatedLink(**values["critical_link"])
        return cls(**values)


OPTIONAL_FIELDS = frozenset(f.name for f in fields(Summary) if f.default is None)


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of summary.json, generated from ``Summary`` by pydantic, with
    ``schema_version`` added as a required constant and every key required (optional figures may be null)."""
    schema = pydantic.TypeAdapter(Summary).json_schema(mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "clustersim summary.json"
    schema["properties"] = {"schema_version": {"const": SCHEMA_VERSION, "type": "integer"}, **schema["properties"]}
    schema["required"] = list(schema["properties"])
    schema["additionalProperties"] = False
    return schema


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


def _covered(points: np.ndarray, starts: np.ndarray, ends: np.ndarray, before: np.ndarray | None = None
             ) -> np.ndarray:
    """Length of the merged intervals (starts, ends) lying before each point; ``before``: their lengths' prefix
    sums (``_prefix``) where the caller keeps them for several calls."""
    if len(starts) == 0:
        return np.zeros_like(points)
    if before is None:
        before = _prefix(starts, ends)
    idx = np.searchsorted(starts, points, side="right") - 1
    safe = np.clip(idx, 0, None)
    partial = np.clip(np.minimum(points, ends[safe]) - starts[safe], 0, None)
    return np.where(idx >= 0, before[safe] + partial, 0.0)


def _exposed(comm: pd.DataFrame, compute_union: tuple[np.ndarray, np.ndarray]) -> float:
    return _exposed_seconds(comm["start_s"].to_numpy(), comm["end_s"].to_numpy(), compute_union)


def _prefix(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The covered length before each merged interval (starts, ends), and their total last: ``_covered``'s table."""
    return np.concatenate([[0.0], np.cumsum(ends - starts)])


def _exposed_seconds(comm_starts: np.ndarray, comm_ends: np.ndarray,
                     compute_union: tuple[np.ndarray, np.ndarray], before: np.ndarray | None = None) -> float:
    """Seconds of the intervals (comm_starts, comm_ends) outside the merged ``compute_union`` (``before``: its
    ``_prefix``, kept by a caller that asks for several kinds against one union)."""
    starts, ends = _merge(comm_starts, comm_ends)
    count = len(starts)
    if not count:  # nothing to expose: what the lines below give, 0.0 - 0.0, without their numpy calls
        return 0.0
    total = float(np.sum(ends - starts))
    # The ends' and the starts' covered lengths in one call: each element as in two calls, the same subtraction.
    covered = _covered(np.concatenate([ends, starts]), *compute_union, before)
    hidden = covered[:count] - covered[count:]
    return total - float(np.sum(hidden))


def exposed_intervals(comm_starts: np.ndarray, comm_ends: np.ndarray, compute_starts: np.ndarray,
                      compute_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where one rank's communication runs while its compute stream is idle (the rule the summary's
    ``exposed_comm_s`` sums, as intervals for a chart): the union of the comm intervals minus the union of the
    compute intervals, as sorted disjoint (starts, ends). Their total length is ``_exposed`` of the same rows."""
    a_s, a_e = _merge(np.asarray(comm_starts, float), np.asarray(comm_ends, float))
    b_s, b_e = _merge(np.asarray(compute_starts, float), np.asarray(compute_ends, float))
    # the gaps between compute intervals, then each comm interval cut by the gaps that overlap it
    g_s = np.concatenate([[-np.inf], b_e])
    g_e = np.concatenate([b_s, [np.inf]])
    first = np.searchsorted(g_e, a_s, side="right")
    last = np.searchsorted(g_s, a_e, side="left")
    count = np.maximum(last - first, 0)
    which = np.repeat(np.arange(len(a_s)), count)
    gap = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count) + np.repeat(first, count)
    starts, ends = np.maximum(a_s[which], g_s[gap]), np.minimum(a_e[which], g_e[gap])
    keep = ends > starts
    return starts[keep], ends[keep]


# -------------------------------------------------------------------------------------------------- summary


def rank_rows(trace: pd.DataFrame) -> list[np.ndarray]:
    """Each simulated rank's row positions in ``trace``, ranks ascending (``groupby("rank")``'s order), each
    rank's rows in trace order."""
    return rank_positions(trace["rank"].to_numpy())


def rank_positions(rank: np.ndarray) -> list[np.ndarray]:
    """``rank_rows`` of a column of ranks (one per task, in task order)."""
    order = np.argsort(rank, kind="stable")
    bounds = np.flatnonzero(np.diff(rank[order])) + 1
    return np.split(order, bounds) if len(order) else []


def stagewise_bubble_rate(trace: pd.DataFrame, host_bound_s: Sequence[float] | None = None) -> float:
    """Qi et al. ICLR 2024 Sec. 5.3: (cost - busy) / cost with cost the longest stage's span from its first
    to its last compute task, and busy that stage's compute time (the skew between stages' starts is not a
    bubble there: their optimizer step does not synchronize the stages). ``host_bound_s``: each rank's host-bound
    seconds (``PerRank.host_bound_s``, rank order), counted with its compute time as not a bubble; they lie inside
    the rank's span and outside its compute tasks (``host_bound_seconds``)."""
    compute = trace[trace["kind"].isin(COMPUTE_KINDS)]
    return stagewise_bubble(compute["rank"].to_numpy(), compute["start_s"].to_numpy(), compute["end_s"].to_numpy(),
                            host_bound_s)


def stagewise_bubble(rank: np.ndarray, start: np.ndarray, end: np.ndarray,
                     host_bound_s: Sequence[float] | None = None) -> float:
    """``stagewise_bubble_rate`` of the compute tasks given as columns (rank, start, end; in trace order). Each
    rank's first start and last end in numpy (exact); the busy seconds summed by pandas' grouped sum, whose
    compensated summation the summary has always used, plus the rank's host-bound seconds where any rank has
    some (``host_bound_s``, in the grouped sum's ascending rank order)."""
    if not len(rank):
        return 0.0
    order = np.argsort(rank, kind="stable")
    firsts = np.flatnonzero(np.r_[True, np.diff(rank[order]) != 0])
    cost = float(np.max(np.fmax.reduceat(end[order], firsts) - np.fmin.reduceat(start[order], firsts)))
    per_rank_busy = pd.Series(end - start).groupby(rank).sum()
    if host_bound_s is not None and any(host_bound_s):
        if len(host_bound_s) != len(per_rank_busy):  # every simulated rank runs compute tasks
            raise AssertionError(f"host-bound seconds of {len(host_bound_s)} ranks, compute on {len(per_rank_busy)}")
        per_rank_busy = per_rank_busy + np.asarray(host_bound_s, dtype=np.float64)
    busy = float(per_rank_busy.max())
    return max(0.0, (cost - busy) / cost) if cost > 0 else 0.0  # clamp float noise of a zero bubble


@dataclass(frozen=True)
class Rates:
    """A step's throughput figures (``rates``): model FLOPs (the fixed-cost head rule applied), tokens/s,
    TFLOP/s per GPU, MFU, the causal-attention MFU (None where the plan has none), executed TFLOP/s per GPU, HFU."""

    model_flops: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    mfu_causal: float | None
    hardware_tflops_per_gpu: float
    hfu: float


def rates(plan: Plan, step: float, hardware_flops_per_gpu: float) -> Rates:
    """The throughput figures of a step of ``step`` seconds that executed ``hardware_flops_per_gpu`` FLOPs per GPU
    (the mean over simulated ranks of their tasks' FLOPs)."""
    scenario = plan.scenario
    gpus = plan.num_gpus
    peak = scenario.cluster.gpu.peak(plan.dtype)
    model_flops = plan.model_flops_per_step  # the documents' FLOPs: fine-tuning methods, padding, packing
    if scenario.costs.model == "fixed":
        # Fixed costs time the transformer layers only: the embedding and the LM head take no time and emit no
        # task. Their logits FLOPs leave MFU's numerator too, or MFU would count work no task ran and exceed HFU
        # (pipeline-4x8: MFU 2.83% against HFU 2.21%, issue 27).
        head_passes = 3.0 if not plan.peft.active or plan.peft.head_trainable else 2.0
        model_flops -= head_passes * plan.global_batch * logits_forward_flops(plan.model, 1, plan.seq_len)
    tflops = model_flops / gpus / step / 1e12 if step > 0 else 0.0
    causal = plan.causal_model_flops_per_step
    if causal is not None:  # the same step's FLOPs with attention's causal half (and the fixed-cost head rule)
        causal -= plan.model_flops_per_step - model_flops
    tokens = plan.model_tokens_per_step  # document tokens: padding does not count
    return Rates(model_flops=model_flops, tokens_per_s=tokens / step if step > 0 else 0.0, tflops_per_gpu=tflops,
                 mfu=tflops * 1e12 / peak,
                 mfu_causal=causal / gpus / step / peak if causal is not None and step > 0 else None,
                 hardware_tflops_per_gpu=hardware_flops_per_gpu / step / 1e12 if step > 0 else 0.0,
                 hfu=hardware_flops_per_gpu / step / peak if step > 0 else 0.0)


def exposed_kinds(plan: Plan) -> tuple[Kind, ...]:
    """The kinds whose exposed seconds a summary reports: tp, pp, dp; a MoE model's dispatch/combine (``ep``)
    beside them and ``cp`` with context parallelism (a dense model's summary keeps its keys)."""
    kinds = COMM_KINDS + MOE_COMM_KINDS if plan.is_moe else COMM_KINDS
    return kinds + (CP_COMM_KINDS if plan.cp > 1 else ())


@dataclass(frozen=True)
class PerRank:
    """``per_rank``'s figures: each simulated rank's bubble fraction, host-bound fraction and share of the step
    its compute stream is busy (rank order), and each reported kind's exposed seconds on the worst rank."""

    bubbles: list[float]
    busy_compute: list[float]
    exposed: dict[str, float]
    host_bound_s: list[float]  # seconds (host_bound_seconds)
    host_bound: list[float]  # fraction of the time until the last forward/backward ends


def host_bound_seconds(issue_ends: np.ndarray, issue_starts: np.ndarray, compute: tuple[np.ndarray, np.ndarray],
                       compute_starts: np.ndarray, busy: tuple[np.ndarray, np.ndarray], pipeline_end: float) -> float:
    """Seconds one rank's compute stream idles waiting for the host to finish issuing a MoE layer pass (behind the
    dispatcher's host sync, ``moe_host_issue`` tasks on the ``host`` stream; sim.costs.host).

    In: the rank's host-issue tasks' ends and starts; ``compute``, the merged intervals (``_merge``) of its
    compute stream's tasks, and ``compute_starts`` their tasks' starts, sorted; ``busy``, the merged intervals the
    bubble counts as busy (compute passes and blocking TP collectives, cut at ``pipeline_end``); the end of the
    step's last forward/backward. A MoE pass ends with
    a zero-length ``moe_host_wait`` on the compute stream after the pass's last task, its own stream predecessor
    and the issue (sim.workload.build ``_moe_host``); the engines start a task at the max of its dependencies'
    ends (the same float), so where the issue ended last, a compute-stream task starts exactly at the issue's end
    ``e``, and the compute stream was idle before it. That idle, from the end of the compute stream's last task
    before ``e`` (no earlier than the issue's start) to ``e``, is the host-bound gap: the compute stream's next
    task waited for nothing but the host. Out: the length of the union of the gaps less what the bubble counts as
    busy in them (a TP collective still running), within [0, pipeline_end]; for a pass issued from its first
    task's start it is max(0, host - device), the part of max(device, host) the host adds
    (docs/mechanisms/moe_host_sync.md). So it lies outside the bubble's busy set, and the summary moves it out of
    ``bubble_fraction`` into ``host_bound_fraction``, which sum to the bubble as it was; an exchange (ep, cp, pp,
    dp) running in a gap does not make it a bubble, since the compute stream waits for the host, not for it."""
    if not len(issue_ends) or not len(compute_starts):
        return 0.0
    ends = np.minimum(issue_ends, pipeline_end)
    first = np.searchsorted(compute_starts, ends, side="left")  # the compute stream's first task starting at >= e
    resumed = compute_starts[np.clip(first, 0, len(compute_starts) - 1)] == ends
    c_starts, c_ends = compute
    last = np.searchsorted(c_starts, ends, side="left") - 1  # the compute stream's last interval starting before e
    gap_start = np.where(last >= 0, c_ends[np.clip(last, 0, None)], -np.inf) if len(c_starts) else \
        np.full(len(ends), -np.inf)
    bound = resumed & (gap_start < ends)  # idle before e (an interval ending at e or later covers it: not idle)
    if not bound.any():
        return 0.0
    starts = np.maximum(np.maximum(gap_start, issue_starts), 0.0)[bound]
    return _exposed_seconds(starts, ends[bound], busy)


def per_rank(positions: list[np.ndarray], starts_all: np.ndarray, ends_all: np.ndarray, kind_codes: np.ndarray,
             kind_names: Sequence[str], on_compute_stream: np.ndarray, kinds: tuple[Kind, ...], step: float,
             pipeline_end: float) -> PerRank:
    """The per-rank figures of a step's tasks, given as columns (start, end, kind code with ``kind_names`` its
    kinds, whether on the compute stream) and each rank's positions in them (``rank_positions``): the summary's
    and a sweep's confirmation's (sim.explore.confirm) one rule. Per rank in rank order (groupby's), each rank's
    rows in trace order, as numpy arrays: the same intervals in the same order as filtering the frame per rank
    and kind (bit-identical sums), without copying every column per filter (pandas' take was most of this loop:
    0.13 of 0.20 CPU s on 175B)."""
    bubbles: list[float] = []
    busy_compute: list[float] = []
    host_bound_s: list[float] = []
    host_bound: list[float] = []
    exposed: dict[str, float] = {str(kind): 0.0 for kind in kinds}
    busy_kind = np.isin(kind_codes, [i for i, name in enumerate(kind_names) if name in (*COMPUTE_KINDS, Kind.TP)])
    # The host's issue tasks of MoE layer passes (sim.costs.host), where there are any (none: no host-bound time).
    host_codes = [i for i, name in enumerate(kind_names) if name == Kind.HOST]
    is_host = np.isin(kind_codes, host_codes) if host_codes else None
    # Each reported kind's rows, once over all tasks (per rank below, a take of it: the same rows as isin per rank)
    of_kinds = {str(kind): np.isin(kind_codes, [i for i, name in enumerate(kind_names) if name == kind])
                for kind in kinds}
    for rows in positions:
        starts, ends = starts_all[rows], ends_all[rows]
        compute_rows = on_compute_stream[rows]
        union = _merge(starts[compute_rows], ends[compute_rows])
        before = _prefix(*union) if len(union[0]) else None  # read by each kind's exposed seconds below
        busy_compute.append(float(np.sum(union[1] - union[0])) / step if step > 0 else 0.0)
        busy_rows = busy_kind[rows]
        busy_ends = np.minimum(ends[busy_rows], pipeline_end)
        busy_starts, busy_ends = _merge(starts[busy_rows], busy_ends)
        busy = float(np.sum(busy_ends - busy_starts))
        waiting = 0.0
        if is_host is not None:
            issues = is_host[rows]
            waiting = host_bound_seconds(ends[issues], starts[issues], union, np.sort(starts[compute_rows]),
                                         (busy_starts, busy_ends), pipeline_end)
        host_bound_s.append(waiting)
        host_bound.append(waiting / pipeline_end if pipeline_end > 0 else 0.0)
        bubbles.append(1.0 - (busy + waiting) / pipeline_end if pipeline_end > 0 else 0.0)
        for kind, of_all in of_kinds.items():
            of_kind = of_all[rows]
            exposed[kind] = max(exposed[kind], _exposed_seconds(starts[of_kind], ends[of_kind], union, before))
    return PerRank(bubbles, busy_compute, exposed, host_bound_s, host_bound)


def summarize(trace: pd.DataFrame, plan: Plan) -> Summary:
    """The ``Summary`` of a trace, without the optional fields (the runner adds those)."""
    step = float(trace["end_s"].max())
    compute = trace[trace["kind"].isin(COMPUTE_KINDS)]
    pipeline_end = float(compute["end_s"].max())
    kind_codes, kind_names = pd.factorize(trace["kind"].to_numpy())
    ranks = per_rank(rank_rows(trace), trace["start_s"].to_numpy(), trace["end_s"].to_numpy(), kind_codes,
                     list(kind_names), trace["stream"].to_numpy() == Stream.COMPUTE, exposed_kinds(plan), step,
                     pipeline_end)
    bubbles, busy_compute, exposed = ranks.bubbles, ranks.busy_compute, ranks.exposed

    scenario = plan.scenario
    gpus = plan.num_gpus
    # Each simulated rank stands for its tp*dp replicas: executed FLOPs per GPU = mean over simulated ranks.
    hardware_flops_per_gpu = float(trace.groupby("rank")["flops"].sum().mean())
    figures = rates(plan, step, hardware_flops_per_gpu)
    memory = memory_timeline(trace, plan)
    peak_memory = max(m["total"] for m in memory.values())
    tokens = plan.model_tokens_per_step  # document tokens: padding does not count
    return Summary(
        scenario=scenario.name,
        seed=scenario.seed,
        num_gpus=gpus,
        layout=Layout(tp=plan.tp, pp=plan.pp, dp=plan.dp, sequence_parallel=plan.sequence_parallel,
                      cp=plan.cp, ep=plan.ep),
        schedule=scenario.schedule,
        microbatches=plan.microbatches,
        step_time_s=step,
        tokens_per_s=figures.tokens_per_s,
        model_flops_per_step=figures.model_flops,
        parameters_total=total_params(plan.model),
        parameters_active=active_params(plan.model) if plan.model.is_moe else None,
        tflops_per_gpu=figures.tflops_per_gpu,
        mfu=figures.mfu,
        mfu_causal=figures.mfu_causal,
        hardware_tflops_per_gpu=figures.hardware_tflops_per_gpu,
        hfu=figures.hfu,
        bubble_fraction=float(np.mean(bubbles)),
        bubble_rate_stagewise=stagewise_bubble_rate(trace, ranks.host_bound_s),
        host_bound_fraction=float(np.mean(ranks.host_bound)),
        exposed_comm_s=exposed,
        peak_memory_bytes=PeakMemory(max=peak_memory, per_rank={str(r): m["total"] for r, m in memory.items()}),
        memory_breakdown_bytes={str(r): m for r, m in memory.items()},
        host_memory_bytes=max(m["host"] for m in memory.values()),  # CPU offload, per rank
        hbm_capacity_bytes=scenario.cluster.gpu.hbm_capacity,
        fits_in_memory=bool(peak_memory <= scenario.cluster.gpu.hbm_capacity),
        planning=planning(step, gpus, tokens, float(np.mean(busy_compute)), scenario.cluster.gpu.board_power,
                          scenario.training.train_tokens, scenario.cluster.price_per_gpu_hour),
        tasks=int(len(trace)),
    )
