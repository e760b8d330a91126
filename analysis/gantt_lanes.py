"""What the Gantt chart shows, worked out from a trace (issue 25): its lanes, its blocks, its micro-batch
numbers and its legend, whatever draws them.

In: a trace DataFrame (sim.output.trace schema), optionally a set of ranks, a time window and link load
segments. Out: ``GanttContent``: the lanes (stage, rank, stream), stages top to bottom; ``LaneBlocks`` for the
raster (``analysis.gantt_raster``), compute tasks merged per micro-batch and phase; the micro-batch numbers of the
blocks wide enough to carry one; the legend's entries. ``analysis.gantt`` draws it on a Matplotlib Axes,
``analysis.gantt_png`` writes it as a PNG.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import matplotlib.colors
import numpy as np
import pandas as pd

from analysis.gantt_raster import EXPOSED_COLOR, LaneBlocks
from sim.output.summary import exposed_intervals
from sim.workload.ir import COMPUTE_KINDS, STREAMS

COLORS = {
    "forward": "#4C72B0", "backward": "#55A868", "weight": "#64B5CD", "recompute": "#8172B2", "optimizer": "#7F7F7F",
    "tp": "#C44E52", "pp": "#DD8452", "dp": "#937860", "offload": "#DA8BC3",
    "ep": "#CCB974", "cp": "#8C564B", "host": "#555555",
    # A kind's collectives apart where one kind issues several (the trace's ``op``): FSDP/ZeRO-3 gathers
    # parameters (light) and reduce-scatters gradients (dark) on the same stream; SP's TP all-gather and
    # reduce-scatter likewise. Keys are "kind op" with the op as nccl-tests names it.
    "tp all-gather": "#E58A8D", "tp reduce-scatter": "#8E2A2E",
    "dp all-gather": "#C9AE7D", "dp reduce-scatter": "#5E4127",
}
OP_LABELS = {"all_gather": "all-gather", "reduce_scatter": "reduce-scatter", "all_reduce": "all-reduce",
             "all_to_all": "all-to-all", "send": "send"}
STREAM_ORDER = {stream: index for index, stream in enumerate(STREAMS)}
TIER_COLORS = {"nvlink": "#2F6B3A", "nic": "#1F4E79", "uplink": "#8B1E3F", "pcie": "#6A5ACD", "host": "#555555"}
MAX_RANKS_SHOWN = 16
MAX_LABELS = 2000  # micro-batch numbers drawn at most (on the widest blocks)


def default_ranks(trace: pd.DataFrame, per_stage: int = 2) -> list[int] | None:
    """None (all) for small runs; else the lowest ``per_stage`` ranks of every pipeline stage."""
    if trace["rank"].nunique() <= MAX_RANKS_SHOWN:
        return None
    firsts = trace.groupby("stage")["rank"].unique()
    return sorted(int(r) for ranks in firsts for r in sorted(ranks)[:per_stage])


def _merge(lane: np.ndarray, phase: np.ndarray, microbatch: np.ndarray, start: np.ndarray, end: np.ndarray,
           min_gap: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The merge of ``compute_blocks`` over whole arrays: rows sorted by (lane, start) (stable, so tasks that start
    together keep their order); a block ends where the lane, the phase code or the micro-batch changes or the
    lane waits longer than ``min_gap``. Returns each block's first row (index into the inputs), rows sorted, and
    its start and end (min start, max end of its rows)."""
    order = np.lexsort((start, lane))
    lane, phase, microbatch, start, end = lane[order], phase[order], microbatch[order], start[order], end[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (lane[1:] != lane[:-1]) | (phase[1:] != phase[:-1]) | (microbatch[1:] != microbatch[:-1]) | (
        start[1:] - end[:-1] > min_gap)
    first = np.flatnonzero(new)
    if not len(first):
        return first, order, start, end
    return first, order, np.minimum.reduceat(start, first), np.maximum.reduceat(end, first)


def compute_blocks(rows: pd.DataFrame, min_gap: float = 0.0) -> pd.DataFrame:
    """Merge a compute stream's consecutive tasks of the same (phase, micro-batch) into one block, where a
    recomputation belongs to the backward phase; a wait longer than ``min_gap`` (idle time worth seeing, such as
    an exposed all-gather) starts a new block. In: one stream's rows (trace schema). Out: one row per block
    (kind, microbatch, start_s, end_s), in time order."""
    phase = rows["kind"].replace({"recompute": "backward"}).to_numpy()
    codes, names = pd.factorize(phase)
    first, order, start, end = _merge(np.zeros(len(rows), dtype=np.int64), codes,
                                      rows["microbatch"].to_numpy(), rows["start_s"].to_numpy(float),
                                      rows["end_s"].to_numpy(float), min_gap)
    picked = order[first]
    return pd.DataFrame({"kind": names.take(codes[picked]) if len(picked) else np.array([], dtype=object),
                         "microbatch": rows["microbatch"].to_numpy()[picked], "start_s": start, "end_s": end})


def _window(trace: pd.DataFrame, ranks: Sequence[int] | None, start: float | None,
            end: float | None) -> tuple[pd.DataFrame, float, float]:
    """The rows of ``ranks`` overlapping [start, end] (default: the whole step), and that window."""
    frame = trace if ranks is None else trace[trace["rank"].isin(list(ranks))]
    lo = float(frame["start_s"].min()) if start is None else start
    hi = float(frame["end_s"].max()) if end is None else end
    if start is None and end is None:
        return frame, lo, hi
    return frame[(frame["end_s"] >= lo) & (frame["start_s"] <= hi)], lo, hi


def _lane_index(frame: pd.DataFrame) -> tuple[list[tuple[int, int, str]], np.ndarray]:
    """(stage, rank, stream) of every lane, stages top to bottom, streams in ``STREAMS`` order (others after,
    by name), and each row's lane number."""
    codes, streams = pd.factorize(frame["stream"].to_numpy())  # hashing, not sorting: linear in rows
    known = len(STREAM_ORDER)
    ranked = sorted(range(len(streams)), key=lambda i: (STREAM_ORDER.get(streams[i], known), str(streams[i])))
    position = np.empty(len(streams), dtype=np.int64)
    position[ranked] = np.arange(len(streams))
    stage, rank = frame["stage"].to_numpy(np.int64), frame["rank"].to_numpy(np.int64)
    # stage and rank are non-negative and below 2^20 (a million GPUs), streams a handful: one sortable int64
    key = (stage << 40) | (rank << 20) | position[codes] if len(codes) else np.zeros(0, dtype=np.int64)
    lane, unique = pd.factorize(key)
    rank_of = np.empty(len(unique), dtype=np.int64)
    rank_of[np.argsort(unique)] = np.arange(len(unique))
    unique, lane = np.sort(unique), rank_of[lane]
    lanes = [(int(k >> 40), int((k >> 20) & 0xFFFFF), str(streams[ranked[k & 0xFFFFF]])) for k in unique]
    return lanes, lane


def _lanes(frame: pd.DataFrame) -> list[tuple[int, int, str]]:
    """(stage, rank, stream) of every lane, stages top to bottom, streams in ``STREAMS`` order."""
    return _lane_index(frame)[0]


def _link_names(link_segments: pd.DataFrame | None) -> list[str]:
    return [] if link_segments is None else list(dict.fromkeys(link_segments["src"] + "->" + link_segments["dst"]))


def _paint_key(kind: str, op: str | None) -> str:
    """The colour key of a transfer: "kind op" where ``COLORS`` has one (an FSDP all-gather apart from its
    reduce-scatter), else the kind."""
    keyed = f"{kind} {OP_LABELS.get(op, op)}" if op is not None else kind
    return keyed if keyed in COLORS else kind


def _paint_codes(kind_codes: np.ndarray, kind_names: Sequence[str], op_codes: np.ndarray | None,
                 op_names: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """``_paint_key`` of each row, from factorized kind and op columns: worked out once per distinct (kind, op)
    pair (a step has ~10^5 transfers and a handful of pairs). Returns each row's index into the keys, and the
    keys."""
    if op_codes is None:
        return kind_codes, [str(k) for k in kind_names]
    width = max(len(op_names), 1)
    pairs, pair_codes = np.unique(kind_codes.astype(np.int64) * width + op_codes, return_inverse=True)
    keys = [_paint_key(str(kind_names[pair // width]), str(op_names[pair % width])) for pair in pairs.tolist()]
    key_codes, names = pd.factorize(np.asarray(keys, dtype=object))
    return key_codes[pair_codes.reshape(-1)], [str(k) for k in names]


def paint_kinds(rows: pd.DataFrame) -> np.ndarray:
    """The colour key of each non-compute row (``_paint_key``: "kind op" where ``COLORS`` has one, else the
    kind)."""
    kind_codes, kind_names = pd.factorize(rows["kind"])
    op_codes, op_names = pd.factorize(rows["op"]) if "op" in rows else (None, [])
    codes, names = _paint_codes(kind_codes, list(kind_names), op_codes, list(op_names))
    return np.asarray(names, dtype=object)[codes] if len(codes) else np.zeros(0, dtype=object)


def exposed_blocks(frame: pd.DataFrame, lane_of: np.ndarray,
                   compute: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The exposed communication of the window's rows, on the lanes of the transfers it belongs to: per rank,
    each communication stream's intervals outside the rank's compute stream (``exposed_intervals``, the summary's
    rule). ``compute`` marks the compute stream's rows (worked out when not given). Returns (lane, start, end)
    arrays, by rank then lane. The rows are grouped by one sort, not a mask per (rank, lane)."""
    if compute is None:
        compute = frame["stream"].to_numpy() == "compute"
    comm = ~compute & ~frame["kind"].isin(list(COMPUTE_KINDS)).to_numpy()
    rank = frame["rank"].to_numpy().astype(np.int64)
    start, end = frame["start_s"].to_numpy(float), frame["end_s"].to_numpy(float)
    busy = np.flatnonzero(compute)
    busy = busy[np.argsort(rank[busy], kind="stable")]
    busy_rank = rank[busy]
    mine = np.flatnonzero(comm)
    mine = mine[np.lexsort((lane_of[mine], rank[mine]))]  # by rank, then lane; rows in trace order within
    if not len(mine):
        return np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0)
    key_rank, key_lane = rank[mine], lane_of[mine]
    cuts = np.flatnonzero((key_rank[1:] != key_rank[:-1]) | (key_lane[1:] != key_lane[:-1])) + 1
    lanes, starts, ends = [], [], []
    for a, b in zip(np.concatenate([[0], cuts]).tolist(), np.concatenate([cuts, [len(mine)]]).tolist(), strict=True):
        rows, r = mine[a:b], key_rank[a]
        computing = busy[np.searchsorted(busy_rank, r, side="left"):np.searchsorted(busy_rank, r, side="right")]
        s, e = exposed_intervals(start[rows], end[rows], start[computing], end[computing])
        lanes.append(np.full(len(s), key_lane[a], dtype=np.int64))
        starts.append(s)
        ends.append(e)
    return np.concatenate(lanes), np.concatenate(starts), np.concatenate(ends)


def lane_blocks(frame: pd.DataFrame, lanes: list[tuple[int, int, str]], lane_of: np.ndarray, lo: float, hi: float,
                link_segments: pd.DataFrame | None = None,
                links: Sequence[str] = ()) -> tuple[LaneBlocks, pd.DataFrame]:
    """The blocks of the window's rows (``_lane_index``'s lanes): compute lanes merged per micro-batch and phase
    (``compute_blocks``'s rule, split where a lane idles more than 1/1500 of the window), other lanes a block
    per task in its ``_paint_key``'s colour; and the merged compute blocks with their lane, micro-batch and times
    (for the labels). The string columns are factorized once and the rest is done on their codes."""
    span = hi - lo if hi > lo else 1.0
    color_names = list(COLORS)
    color_of = {name: i for i, name in enumerate(color_names)}
    colors = np.array([matplotlib.colors.to_rgb(COLORS[k]) for k in color_names] + [(0.2, 0.2, 0.2)])
    unknown = len(color_names)  # a kind without a colour: dark grey
    compute = np.array([stream == "compute" for _, _, stream in lanes], dtype=bool)[lane_of] if len(lanes) else (
        np.zeros(len(frame), dtype=bool))
    kind_codes, kind_names = pd.factorize(frame["kind"])
    # a recomputation belongs to its backward phase: one phase code per kind name
    phase_codes, phase_names = pd.factorize(np.asarray(
        ["backward" if k == "recompute" else str(k) for k in kind_names] or [""], dtype=object))
    codes = phase_codes[kind_codes[compute]] if len(kind_names) else np.zeros(0, dtype=np.int64)
    microbatch = frame["microbatch"].to_numpy()[compute]
    start, end = frame["start_s"].to_numpy(float), frame["end_s"].to_numpy(float)
    first, order, c_start, c_end = _merge(lane_of[compute], codes, microbatch, start[compute], end[compute],
                                          min_gap=span / 1500)
    picked = order[first]
    c_lane, c_mb = lane_of[compute][picked], microbatch[picked]
    c_kind = np.array([color_of.get(str(k), unknown) for k in phase_names], dtype=np.int64)[codes[picked]]
    other = ~compute
    o_lane = lane_of[other]
    op_codes, op_names = pd.factorize(frame["op"].to_numpy()[other]) if "op" in frame else (None, [])
    o_codes, o_names = _paint_codes(kind_codes[other], list(kind_names), op_codes, list(op_names))
    o_kind = np.array([color_of.get(k, unknown) for k in o_names] or [unknown], dtype=np.int64)[o_codes]
    per_lane = np.bincount(o_lane, minlength=len(lanes))
    n = len(c_lane)
    blocks = LaneBlocks(
        len(lanes), np.concatenate([c_lane, o_lane]), np.concatenate([c_kind, o_kind]),
        np.concatenate([c_start, start[other]]), np.concatenate([c_end, end[other]]),
        np.arange(n + len(o_lane)) < n, np.concatenate([np.zeros(n, dtype=bool), per_lane[o_lane] < 500]),
        colors, lo, hi)
    e_lane, e_start, e_end = exposed_blocks(frame, lane_of, compute)
    blocks = replace(blocks, exposed_lane=e_lane, exposed_start=e_start, exposed_end=e_end)
    if link_segments is not None and len(links):
        name = (link_segments["src"] + "->" + link_segments["dst"]).to_numpy()
        index = {link: i for i, link in enumerate(links)}
        tiers = link_segments.groupby(name, sort=False)["tier"].first()
        blocks = replace(
            blocks, links=len(links), link_lane=np.array([index[n] for n in name], dtype=np.int64),
            link_start=link_segments["start_s"].to_numpy(float), link_end=link_segments["end_s"].to_numpy(float),
            link_load=np.clip(link_segments["load_fraction"].to_numpy(float), 0.08, 1.0),
            link_colors=np.array([matplotlib.colors.to_rgb(TIER_COLORS.get(str(tiers[link]), "#333333"))
                                  for link in links]))
    merged = pd.DataFrame({"lane": c_lane, "microbatch": c_mb, "start_s": c_start, "end_s": c_end})
    return blocks, merged


@dataclass(frozen=True)
class GanttContent:
    """What one chart shows: the lanes' labels (task lanes, then link lanes) and their blocks; the micro-batch
    numbers (``label_x`` seconds, ``label_lane``, ``label_text``); the legend as (label, colour) in ``COLORS``'
    order, the exposed strip last; the time window [lo, hi]."""

    lane_labels: list[str]
    blocks: LaneBlocks
    label_x: np.ndarray
    label_lane: np.ndarray
    label_text: list[str]
    legend: list[tuple[str, str]]
    lo: float
    hi: float


def gantt_content(trace: pd.DataFrame, ranks: Sequence[int] | None = None, start: float | None = None,
                  end: float | None = None, link_segments: pd.DataFrame | None = None) -> GanttContent:
    """The chart of ``trace`` (optionally only ``ranks`` and the window [start, end] in seconds, with lanes for
    ``link_segments``): blocks per lane (``lane_blocks``), a micro-batch number on every merged compute block
    wider than 1/160 of the window (the ``MAX_LABELS`` widest where more are: past that they crowd the chart),
    and a legend entry for every colour a block is painted in (a recomputation in its backward's)."""
    frame, lo, hi = _window(trace, ranks, start, end)
    lanes, lane_of = _lane_index(frame)
    links = _link_names(link_segments)
    blocks, merged = lane_blocks(frame, lanes, lane_of, lo, hi, link_segments, links)
    label_width = (hi - lo) / 160  # only blocks wider than this get their micro-batch number
    width = merged["end_s"].to_numpy() - merged["start_s"].to_numpy()
    wide = np.flatnonzero((merged["microbatch"].to_numpy() >= 0) & (width > label_width))
    if len(wide) > MAX_LABELS:  # the widest (ties in block order)
        wide = np.sort(wide[np.argsort(-width[wide], kind="stable")[:MAX_LABELS]])
    label_x = ((merged["start_s"].to_numpy() + merged["end_s"].to_numpy()) / 2)[wide]
    painted = np.bincount(blocks.kind, minlength=len(COLORS) + 1)[:len(COLORS)] > 0  # the last: no colour
    legend = [(k, COLORS[k]) for k, shown in zip(COLORS, painted.tolist(), strict=True) if shown]
    if len(blocks.exposed_lane):
        legend.append(("exposed comm (strip)", EXPOSED_COLOR))
    return GanttContent(
        lane_labels=[f"stage {s} · rank {r} · {st}" for s, r, st in lanes] + [f"link {name}" for name in links],
        blocks=blocks, label_x=label_x, label_lane=merged["lane"].to_numpy()[wide],
        label_text=[str(mb) for mb in merged["microbatch"].to_numpy()[wide]], legend=legend, lo=lo, hi=hi)
