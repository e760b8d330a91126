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
from pathlib import Path

import matplotlib.colors
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from sim.output.summary import Summary
from sim.workload.ir import STREAMS

COLORS = {
    "forward": "#4C72B0", "backward": "#55A868", "weight": "#64B5CD", "recompute": "#8172B2", "optimizer": "#7F7F7F",
    "tp": "#C44E52", "pp": "#DD8452", "dp": "#937860", "offload": "#DA8BC3",
    "ep": "#CCB974",
}
STREAM_ORDER = {stream: index for index, stream in enumerate(STREAMS)}
TIER_COLORS = {"nvlink": "#2F6B3A", "nic": "#1F4E79", "uplink": "#8B1E3F", "pcie": "#6A5ACD", "host": "#555555"}
MAX_RANKS_SHOWN = 16


def default_ranks(trace: pd.DataFrame, per_stage: int = 2) -> list[int] | None:
    """None (all) for small runs; else the lowest ``per_stage`` ranks of every pipeline stage."""
    if trace["rank"].nunique() <= MAX_RANKS_SHOWN:
        return None
    firsts = trace.groupby("stage")["rank"].unique()
    return sorted(int(r) for ranks in firsts for r in sorted(ranks)[:per_stage])


def compute_blocks(rows: pd.DataFrame, min_gap: float = 0.0) -> pd.DataFrame:
    """Merge a compute stream's consecutive tasks of the same (phase, micro-batch) into one block, where a
    recomputation belongs to the backward phase; a wait longer than ``min_gap`` (idle time worth seeing, such as
    an exposed all-gather) starts a new block."""
    rows = rows.sort_values("start_s", kind="stable")
    phase = rows["kind"].replace({"recompute": "backward"})
    key = phase + ":" + rows["microbatch"].astype(str)
    gap = rows["start_s"] - rows["end_s"].shift()
    group = ((key != key.shift()) | (gap > min_gap)).cumsum()
    return rows.assign(kind=phase).groupby(group, sort=False).agg(
        kind=("kind", "first"), microbatch=("microbatch", "first"), start_s=("start_s", "min"),
        end_s=("end_s", "max"),
    )


def _window(trace: pd.DataFrame, ranks: Sequence[int] | None, start: float | None,
            end: float | None) -> tuple[pd.DataFrame, float, float]:
    """The rows of ``ranks`` overlapping [start, end] (default: the whole step), and that window."""
    frame = trace if ranks is None else trace[trace["rank"].isin(list(ranks))]
    lo = float(frame["start_s"].min()) if start is None else start
    hi = float(frame["end_s"].max()) if end is None else end
    return frame[(frame["end_s"] >= lo) & (frame["start_s"] <= hi)], lo, hi


def _lanes(frame: pd.DataFrame) -> list[tuple[int, int, str]]:
    """(stage, rank, stream) of every lane, stages top to bottom, streams in ``STREAMS`` order."""
    return sorted({(int(s), int(r), st) for s, r, st in frame[["stage", "rank", "stream"]].itertuples(index=False)},
                  key=lambda lane: (lane[0], lane[1], STREAM_ORDER.get(lane[2], 9)))


def _link_names(link_segments: pd.DataFrame | None) -> list[str]:
    return [] if link_segments is None else list(dict.fromkeys(link_segments["src"] + "->" + link_segments["dst"]))


def figure_size(trace: pd.DataFrame, ranks: Sequence[int] | None = None, start: float | None = None,
                end: float | None = None, link_segments: pd.DataFrame | None = None) -> tuple[float, float]:
    """Inches (width, height) that give each lane of the chart a readable row: 16 wide, 0.32 per lane."""
    frame, _, _ = _window(trace, ranks, start, end)
    return 16.0, max(2.5, 0.32 * (len(_lanes(frame)) + len(_link_names(link_segments))) + 1.4)


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
    lanes for ``link_segments``) on ``ax``, or on a new pyplot figure sized by ``figure_size``; return the Axes."""
    frame, lo, hi = _window(trace, ranks, start, end)
    lanes = _lanes(frame)
    links = _link_names(link_segments)
    if ax is None:
        import matplotlib.pyplot as plt  # only here: pyplot (the user's backend) for a figure a notebook shows

        _, ax = plt.subplots(figsize=figure_size(trace, ranks, start, end, link_segments))
    label_width = (hi - lo) / 160  # only blocks wider than this get their micro-batch number
    for y, (_, rank, stream) in enumerate(lanes):
        rows = frame[(frame["rank"] == rank) & (frame["stream"] == stream)]
        blocks = compute_blocks(rows, min_gap=(hi - lo) / 1500) if stream == "compute" else rows
        # Sparse transfers shorter than a pixel (a 175B step's p2p sends) are drawn a pixel wide so none
        # vanish; dense lanes (thousands of TP collectives) keep true widths, or they would read as always busy.
        sparse = stream != "compute" and len(blocks) < 500
        min_width = (hi - lo) / 2000 if sparse else 0.0
        for kind, part in blocks.groupby("kind"):
            widths = (part["end_s"] - part["start_s"]).clip(lower=min_width)
            spans = list(zip(part["start_s"], widths, strict=True))
            ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=COLORS.get(str(kind), "#333333"),
                           edgecolor="white" if stream == "compute" else "none", linewidth=0.3)
        if stream == "compute":
            wide = blocks[(blocks["microbatch"] >= 0) & (blocks["end_s"] - blocks["start_s"] > label_width)]
            for row in wide.itertuples(index=False):
                ax.text((row.start_s + row.end_s) / 2, y, str(row.microbatch), ha="center", va="center",
                        fontsize=6, color="white", clip_on=True)
    for offset, name in enumerate(links):
        assert link_segments is not None
        y = len(lanes) + offset
        rows = link_segments[(link_segments["src"] + "->" + link_segments["dst"]) == name]
        color = matplotlib.colors.to_rgb(TIER_COLORS.get(str(rows["tier"].iloc[0]), "#333333"))
        shades = [(*color, float(min(1.0, max(0.08, load)))) for load in rows["load_fraction"]]
        ax.broken_barh(list(zip(rows["start_s"], rows["end_s"] - rows["start_s"], strict=True)), (y - 0.4, 0.8),
                       facecolors=shades, edgecolor="none")
    labels = [f"stage {s} · rank {r} · {st}" for s, r, st in lanes] + [f"link {name}" for name in links]
    ax.set_yticks(np.arange(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("time (s)")
    ax.grid(axis="x", linewidth=0.3, alpha=0.5)
    drawn = set(frame["kind"].replace({"recompute": "backward"}))
    present = [k for k in COLORS if k in drawn]
    ax.legend(handles=[Patch(color=COLORS[k], label=k) for k in present], loc="lower right",
              bbox_to_anchor=(1.0, 1.0), ncol=len(present), fontsize=8, frameon=False)
    if title:
        ax.set_title(title, fontsize=10, loc="left")
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
    fig = Figure(figsize=figure_size(trace, ranks, start, end, link_segments))
    plot_gantt(trace, fig.subplots(), ranks=ranks, start=start, end=end, title=title, link_segments=link_segments)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    return path


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
