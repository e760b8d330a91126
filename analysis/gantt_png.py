"""The Gantt chart written as a PNG without a Matplotlib figure (issue 25, must-show 2: 500,000 blocks/s).

In: ``GanttContent`` (``analysis.gantt_lanes``), the figure's size in inches, a title. Out: an RGB array drawn the
way ``plot_gantt`` + ``savefig`` lay the chart out (``analysis.gantt_layout``'s margins and ticks, Matplotlib's
default rcParams for line widths, tick lengths and pads, legend spacing), and its PNG bytes.

Why: on the 175B chart (158k tasks) the lanes' raster took a fifth of ``write_run_chart``'s time and the rest was
fixed cost, Matplotlib's frame around it: a ``Tick`` object per lane label (two lines, two texts each), the text
layout of every label twice (measured, then drawn), the legend's packing, and Pillow's PNG encoder on an RGBA
buffer. Here the frame is a few dozen spans of pixels (``analysis.gantt_canvas``: Agg's rules for where a line's
pixels fall); the texts are FreeType glyph bitmaps in the font, size, dpi and hinting Agg draws them with, each
glyph rendered once per chart (``analysis.gantt_text``); the micro-batch numbers are one bitmap per distinct number
stamped by array indexing; and the PNG is one zlib stream of rows under PNG's "Up" filter
(``analysis.png_encode``). Same content and size = same bytes.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.colors
import numpy as np

from analysis.gantt_canvas import BLACK, WHITE, Canvas
from analysis.gantt_lanes import GanttContent
from analysis.gantt_layout import (
    DPI,
    GRID_ALPHA,
    GRID_WIDTH,
    LABEL_FONT,
    LANE_FONT,
    LEGEND_BORDERAXESPAD,
    LEGEND_COLUMNSPACING,
    LEGEND_FONT,
    LEGEND_HANDLELENGTH,
    TICK_FONT,
    TITLE_FONT,
    TITLE_PAD,
    margins,
    time_ticks,
)
from analysis.gantt_raster import band_rows
from analysis.png_encode import encode_png
from sim.output.atomic import write_atomically

# Matplotlib's defaults (rcParams), in points: what an Axes drawn by ``plot_gantt`` uses.
SPINE_WIDTH = 0.8  # axes.linewidth
TICK_LENGTH, TICK_WIDTH, TICK_PAD = 3.5, 0.8, 3.5  # xtick/ytick.major.size, .width, .pad
LABEL_PAD = 4.0  # axes.labelpad: "time (s)" under the tick labels
OFFSET_PAD = 3.0  # XAxis.OFFSETTEXTPAD: a ScalarFormatter offset ("+1e2") under the tick labels' right end
GRID_COLOR = "#b0b0b0"  # grid.color (its width and alpha: gantt_layout's, as plot_gantt sets them)
# the legend's defaults, in units of its font size (legend.borderpad, .handleheight, .handletextpad; the rest:
# gantt_layout's, as plot_gantt sets them)
LEGEND_BORDERPAD, LEGEND_HANDLEHEIGHT, LEGEND_HANDLETEXTPAD = 0.4, 0.7, 0.8
PATCH_EDGE = 1.0  # patch.linewidth: a legend patch's edge, in its face colour


def _rgb(color: str) -> tuple[int, int, int]:
    r, g, b = matplotlib.colors.to_rgb(color)
    return int(round(r * 255)), int(round(g * 255)), int(round(b * 255))


def render(content: GanttContent, size: tuple[float, float], title: str | None = None,
           dpi: float = DPI) -> np.ndarray:
    """The chart as an (height, width, 3) uint8 array: ``size`` inches at ``dpi``, laid out as ``write_gantt``'s
    Matplotlib figure would be (``margins``; the lanes' raster 1:1 in the Axes' pixels as ``LaneRaster`` draws
    it; micro-batch numbers, x grid, ticks, spines, lane and tick labels, "time (s)", the legend's row above the
    lanes and the title above it)."""
    fig_w, fig_h = size[0] * dpi, size[1] * dpi
    # whole pixels as Agg's canvas takes them (int of the figure's box, which Matplotlib computes through an
    # affine transform: 2.68 in x 150 dpi comes out a hair above 402, the plain product a hair below)
    canvas = Canvas(int(fig_w + 1e-6), int(fig_h + 1e-6), dpi)
    height = canvas.height
    left, right, bottom, top = (m * dpi for m in margins(content.lane_labels))
    # the Axes' box in display coordinates (points up from the bottom), as subplots_adjust places it
    ax_x0, ax_x1, ax_y0, ax_y1 = left, fig_w - right, bottom, fig_h - top
    blocks = content.blocks
    rows = blocks.lanes + blocks.links
    # the raster, rounded to output pixels as LaneRaster.make_image rounds it
    x0, x1 = int(np.floor(ax_x0 + 0.5)), int(np.floor(ax_x1 + 0.5 + 1e-8))
    y0, y1 = int(np.ceil(ax_y0 - 0.5 - 1e-8)), int(np.ceil(ax_y1 - 0.5))
    if x1 > x0 and y1 > y0 and rows:
        canvas.paste_rows(height - y1, x0, blocks.palette(x1 - x0), band_rows(rows, y1 - y0))

    # image coordinates (rows down) of the Axes' edges and of data positions
    top_y, bottom_y = height - ax_y1, height - ax_y0
    span = content.hi - content.lo if content.hi > content.lo else 1.0

    def x_of(t: np.ndarray | float) -> np.ndarray | float:
        return ax_x0 + (np.asarray(t) - content.lo) / span * (ax_x1 - ax_x0)

    def y_of(lane: np.ndarray | float) -> np.ndarray | float:  # lane i's centre; lanes span [-0.5, rows - 0.5]
        return top_y + (np.asarray(lane) + 0.5) / max(rows, 1) * (bottom_y - top_y)

    # micro-batch numbers, white, centred on their blocks (MicrobatchLabels)
    texts = np.asarray(content.label_text, dtype=object)
    for text in dict.fromkeys(content.label_text):
        mine = texts == text
        canvas.stamp(text, np.asarray(x_of(content.label_x[mine])), np.asarray(y_of(content.label_lane[mine])),
                     LABEL_FONT, WHITE)
    # x grid at the time ticks (zorder 1.5, over the raster), the ticks, their labels and the axis label
    ticks, tick_labels, offset = time_ticks(content.lo, content.hi, (ax_x1 - ax_x0) * 72 / dpi)
    tick_px, tick_w, spine_w = canvas.px(TICK_LENGTH), canvas.px(TICK_WIDTH), canvas.px(SPINE_WIDTH)
    for value in ticks:
        canvas.vline(float(x_of(value)), top_y, bottom_y, canvas.px(GRID_WIDTH), _rgb(GRID_COLOR), GRID_ALPHA)
    label_top = bottom_y + tick_px + canvas.px(TICK_PAD)
    for value, label in zip(ticks, tick_labels, strict=True):
        x = float(x_of(value))
        canvas.vline(x, bottom_y, bottom_y + tick_px, tick_w, BLACK)
        canvas.text(label, x, label_top, TICK_FONT, ha="center", va="top")
    below_labels = label_top + canvas.typesetter.line_metrics(TICK_FONT)[0]
    if offset:
        canvas.text(offset, ax_x1, below_labels + canvas.px(OFFSET_PAD), TICK_FONT, ha="right", va="top")
    canvas.text("time (s)", (ax_x0 + ax_x1) / 2, below_labels + canvas.px(LABEL_PAD), TICK_FONT, ha="center",
                va="top")
    # lane ticks and labels
    for lane, label in enumerate(content.lane_labels):
        y = float(y_of(lane))
        canvas.hline(y, ax_x0 - tick_px, ax_x0, tick_w, BLACK)
        canvas.text(label, ax_x0 - tick_px - canvas.px(TICK_PAD), y, LANE_FONT, ha="right", va="center_baseline")
    # spines (projecting caps: each reaches half its width past the corners)
    half = spine_w / 2
    canvas.hline(top_y, ax_x0 - half, ax_x1 + half, spine_w, BLACK)
    canvas.hline(bottom_y, ax_x0 - half, ax_x1 + half, spine_w, BLACK)
    canvas.vline(ax_x0, top_y - half, bottom_y + half, spine_w, BLACK)
    canvas.vline(ax_x1, top_y - half, bottom_y + half, spine_w, BLACK)
    # the legend: one row, lower left at the Axes' top left corner plus its padding, handles on the baseline
    em = canvas.px(LEGEND_FONT)
    x = ax_x0 + (LEGEND_BORDERAXESPAD + LEGEND_BORDERPAD) * em
    baseline = top_y - (LEGEND_BORDERAXESPAD + LEGEND_BORDERPAD) * em - canvas.typesetter.line_metrics(LEGEND_FONT)[1]
    edge = canvas.px(PATCH_EDGE) / 2
    for label, color in content.legend:
        handle_w = LEGEND_HANDLELENGTH * em
        canvas.rect(x - edge, baseline - LEGEND_HANDLEHEIGHT * em - edge, x + handle_w + edge, baseline + edge,
                    _rgb(color))
        x += handle_w + LEGEND_HANDLETEXTPAD * em
        canvas.text(label, x, baseline, LEGEND_FONT)
        x += canvas.typesetter.text_bitmap(label, LEGEND_FONT).width + LEGEND_COLUMNSPACING * em
    if title:
        canvas.text(title, ax_x0, top_y - canvas.px(TITLE_PAD), TITLE_FONT)
    return canvas.pixels



def write_png(content: GanttContent, path: Path | str, size: tuple[float, float], title: str | None = None,
              dpi: float = DPI) -> Path:
    """``render`` the chart and write it to ``path`` as a PNG, whole or not at all (``write_atomically``)."""
    data = encode_png(render(content, size, title, dpi), dpi)
    return write_atomically(Path(path), lambda temporary: temporary.write_bytes(data))
