"""The Gantt chart's lanes as one raster (issue 25): blocks -> per pixel column the share of its time each kind
covers -> each lane's colour per column -> the RGBA image of the lane bands, with the exposed-communication strip.

In: ``LaneBlocks`` (what ``analysis.gantt_lanes.lane_blocks`` makes of a trace) and a size in pixels. Out: an
(height, columns, 4) uint8 array, drawn 1:1 by ``analysis.gantt.LaneRaster`` on an Axes or pasted by
``analysis.gantt_png`` into the written chart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import matplotlib.colors
import numpy as np

EXPOSED_COLOR = "#D62728"  # the strip under communication that runs while its rank's compute stream idles
EXPOSED_SHARE = 0.3  # of a lane's painted band, at its bottom

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
    # what each lane's column takes from white, summed kind by kind: a handful of kinds, so a loop of array
    # operations beats einsum's generic loop (30 ms on the 175B chart) and BLAS (whose threads stall on a busy
    # machine: 100 ms)
    ink = np.zeros(cover.shape[1:] + (3,))
    for k in range(cover.shape[0]):
        ink += cover[k][..., None] * (1.0 - colors[k])
    return np.clip(1.0 - ink * scale[..., None], 0.0, 1.0)


def band_palette(lane_colors: np.ndarray, marks: np.ndarray | None = None) -> np.ndarray:
    """The distinct rows of the lanes' image (2 lanes + 1, columns, 4; RGBA uint8): each lane's colours, the same
    with ``marks`` (lanes, columns; in [0, 1]) blending ``EXPOSED_COLOR`` in, and white (the gaps)."""
    lanes, columns = lane_colors.shape[:2]
    rgba = np.full((2 * lanes + 1, columns, 4), 255, dtype=np.uint8)
    rgba[:lanes, :, :3] = np.rint(lane_colors * 255)
    marked = lane_colors if marks is None else lane_colors + marks[..., None] * (
        np.array(matplotlib.colors.to_rgb(EXPOSED_COLOR)) - lane_colors)
    rgba[lanes:2 * lanes, :, :3] = np.rint(marked * 255)
    return rgba


def band_rows(lanes: int, height: int) -> np.ndarray:
    """Which ``band_palette`` row each of ``height`` image rows shows: lane ``i`` owns the rows whose centre
    falls in [i, i + 1) of ``height / lanes`` rows per lane and paints the middle ``BAND`` of them (its bottom
    ``EXPOSED_SHARE`` from the marked row); the rest is white."""
    centre = (np.arange(height) + 0.5) * lanes / height  # each row's centre in lane units (lane i spans [i, i+1))
    lane = np.minimum(centre.astype(np.int64), lanes - 1)
    offset = centre - lane - 0.5  # -BAND/2 at the band's top, +BAND/2 at its bottom (origin upper)
    bottom = offset > BAND / 2 - EXPOSED_SHARE * BAND
    return np.where(np.abs(offset) <= BAND / 2, np.where(bottom, lane + lanes, lane), 2 * lanes)


def bands(lane_colors: np.ndarray, height: int, marks: np.ndarray | None = None) -> np.ndarray:
    """The chart's image (``height`` rows, columns, 4; RGBA uint8, which Matplotlib draws without converting):
    each row the ``band_palette`` row ``band_rows`` gives it."""
    return band_palette(lane_colors, marks)[band_rows(lane_colors.shape[0], height)]


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
        # only the kinds present get a coverage plane (a chart paints about half of ``COLORS``)
        present = np.flatnonzero(np.bincount(self.kind, minlength=len(self.colors)))
        renumber = np.zeros(len(self.colors), dtype=np.int64)
        renumber[present] = np.arange(len(present))
        colors = paint(coverage(self.lane, renumber[self.kind], start, end, self.lanes, len(present), self.lo,
                                self.hi, columns), self.colors[present])
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

    def palette(self, columns: int) -> np.ndarray:
        """The distinct rows of the chart's image (``band_palette``), ``columns`` pixels wide."""
        return band_palette(self.lane_colors(columns), self.exposed(columns))

    def image(self, columns: int, height: int) -> np.ndarray:
        """The chart's RGBA image, ``height`` x ``columns`` pixels."""
        return self.palette(columns)[band_rows(self.lanes + self.links, height)]
