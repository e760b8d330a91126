"""Gantt chart of a trace.

In: a trace DataFrame (sim.output.trace schema), optionally a set of ranks and a time window. Out: an image file
(PNG/SVG/PDF by extension) with one lane per (rank, stream), stages top to bottom, blocks coloured by kind.
Consecutive compute tasks of the same micro-batch and kind (its layers, with the TP collectives between them)
are drawn as one block labelled with the micro-batch number, split where the stream waits long enough to see,
so warm-up, steady 1F1B, cool-down and the bubbles read at a glance; recomputation joins the backward block
it belongs to (its time is in HFU and in the trace). Communication lanes show every collective and send.

With link load segments (a ``contention`` run with ``--link-timeline``), the busiest links get a lane each
below the ranks, shaded by the fraction of the link's capacity in use. Runs with every rank simulated show
two ranks per stage by default (the rest are alike unless the scenario makes them differ).

``plot_gantt(trace, ax=None, ...)`` draws on a Matplotlib Axes (a new pyplot figure when none is given, as a
notebook wants) and returns it; ``write_gantt`` draws on a bare ``matplotlib.figure.Figure`` and saves it, so the
command line needs no GUI backend and nothing here changes the user's backend. Entry points (registered in
pyproject.toml): ``write_run_chart`` after ``sim run`` writes ``gantt.png``; ``write_gantt`` serves ``sim plot``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import matplotlib.colors
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties, findfont, get_font
from matplotlib.image import AxesImage
from matplotlib.patches import Patch
from matplotlib.path import Path as MplPath
from matplotlib.textpath import TextPath
from matplotlib.transforms import IdentityTransform

from sim.output.atomic import write_atomically
from sim.output.summary import Summary, exposed_intervals
from sim.workload.ir import COMPUTE_KINDS, STREAMS

COLORS = {
    "forward": "#4C72B0", "backward": "#55A868", "weight": "#64B5CD", "recompute": "#8172B2", "optimizer": "#7F7F7F",
    "tp": "#C44E52", "pp": "#DD8452", "dp": "#937860", "offload": "#DA8BC3",
    "ep": "#CCB974", "cp": "#8C564B",
    # A kind's collectives apart where one kind issues several (the trace's ``op``): FSDP/ZeRO-3 gathers
    # parameters (light) and reduce-scatters gradients (dark) on the same stream; SP's TP all-gather and
    # reduce-scatter likewise. Keys are "kind op" with the op as nccl-tests names it.
    "tp all-gather": "#E58A8D", "tp reduce-scatter": "#8E2A2E",
    "dp all-gather": "#C9AE7D", "dp reduce-scatter": "#5E4127",
}
OP_LABELS = {"all_gather": "all-gather", "reduce_scatter": "reduce-scatter", "all_reduce": "all-reduce",
             "all_to_all": "all-to-all", "send": "send"}
EXPOSED_COLOR = "#D62728"  # the strip under communication that runs while its rank's compute stream idles
EXPOSED_SHARE = 0.3  # of a lane's painted band, at its bottom
STREAM_ORDER = {stream: index for index, stream in enumerate(STREAMS)}
TIER_COLORS = {"nvlink": "#2F6B3A", "nic": "#1F4E79", "uplink": "#8B1E3F", "pcie": "#6A5ACD", "host": "#555555"}
MAX_RANKS_SHOWN = 16
DPI = 150  # the written chart's resolution
PNG_COMPRESS_LEVEL = 1  # zlib level of the written PNG (Pillow's default is 6)
MAX_HEIGHT = 24.0  # inches: above it, lanes get thinner
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


def figure_size(trace: pd.DataFrame, ranks: Sequence[int] | None = None, start: float | None = None,
                end: float | None = None, link_segments: pd.DataFrame | None = None) -> tuple[float, float]:
    """Inches (width, height) that give each lane of the chart a readable row: 16 wide, 0.32 per lane up to
    ``MAX_HEIGHT``, then thinner lanes (not under 0.16 inch, still taller than their 7-point label): a 32-stage
    pipeline's 128 lanes at 0.32 inch made a 2,400 x 6,400-pixel image whose drawing and PNG encoding took
    longer than simulating the step."""
    frame, _, _ = _window(trace, ranks, start, end)
    lanes = len(_lanes(frame)) + len(_link_names(link_segments))
    per_lane = max(0.16, min(0.32, (MAX_HEIGHT - 1.4) / max(lanes, 1)))
    return 16.0, max(2.5, per_lane * lanes + 1.4)


# ----------------------------------------------------------------------------------------------- raster
# The chart is one image (issue 25): a Matplotlib artist per block (``broken_barh``) cost 2.5 s for the 175B
# step's 158,505 tasks, more than simulating it. The image has the Axes' size in pixels, so it is drawn 1:1;
# each lane is a band of rows, the middle 0.8 painted (as the bars were); each pixel column holds, per kind, the
# fraction of its time the lane spent on that kind (exact, as antialiased bars would show it), so the work is
# linear in blocks plus pixels.
COLUMNS = 2048  # pixel columns of the time axis when no Axes size is known
BAND = 0.8  # the painted share of a lane's height


def coverage(lane: np.ndarray, kind: np.ndarray, start: np.ndarray, end: np.ndarray, lanes: int, kinds: int,
             lo: float, hi: float, columns: int = COLUMNS, weight: np.ndarray | None = None) -> np.ndarray:
    """Per (kind, lane, pixel column): the fraction of the column's time [lo + j dt, lo + (j+1) dt) covered by
    the blocks [start, end] of that lane and kind (times ``weight`` per block, when given); shape
    (kinds, lanes, columns), float64. Each block adds a ramp of slope 1 from its start to its end to the running
    busy time; a column's coverage is that busy time's increase across it, so the sum over blocks takes one
    ``bincount`` and one ``cumsum``."""
    dt = (hi - lo) / columns if hi > lo else 1.0
    a = np.clip((start - lo) / dt, 0.0, columns)
    b = np.clip((end - lo) / dt, 0.0, columns)
    w = np.ones(len(a)) if weight is None else np.asarray(weight, dtype=float)
    width = columns + 2
    row = (kind.astype(np.int64) * lanes + lane.astype(np.int64)) * width
    ka, kb = np.floor(a).astype(np.int64), np.floor(b).astype(np.int64)
    index = np.concatenate([row + ka + 1, row + kb + 1])
    size = kinds * lanes * width
    steps = np.bincount(index, np.concatenate([w, -w]), size)  # the slope switches on at a, off at b
    offsets = np.bincount(index, np.concatenate([-w * (a - ka), w * (b - kb)]), size)  # the partial columns
    busy = np.cumsum(steps.reshape(kinds * lanes, width), axis=1) + offsets.reshape(kinds * lanes, width)
    return busy[:, 1:columns + 1].reshape(kinds, lanes, columns)


def paint(cover: np.ndarray, colors: np.ndarray) -> np.ndarray:
    """Each lane's colour per pixel column (lanes, columns, 3; float in [0, 1]) from ``coverage``'s array and one
    RGB colour per kind: white where idle, the coverage-weighted mix of its kinds' colours where busy
    (overlapping blocks scaled to fill the column once)."""
    total = cover.sum(axis=0)
    scale = 1.0 / np.maximum(total, 1.0)
    ink = np.einsum("klc,kx->lcx", cover, 1.0 - colors) * scale[..., None]  # what each lane's column takes from white
    return np.clip(1.0 - ink, 0.0, 1.0)


def bands(lane_colors: np.ndarray, height: int, marks: np.ndarray | None = None) -> np.ndarray:
    """The chart's image (``height`` rows, columns, 4; RGBA uint8, which Matplotlib draws without converting):
    lane ``i`` (of ``lane_colors``'s first axis) owns the rows whose centre falls in [i, i + 1) of
    ``height / lanes`` rows per lane, and paints the middle ``BAND`` of them with its colours; the rest is white.
    ``marks`` (lanes, columns; in [0, 1]) blends ``EXPOSED_COLOR`` into the bottom ``EXPOSED_SHARE`` of a band."""
    lanes, columns = lane_colors.shape[:2]
    rgba = np.full((2 * lanes + 1, columns, 4), 255, dtype=np.uint8)  # lanes, marked lanes, white (the gaps)
    rgba[:lanes, :, :3] = np.rint(lane_colors * 255)
    marked = lane_colors if marks is None else lane_colors + marks[..., None] * (
        np.array(matplotlib.colors.to_rgb(EXPOSED_COLOR)) - lane_colors)
    rgba[lanes:2 * lanes, :, :3] = np.rint(marked * 255)
    centre = (np.arange(height) + 0.5) * lanes / height  # each row's centre in lane units (lane i spans [i, i+1))
    lane = np.minimum(centre.astype(np.int64), lanes - 1)
    offset = centre - lane - 0.5  # -BAND/2 at the band's top, +BAND/2 at its bottom (origin upper)
    bottom = offset > BAND / 2 - EXPOSED_SHARE * BAND
    return rgba[np.where(np.abs(offset) <= BAND / 2, np.where(bottom, lane + lanes, lane), 2 * lanes)]


@dataclass(frozen=True)
class LaneBlocks:
    """What the chart paints, as arrays: per block its lane (row of the chart), kind (index into ``colors``),
    start and end (seconds); ``compute`` marks merged compute blocks (they get a one-pixel gap at their start,
    where the bars had a white edge), ``sparse`` the transfers of lanes with fewer than 500 (drawn at least a
    pixel wide, so a 175B step's p2p sends do not vanish, while dense lanes such as thousands of TP collectives
    keep their true widths). The link lanes (``link_*``) follow the task lanes, each in its tier's colour
    weighted by its load."""

    lanes: int
    lane: np.ndarray
    kind: np.ndarray
    start: np.ndarray
    end: np.ndarray
    compute: np.ndarray
    sparse: np.ndarray
    colors: np.ndarray
    lo: float
    hi: float
    links: int = 0
    link_lane: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    link_start: np.ndarray = field(default_factory=lambda: np.zeros(0))
    link_end: np.ndarray = field(default_factory=lambda: np.zeros(0))
    link_load: np.ndarray = field(default_factory=lambda: np.zeros(0))
    link_colors: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    exposed_lane: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    exposed_start: np.ndarray = field(default_factory=lambda: np.zeros(0))
    exposed_end: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def lane_colors(self, columns: int) -> np.ndarray:
        """Each lane's colour per pixel column (task lanes, then link lanes; ``columns`` across [lo, hi])."""
        span = self.hi - self.lo if self.hi > self.lo else 1.0
        pixel = span / columns
        start = np.where(self.compute & (self.end - self.start > 4 * pixel), self.start + pixel, self.start)
        end = np.where(self.sparse, np.maximum(self.end, self.start + pixel), self.end)
        colors = paint(coverage(self.lane, self.kind, start, end, self.lanes, len(self.colors), self.lo, self.hi,
                                columns), self.colors)
        if not self.links:
            return colors
        load = coverage(np.zeros(len(self.link_lane), dtype=np.int64), self.link_lane, self.link_start,
                        self.link_end, 1, self.links, self.lo, self.hi, columns, weight=self.link_load)
        # each link is a "kind" of one lane here, in its own colour
        return np.concatenate([colors] + [paint(load[i:i + 1], self.link_colors[i:i + 1])
                                          for i in range(self.links)])

    def exposed(self, columns: int) -> np.ndarray:
        """Per lane (task lanes, then link lanes) and pixel column, the share of the column's time that lane's
        communication is exposed (drawn at least a pixel wide, as sparse transfers are)."""
        marks = np.zeros((self.lanes + self.links, columns))
        if len(self.exposed_lane):
            pixel = (self.hi - self.lo if self.hi > self.lo else 1.0) / columns
            # As transfers (``sparse``): a lane's few exposed pieces at least a pixel wide, so a lone exposed send
            # shows; where there are many (a step's TP collectives) their true share of each column, so a lane
            # exposed 8% of the time is not painted as if it were exposed throughout.
            few = np.bincount(self.exposed_lane, minlength=self.lanes)[self.exposed_lane] < 500
            end = np.where(few, np.maximum(self.exposed_end, self.exposed_start + pixel), self.exposed_end)
            marks[:self.lanes] = np.clip(coverage(self.exposed_lane, np.zeros(len(self.exposed_lane), dtype=np.int64),
                                                  self.exposed_start, end, self.lanes, 1, self.lo, self.hi,
                                                  columns)[0], 0.0, 1.0)
        return marks

    def image(self, columns: int, height: int) -> np.ndarray:
        """The chart's RGBA image, ``height`` x ``columns`` pixels."""
        return bands(self.lane_colors(columns), height, self.exposed(columns))


class LaneRaster(AxesImage):
    """The lanes as an image painted when drawn, at the Axes' size in output pixels, and drawn pixel for pixel:
    Matplotlib's resampling of a large image (float copies, masked arrays, premultiplied alpha) took longer than
    painting it. Where the view is not the one plotted (a notebook zoom), or on a canvas that scales images
    itself (PDF, SVG), it falls back to an ordinary image of ``COLUMNS`` columns."""

    def __init__(self, ax: Axes, blocks: LaneBlocks):
        rows = blocks.lanes + blocks.links
        super().__init__(ax, interpolation="nearest", origin="upper",
                         extent=(blocks.lo, blocks.hi, rows - 0.5, -0.5))
        self.blocks, self.rows, self.painted = blocks, rows, False
        self.set_data(np.full((1, 1, 4), 255, dtype=np.uint8))  # painted when first drawn

    def make_image(self, renderer: Any, magnification: float = 1.0,
                   unsampled: bool = False) -> tuple[Any, float, float, Any]:
        ax = self.axes
        plotted = (ax.get_xlim() == (self.blocks.lo, self.blocks.hi)
                   and ax.get_ylim() == (self.rows - 0.5, -0.5))
        if unsampled or not plotted:
            if not self.painted:
                self.set_data(self.blocks.image(COLUMNS, 12 * self.rows))
                self.painted = True
            return super().make_image(renderer, magnification, unsampled)
        # The Axes' pixels, rounded as Matplotlib rounds an image's (to the nearest output pixel border).
        x0, y0, x1, y1 = np.asarray(ax.bbox.extents) * magnification
        x0, x1 = np.floor(x0 + 0.5), np.floor(x1 + 0.5 + 1e-8)
        y0, y1 = np.ceil(y0 - 0.5 - 1e-8), np.ceil(y1 - 0.5)
        columns, height = int(x1 - x0), int(y1 - y0)
        if columns < 1 or height < 1:
            return None, 0, 0, None
        # A canvas's draw_image puts the array's first row at the bottom (y0): flip, as origin="upper" does.
        image = np.ascontiguousarray(self.blocks.image(columns, height)[::-1])
        return image, x0 / magnification, y0 / magnification, IdentityTransform()


class MicrobatchLabels(PathCollection):
    """The micro-batch numbers, white, centred on their blocks, as one collection of glyph outlines placed like
    scatter markers (in points, at data positions): a Text artist per label cost ~1 ms to lay out and draw,
    this a few microseconds. ``labels`` lists (x, lane, text)."""

    def __init__(self, ax: Axes, x: np.ndarray, lane: np.ndarray, texts: list[str], fontsize: float = 6.0):
        glyphs: dict[str, MplPath] = {}
        for text in dict.fromkeys(texts):
            outline = TextPath((0, 0), text, size=fontsize)
            box = outline.get_extents()
            glyphs[text] = MplPath(outline.vertices - ((box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2), outline.codes)
        # sizes 1: the paths are scaled by sqrt(1) * dpi / 72, i.e. their coordinates are points
        super().__init__([glyphs[t] for t in texts], sizes=[1.0], offsets=np.column_stack([x, lane]),
                         offset_transform=ax.transData, facecolors="white", edgecolors="none", linewidths=0)
        self.set_transform(IdentityTransform())  # as scatter's: offsets in data, outlines in (scaled) pixels
        self.labels = list(zip(x.tolist(), lane.tolist(), texts, strict=True))


def paint_kinds(rows: pd.DataFrame) -> np.ndarray:
    """The colour key of each non-compute row: "kind op" where ``COLORS`` has one (an FSDP all-gather apart from
    its reduce-scatter), else the kind. Worked out once per distinct (kind, op) pair: a step has ~10^5 transfers
    and a handful of pairs."""
    kind_codes, kind_names = pd.factorize(rows["kind"])
    if "op" not in rows:
        return np.asarray(kind_names, dtype=object)[kind_codes]
    op_codes, op_names = pd.factorize(rows["op"])
    pair_codes, pairs = pd.factorize(kind_codes * max(len(op_names), 1) + op_codes)

    def key(pair: int) -> str:
        kind, op = str(kind_names[pair // max(len(op_names), 1)]), str(op_names[pair % max(len(op_names), 1)])
        keyed = f"{kind} {OP_LABELS.get(op, op)}"
        return keyed if keyed in COLORS else kind

    return np.array([key(int(pair)) for pair in pairs], dtype=object)[pair_codes]


def exposed_blocks(frame: pd.DataFrame, lane_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The exposed communication of the window's rows, on the lanes of the transfers it belongs to: per rank,
    each communication stream's intervals outside the rank's compute stream (``exposed_intervals``, the summary's
    rule). Returns (lane, start, end) arrays."""
    lanes, starts, ends = [], [], []
    compute = frame["stream"].to_numpy() == "compute"
    comm = ~compute & ~frame["kind"].isin(list(COMPUTE_KINDS)).to_numpy()
    rank = frame["rank"].to_numpy()
    start, end = frame["start_s"].to_numpy(float), frame["end_s"].to_numpy(float)
    for r in np.unique(rank[comm]):
        busy = compute & (rank == r)
        mine = comm & (rank == r)
        for lane in np.unique(lane_of[mine]):
            rows = mine & (lane_of == lane)
            s, e = exposed_intervals(start[rows], end[rows], start[busy], end[busy])
            lanes.append(np.full(len(s), lane, dtype=np.int64))
            starts.append(s)
            ends.append(e)
    if not lanes:
        return np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0)
    return np.concatenate(lanes), np.concatenate(starts), np.concatenate(ends)


def lane_blocks(frame: pd.DataFrame, lanes: list[tuple[int, int, str]], lane_of: np.ndarray, lo: float, hi: float,
                link_segments: pd.DataFrame | None = None,
                links: Sequence[str] = ()) -> tuple[LaneBlocks, pd.DataFrame]:
    """The blocks of the window's rows (``_lane_index``'s lanes): compute lanes merged per micro-batch and phase
    (``compute_blocks``'s rule, split where a lane idles more than 1/1500 of the window), other lanes a block
    per task; and the merged compute blocks with their lane, micro-batch and times (for the labels)."""
    span = hi - lo if hi > lo else 1.0
    kind_names = list(COLORS)
    kind_of = {name: i for i, name in enumerate(kind_names)}
    colors = np.array([matplotlib.colors.to_rgb(COLORS[k]) for k in kind_names] + [(0.2, 0.2, 0.2)])
    unknown = len(kind_names)  # a kind without a colour: dark grey
    compute = frame["stream"].to_numpy() == "compute"
    kinds = frame["kind"].to_numpy()
    phase = np.where(kinds[compute] == "recompute", "backward", kinds[compute])
    codes, names = pd.factorize(phase)
    microbatch = frame["microbatch"].to_numpy()[compute]
    start, end = frame["start_s"].to_numpy(float), frame["end_s"].to_numpy(float)
    first, order, c_start, c_end = _merge(lane_of[compute], codes, microbatch, start[compute], end[compute],
                                          min_gap=span / 1500)
    picked = order[first]
    c_lane, c_mb = lane_of[compute][picked], microbatch[picked]
    c_kind = np.array([kind_of.get(str(k), unknown) for k in names], dtype=np.int64)[codes[picked]]
    other = ~compute
    o_lane = lane_of[other]
    o_codes, o_names = pd.factorize(paint_kinds(frame[other]))
    o_kind = np.array([kind_of.get(str(k), unknown) for k in o_names], dtype=np.int64)[o_codes]
    per_lane = np.bincount(o_lane, minlength=len(lanes))
    n = len(c_lane)
    blocks = LaneBlocks(
        len(lanes), np.concatenate([c_lane, o_lane]), np.concatenate([c_kind, o_kind]),
        np.concatenate([c_start, start[other]]), np.concatenate([c_end, end[other]]),
        np.arange(n + len(o_lane)) < n, np.concatenate([np.zeros(n, dtype=bool), per_lane[o_lane] < 500]),
        colors, lo, hi)
    e_lane, e_start, e_end = exposed_blocks(frame, lane_of)
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


def plot_gantt(
    trace: pd.DataFrame,
    ax: Axes | None = None,
    ranks: Sequence[int] | None = None,
    start: float | None = None,
    end: float | None = None,
    title: str | None = None,
    link_segments: pd.DataFrame | None = None,
) -> Axes:
    """Draw the Gantt chart of ``trace`` (optionally only ``ranks`` and the window [start, end] in seconds, with
    lanes for ``link_segments``) on ``ax``, or on a new pyplot figure sized by ``figure_size``; return the Axes.
    The lanes are one image (``LaneRaster``), the micro-batch numbers (``MicrobatchLabels``) where a block is
    wide enough."""
    frame, lo, hi = _window(trace, ranks, start, end)
    lanes, lane_of = _lane_index(frame)
    links = _link_names(link_segments)
    if ax is None:
        import matplotlib.pyplot as plt  # only here: pyplot (the user's backend) for a figure a notebook shows

        _, ax = plt.subplots(figsize=figure_size(trace, ranks, start, end, link_segments))
    blocks, merged = lane_blocks(frame, lanes, lane_of, lo, hi, link_segments, links)
    ax.add_image(LaneRaster(ax, blocks))
    label_width = (hi - lo) / 160  # only blocks wider than this get their micro-batch number
    wide = merged[(merged["microbatch"] >= 0) & (merged["end_s"] - merged["start_s"] > label_width)]
    if len(wide) > MAX_LABELS:  # the widest: past that they crowd the chart
        wide = wide.loc[(wide["end_s"] - wide["start_s"]).sort_values(ascending=False, kind="stable").index[
            :MAX_LABELS]].sort_index()
    if len(wide):
        ax.add_collection(MicrobatchLabels(ax, ((wide["start_s"] + wide["end_s"]) / 2).to_numpy(),
                                           wide["lane"].to_numpy(), [str(mb) for mb in wide["microbatch"]]),
                          autolim=False)
    labels = [f"stage {s} · rank {r} · {st}" for s, r, st in lanes] + [f"link {name}" for name in links]
    ax.set_yticks(np.arange(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("time (s)")
    ax.grid(axis="x", linewidth=0.3, alpha=0.5)
    compute = frame["stream"].to_numpy() == "compute"
    drawn = (set(np.unique(frame["kind"].to_numpy()[compute].astype(str)))
             | set(np.unique(paint_kinds(frame[~compute])))) - {"recompute"}
    handles = [Patch(color=COLORS[k], label=k) for k in COLORS if k in drawn]
    if len(blocks.exposed_lane):
        handles.append(Patch(color=EXPOSED_COLOR, label="exposed comm (strip)"))
    # One row of the legend just above the lanes, the title above it (side by side they overlapped once the
    # collectives got their own colours).
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(handles), fontsize=8,
              frameon=False, borderaxespad=0.2, handlelength=1.5, columnspacing=1.2)
    if title:
        ax.set_title(title, fontsize=10, loc="left", pad=18)
    return ax


def write_gantt(
    trace: pd.DataFrame,
    path: Path | str,
    ranks: Sequence[int] | None = None,
    start: float | None = None,
    end: float | None = None,
    title: str | None = None,
    link_segments: pd.DataFrame | None = None,
) -> Path:
    """``sim plot`` plugin: the Gantt chart (``plot_gantt``'s arguments) as an image file, PNG/SVG/PDF by the
    extension of ``path``. A bare ``Figure`` renders with the format's own canvas: no pyplot, no backend."""
    path = Path(path)
    fig = Figure(figsize=figure_size(trace, ranks, start, end, link_segments), dpi=DPI)  # Axes pixels = file pixels
    ax = plot_gantt(trace, fig.subplots(), ranks=ranks, start=start, end=end, title=title,
                    link_segments=link_segments)
    fit_margins(fig, [label.get_text() for label in ax.get_yticklabels()])
    # zlib level 1 for PNG: the chart is flat colour, so it compresses nearly as well as at Pillow's default (6)
    # and a third of the 175B chart's encoding time goes away (benchmarks/bench_gantt.py).
    options = {"pil_kwargs": {"compress_level": PNG_COMPRESS_LEVEL}} if path.suffix.lower() == ".png" else {}
    write_atomically(path, lambda temporary: fig.savefig(temporary, dpi=DPI, **options))  # no torn image if killed
    return path


def fit_margins(fig: Figure, lane_labels: list[str]) -> None:
    """Margins (inches) for the lane labels on the left, the time axis below, the title and legend above: what
    ``tight_layout`` found for this chart, computed from the font's advance widths instead of laying out every
    text (a third of the 175B chart's writing time). The widest label is measured with the font Agg draws it in."""
    width_pt = 0.0
    if lane_labels:
        font = get_font(findfont(FontProperties(size=7)))
        font.set_size(7, 72)  # at 72 dpi a pixel is a point
        font.set_text(max(lane_labels, key=len))
        width_pt = font.get_width_height()[0] / 64  # 26.6 fixed point
    inches_w, inches_h = fig.get_size_inches()
    left = (width_pt + 3.5 + 3.5 + 9) / 72  # label, tick pad and length (rcParams defaults), slack
    bottom, top, right = 40 / 72, 44 / 72, 20 / 72  # tick labels and "time (s)"; title over legend; last tick
    fig.subplots_adjust(left=left / inches_w, right=1 - right / inches_w, bottom=bottom / inches_h,
                        top=1 - top / inches_h)


def write_run_chart(run_dir: Path, trace: pd.DataFrame, summary: Summary) -> Path:
    """``sim run`` output plugin: ``RUN_DIR/gantt.png`` with the step's headline numbers in the title, and lanes
    for the busiest links when the run wrote ``link_timeline.csv``."""
    title = (f"{summary.scenario} — step {summary.step_time_s:.3f} s, MFU {summary.mfu:.1%}, "
             f"bubble {summary.bubble_fraction:.1%} ({summary.schedule}, m={summary.microbatches})")
    ranks = default_ranks(trace)
    if ranks is not None:
        title += f"; ranks {', '.join(map(str, ranks))} of {trace['rank'].nunique()}"
    segments = None
    timeline = Path(run_dir) / "link_timeline.csv"
    if timeline.is_file() and summary.busiest_links:
        frame = pd.read_csv(timeline)
        busiest = [link.link for link in summary.busiest_links]
        segments = frame[(frame["src"] + "->" + frame["dst"]).isin(busiest)]
    return write_gantt(trace, Path(run_dir) / "gantt.png", ranks=ranks, title=title, link_segments=segments)
