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
notebook wants) and returns it; ``write_gantt`` writes a file: a PNG drawn straight into an array
(``analysis.gantt_png``: the same content and layout, no figure), SVG and PDF through a bare
``matplotlib.figure.Figure``, so the command line needs no GUI backend and nothing here changes the user's
backend. Entry points (registered in pyproject.toml): ``write_run_chart`` after ``sim run`` writes
``gantt.png``; ``write_gantt`` serves ``sim plot``.

The parts, one concept each: what the chart shows (``analysis.gantt_lanes``), its lanes as a raster
(``analysis.gantt_raster``), its page layout (``analysis.gantt_layout``), the PNG writer (``analysis.gantt_png``,
drawing on ``analysis.gantt_canvas`` with texts set by ``analysis.gantt_text``, encoded by
``analysis.png_encode``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analysis.chart_file import chart_path
from analysis.gantt_lanes import (  # noqa: F401  (re-exported: the names tests and other charts import from here)
    COLORS,
    MAX_RANKS_SHOWN,
    OP_LABELS,
    TIER_COLORS,
    GanttContent,
    _lane_index,
    _lanes,
    _link_names,
    _window,
    compute_blocks,
    default_ranks,
    exposed_blocks,
    gantt_content,
    lane_blocks,
    paint_kinds,
)
from analysis.gantt_layout import (  # noqa: F401
    DPI,
    GRID_ALPHA,
    GRID_WIDTH,
    LABEL_FONT,
    LANE_FONT,
    LEGEND_BORDERAXESPAD,
    LEGEND_COLUMNSPACING,
    LEGEND_FONT,
    LEGEND_HANDLELENGTH,
    MAX_HEIGHT,
    TITLE_FONT,
    TITLE_PAD,
    chart_size,
    figure_size,
    margins,
)
from analysis.gantt_raster import (  # noqa: F401
    BAND,
    COLUMNS,
    EXPOSED_COLOR,
    EXPOSED_SHARE,
    LaneBlocks,
    bands,
    coverage,
    paint,
)
from sim.output.atomic import write_atomically

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from sim.output.summary import Summary


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
    wide enough (``gantt_content``'s rule)."""
    from matplotlib.patches import Patch

    from analysis.gantt_axes import LaneRaster, MicrobatchLabels

    if ax is None:
        import matplotlib.pyplot as plt  # only here: pyplot (the user's backend) for a figure a notebook shows

        _, ax = plt.subplots(figsize=figure_size(trace, ranks, start, end, link_segments))
    content = gantt_content(trace, ranks, start, end, link_segments)
    lo, hi = content.lo, content.hi
    ax.add_image(LaneRaster(ax, content.blocks))
    if len(content.label_text):
        ax.add_collection(MicrobatchLabels(ax, content.label_x, content.label_lane, content.label_text),
                          autolim=False)
    labels = content.lane_labels
    ax.set_yticks(np.arange(len(labels)))
    ax.set_yticklabels(labels, fontsize=LANE_FONT)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("time (s)")
    ax.grid(axis="x", linewidth=GRID_WIDTH, alpha=GRID_ALPHA)
    handles = [Patch(color=color, label=label) for label, color in content.legend]
    # One row of the legend just above the lanes, the title above it (side by side they overlapped once the
    # collectives got their own colours).
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(handles), fontsize=LEGEND_FONT,
              frameon=False, borderaxespad=LEGEND_BORDERAXESPAD, handlelength=LEGEND_HANDLELENGTH,
              columnspacing=LEGEND_COLUMNSPACING)
    if title:
        ax.set_title(title, fontsize=TITLE_FONT, loc="left", pad=TITLE_PAD)
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
    extension of ``path``. A PNG is drawn straight into an array (``analysis.gantt_png``); SVG and PDF render a
    bare ``Figure`` with the format's own canvas: no pyplot, no backend."""
    path = chart_path(path)
    if path.suffix.lower() == ".png":
        from analysis.gantt_png import write_png

        content = gantt_content(trace, ranks, start, end, link_segments)
        write_png(content, path, chart_size(len(content.lane_labels)), title)
        return path
    from matplotlib.figure import Figure

    fig = Figure(figsize=figure_size(trace, ranks, start, end, link_segments), dpi=DPI)
    ax = plot_gantt(trace, fig.subplots(), ranks=ranks, start=start, end=end, title=title,
                    link_segments=link_segments)
    fit_margins(fig, [label.get_text() for label in ax.get_yticklabels()])
    write_atomically(path, lambda temporary: fig.savefig(temporary, dpi=DPI))  # no torn image if killed
    return path


def fit_margins(fig: Figure, lane_labels: list[str]) -> None:
    """Apply ``margins`` (the lane labels on the left, the time axis below, the title and legend above) to
    ``fig``."""
    left, right, bottom, top = margins(lane_labels)
    inches_w, inches_h = fig.get_size_inches()
    fig.subplots_adjust(left=left / inches_w, right=1 - right / inches_w, bottom=bottom / inches_h,
                        top=1 - top / inches_h)


def bubble_text(summary: Summary) -> str:
    """A chart title's idle share of the compute stream: ``bubble 12.6%``, followed by ``, host-bound 28.5%`` where
    the run waited for the host to issue MoE layer passes (summary.json version 2 splits that wait out of the
    bubble, docs/summary.md; shown only where it is non-zero, as ``sim run``'s table does)."""
    text = f"bubble {summary.bubble_fraction:.1%}"
    if summary.host_bound_fraction > 0:
        text += f", host-bound {summary.host_bound_fraction:.1%}"
    return text


def run_title(summary: Summary, trace: pd.DataFrame) -> str:
    """``gantt.png``'s title: the scenario, step time, MFU, bubble (and host-bound share), schedule, micro-batches,
    and the ranks drawn when not all are."""
    title = (f"{summary.scenario} — step {summary.step_time_s:.3f} s, MFU {summary.mfu:.1%}, "
             f"{bubble_text(summary)} ({summary.schedule}, m={summary.microbatches})")
    ranks = default_ranks(trace)
    if ranks is not None:
        title += f"; ranks {', '.join(map(str, ranks))} of {trace['rank'].nunique()}"
    return title


def write_run_chart(run_dir: Path, trace: pd.DataFrame, summary: Summary) -> Path:
    """``sim run`` output plugin: ``RUN_DIR/gantt.png`` with the step's headline numbers in the title
    (``run_title``), and lanes for the busiest links when the run wrote ``link_timeline.csv``."""
    title = run_title(summary, trace)
    ranks = default_ranks(trace)
    segments = None
    timeline = Path(run_dir) / "link_timeline.csv"
    if timeline.is_file() and summary.busiest_links:
        frame = pd.read_csv(timeline)
        busiest = [link.link for link in summary.busiest_links]
        segments = frame[(frame["src"] + "->" + frame["dst"]).isin(busiest)]
    return write_gantt(trace, Path(run_dir) / "gantt.png", ranks=ranks, title=title, link_segments=segments)


def __getattr__(name: str) -> Any:
    """The Matplotlib artists (``LaneRaster``, ``MicrobatchLabels``), loaded from ``analysis.gantt_axes`` when
    first asked for (PEP 562), so importing this module for a PNG loads no Axes machinery."""
    if name in ("LaneRaster", "MicrobatchLabels"):
        from analysis import gantt_axes

        return getattr(gantt_axes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
