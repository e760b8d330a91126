"""The Gantt chart's page layout, shared by the Matplotlib Axes it can be drawn on and the PNG written without
one: the figure's size in inches from its lane count, the margins around the lanes, the time axis' ticks.

In: a trace (or the lane labels, or the time window and the axis' length). Out: inches, margins as fractions
of the figure, tick values and their labels as Matplotlib's ``AutoLocator`` and ``ScalarFormatter`` give them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib import ticker
from matplotlib.font_manager import FontProperties, findfont, get_font

from analysis.gantt_lanes import _lanes, _link_names, _window

DPI = 150  # the written chart's resolution
MAX_HEIGHT = 24.0  # inches: above it, lanes get thinner
LANE_FONT = 7.0  # points: the lane labels
TICK_FONT = 10.0  # points: the time axis' tick labels and its label (rcParams font.size)
TITLE_FONT = 10.0
LEGEND_FONT = 8.0
LABEL_FONT = 6.0  # the micro-batch numbers
TITLE_PAD = 18.0  # points between the lanes' top and the title's baseline (the legend's row is between)
GRID_WIDTH, GRID_ALPHA = 0.3, 0.5  # the time axis' grid lines: points, opacity
# the legend's row above the lanes, in units of its font size (Matplotlib's Legend arguments)
LEGEND_BORDERAXESPAD, LEGEND_HANDLELENGTH, LEGEND_COLUMNSPACING = 0.2, 1.5, 1.2


def figure_size(trace: pd.DataFrame, ranks: Sequence[int] | None = None, start: float | None = None,
                end: float | None = None, link_segments: pd.DataFrame | None = None) -> tuple[float, float]:
    """Inches (width, height) of the chart of ``trace``'s window (``chart_size`` of its lane count)."""
    frame, _, _ = _window(trace, ranks, start, end)
    return chart_size(len(_lanes(frame)) + len(_link_names(link_segments)))


def chart_size(lanes: int) -> tuple[float, float]:
    """Inches (width, height) that give each of ``lanes`` a readable row: 16 wide, 0.32 per lane up to
    ``MAX_HEIGHT``, then thinner lanes (not under 0.16 inch, still taller than their 7-point label): a 32-stage
    pipeline's 128 lanes at 0.32 inch made a 2,400 x 6,400-pixel image whose drawing and PNG encoding took
    longer than simulating the step."""
    per_lane = max(0.16, min(0.32, (MAX_HEIGHT - 1.4) / max(lanes, 1)))
    return 16.0, max(2.5, per_lane * lanes + 1.4)


def margins(lane_labels: Sequence[str]) -> tuple[float, float, float, float]:
    """Margins in inches (left, right, bottom, top) for the lane labels on the left, the time axis below, the
    title and legend above: what ``tight_layout`` found for this chart, computed from the font's advance widths
    instead of laying out every text (a third of the 175B chart's writing time). The widest label is measured
    with the font Agg draws it in."""
    width_pt = 0.0
    if lane_labels:
        font = get_font(findfont(FontProperties(size=LANE_FONT)))
        font.set_size(LANE_FONT, 72)  # at 72 dpi a pixel is a point
        font.set_text(max(lane_labels, key=len))
        width_pt = font.get_width_height()[0] / 64  # 26.6 fixed point
    left = (width_pt + 3.5 + 3.5 + 9) / 72  # label, tick pad and length (rcParams defaults), slack
    return left, 20 / 72, 40 / 72, 44 / 72  # last tick; tick labels and "time (s)"; title over legend


def time_ticks(lo: float, hi: float, length_pt: float) -> tuple[np.ndarray, list[str], str]:
    """The time axis' major ticks over [lo, hi] on an axis ``length_pt`` points long, as an Axes would draw them:
    ``AutoLocator`` (``MaxNLocator`` with steps 1, 2, 2.5, 5, 10 and one bin per three tick-label font sizes,
    ``XAxis.get_tick_space``, at most 9: ``MaxNLocator._raw_ticks`` for nbins 'auto'), the ticks inside the
    view, labelled by ``ScalarFormatter``. Returns the values,
    their labels and the formatter's offset text ('' when none)."""
    bins = min(max(int(np.floor(length_pt / (3 * TICK_FONT))), 1), 9)
    values = np.asarray(ticker.MaxNLocator(nbins=bins, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi), dtype=float)
    slack = (hi - lo) * 1e-10
    values = values[(values >= lo - slack) & (values <= hi + slack)]
    formatter = ticker.ScalarFormatter()
    formatter.create_dummy_axis()
    formatter.axis.set_view_interval(lo, hi)  # type: ignore[union-attr]
    formatter.axis.set_data_interval(lo, hi)  # type: ignore[union-attr]
    return values, formatter.format_ticks(values), formatter.get_offset()  # type: ignore[arg-type]
