"""The Gantt chart's Matplotlib artists (issue 25): the lanes as one image drawn pixel for pixel, the
micro-batch numbers as one collection of glyph outlines.

In: an Axes and ``LaneBlocks`` / label positions (``analysis.gantt_lanes.gantt_content``). Out: artists
``analysis.gantt.plot_gantt`` adds to the Axes. Kept apart so that writing a PNG (``analysis.gantt_png``) loads
none of Matplotlib's Axes machinery: ``sim run``'s chart process imports the plugin module while the parent
simulates, and ``matplotlib.axes`` / ``matplotlib.figure`` are most of what that import cost.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PathCollection
from matplotlib.image import AxesImage
from matplotlib.path import Path as MplPath
from matplotlib.textpath import TextPath
from matplotlib.transforms import IdentityTransform

from analysis.gantt_layout import LABEL_FONT
from analysis.gantt_raster import COLUMNS, LaneBlocks


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

    def __init__(self, ax: Axes, x: np.ndarray, lane: np.ndarray, texts: list[str], fontsize: float = LABEL_FONT):
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
