"""The Gantt chart written as a PNG without a Matplotlib figure (issue 25, must-show 2: 500,000 blocks/s).

In: ``GanttContent`` (``analysis.gantt_lanes``), the figure's size in inches, a title. Out: an RGB array drawn the
way ``plot_gantt`` + ``savefig`` lay the chart out (``analysis.gantt_layout``'s margins and ticks, Matplotlib's
default rcParams for line widths, tick lengths and pads, legend spacing), and its PNG bytes.

Why: on the 175B chart (158k tasks) the lanes' raster took a fifth of ``write_run_chart``'s time and the rest was
fixed cost, Matplotlib's frame around it: a ``Tick`` object per lane label (two lines, two texts each), the text
layout of every label twice (measured, then drawn), the legend's packing, and Pillow's PNG encoder on an RGBA
buffer. Here the frame is a few dozen spans of pixels; the texts are FreeType glyph bitmaps in the font, size,
dpi and hinting Agg draws them with (``RendererAgg.draw_text``), each glyph rendered once per chart and placed
by its hinted advance and the pair's kerning at positions known beforehand (``FT2Font.set_text`` shapes every
string anew, ~0.6 ms a call: 60 ms for the 175B chart's texts); the micro-batch numbers are one bitmap per
distinct number stamped by array indexing; and the PNG is one zlib stream of rows under PNG's "Up" filter (rows
within a lane band repeat, so most filtered rows are zeros). Same content and size = same bytes.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.colors
import numpy as np
from matplotlib import ft2font
from matplotlib.font_manager import FontProperties, findfont, get_font

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
PNG_LEVEL = 1  # zlib level: the chart is flat colour, level 6 saves a fifth of the bytes for 1.6x the time
BLACK, WHITE = (0, 0, 0), (255, 255, 255)
# The kerning FT2Font.set_text applies: from Matplotlib 3.11 its text shaping (libraqm) kerns unfitted (scaled, not
# grid-fitted: a pair such as "Va" moves by a fraction of a pixel), before it FT_KERNING_DEFAULT (grid-fitted).
_SHAPED = tuple(int(part) for part in matplotlib.__version__.split(".")[:2]) >= (3, 11)
_KERNING = getattr(ft2font, "Kerning", None)  # Matplotlib >= 3.10; before, integers (FreeType's FT_Kerning_Mode)
KERNING = (_KERNING.UNFITTED if _SHAPED else _KERNING.DEFAULT) if _KERNING is not None else 0


@dataclass(frozen=True)
class Glyph:
    """One character's coverage bitmap (in [0, 1]) with its top-left corner at (pen + dx, baseline + dy) pixels;
    its ascent and descent (whole pixels, hinted), advance (26.6 fixed point) and glyph index (for kerning)."""

    bitmap: np.ndarray
    dx: int
    dy: int
    ascent: int
    descent: int
    advance: int
    index: int


@dataclass(frozen=True)
class TextBitmap:
    """A string's coverage bitmap, its top-left corner at (origin + left, baseline + top) pixels; its advance
    width and the ascent and descent of its glyphs' box (what ``FT2Font.get_width_height`` and ``get_descent``
    give Matplotlib's text layout), in pixels."""

    bitmap: np.ndarray
    left: int
    top: int
    width: float
    ascent: float
    descent: float


class Canvas:
    """An RGB image (rows top to bottom) with Agg's rules for where a line's pixels fall: a line ``width`` pixels
    wide is snapped to pixel centres when its rounded width is odd, to pixel borders when even
    (``PathSnapper`` in Agg), and each pixel it partly covers gets that fraction of its colour."""

    def __init__(self, width: int, height: int, dpi: float):
        self.pixels = np.full((height, width, 3), 255, dtype=np.uint8)
        self.dpi = dpi
        self.glyphs: dict[tuple[str, float], Glyph] = {}
        self.texts: dict[tuple[str, float], TextBitmap] = {}

    @property
    def height(self) -> int:
        return self.pixels.shape[0]

    def px(self, points: float) -> float:
        return points * self.dpi / 72

    @staticmethod
    def _span(centre: float, width: float, snap: bool) -> tuple[np.ndarray, np.ndarray]:
        """The pixels a span [centre - width/2, centre + width/2] covers and the share of each it covers."""
        if snap:
            centre = float(np.floor(centre)) + 0.5 if round(width) % 2 else float(np.round(centre))
        lo, hi = centre - width / 2, centre + width / 2
        index = np.arange(int(np.floor(lo)), int(np.ceil(hi)))
        share = np.clip(np.minimum(index + 1, hi) - np.maximum(index, lo), 0.0, 1.0)
        return index, share

    def blend(self, top: int, left: int, alpha: np.ndarray, color: tuple[int, int, int]) -> None:
        """Mix ``color`` into the pixels of the rectangle whose top-left pixel is (top, left) by ``alpha`` (a 2-D
        array in [0, 1], the rectangle's shape); what falls outside the image is left out."""
        h, w = alpha.shape
        r0, c0 = max(top, 0), max(left, 0)
        r1, c1 = min(top + h, self.height), min(left + w, self.pixels.shape[1])
        if r1 <= r0 or c1 <= c0:
            return
        alpha = alpha[r0 - top:r1 - top, c0 - left:c1 - left]
        region = self.pixels[r0:r1, c0:c1]
        old = region.astype(np.float32)
        mix = old + (np.asarray(color, dtype=np.float32) - old) * alpha[..., None]
        region[...] = np.rint(mix).astype(np.uint8)

    def hline(self, y: float, x0: float, x1: float, width: float, color: tuple[int, int, int],
              alpha: float = 1.0) -> None:
        """A horizontal line at image row coordinate ``y`` (pixel i spans [i, i+1)) from x0 to x1, ``width``
        pixels thick."""
        rows, share = self._span(y, width, snap=True)
        c0, c1 = int(np.floor(x0 + 0.5)), int(np.floor(x1 + 0.5))
        if len(rows) and c1 > c0:
            self.blend(int(rows[0]), c0, np.repeat(share[:, None] * alpha, c1 - c0, axis=1), color)

    def vline(self, x: float, y0: float, y1: float, width: float, color: tuple[int, int, int],
              alpha: float = 1.0) -> None:
        """A vertical line at column coordinate ``x`` from row coordinate y0 to y1, ``width`` pixels thick."""
        cols, share = self._span(x, width, snap=True)
        r0, r1 = int(np.floor(y0 + 0.5)), int(np.floor(y1 + 0.5))
        if len(cols) and r1 > r0:
            self.blend(r0, int(cols[0]), np.repeat(share[None, :] * alpha, r1 - r0, axis=0), color)

    def rect(self, x0: float, y0: float, x1: float, y1: float, color: tuple[int, int, int]) -> None:
        """A filled rectangle, partly covered border pixels blended by their share."""
        cols, col_share = self._span((x0 + x1) / 2, x1 - x0, snap=False)
        rows, row_share = self._span((y0 + y1) / 2, y1 - y0, snap=False)
        if len(rows) and len(cols):
            self.blend(int(rows[0]), int(cols[0]), row_share[:, None] * col_share[None, :], color)

    def paste_rows(self, top: int, left: int, palette: np.ndarray, rows: np.ndarray) -> None:
        """Row ``top + i`` from column ``left`` on becomes ``palette[rows[i]]`` (RGB(A) rows; alpha dropped): one
        slice assignment per run of equal rows, as a lane band's rows repeat, each row copied as one run of
        bytes (a pixel at a time, 3 bytes each, took 30 ms on the 175B chart)."""
        if not len(rows):
            return
        width = palette.shape[1]
        flat = np.ascontiguousarray(palette[:, :, :3]).reshape(len(palette), width * 3)
        image = self.pixels.reshape(self.height, -1)  # a view: the pixels are C-contiguous
        cuts = np.flatnonzero(rows[1:] != rows[:-1]) + 1
        for a, b in zip(np.concatenate([[0], cuts]).tolist(), np.concatenate([cuts, [len(rows)]]).tolist(),
                        strict=True):
            image[top + a:top + b, left * 3:(left + width) * 3] = flat[rows[a]]

    # ------------------------------------------------------------------------------------------------ text
    def _glyph(self, font: Any, char: str, size: float) -> Glyph:
        """``char``'s bitmap at ``size`` (the font already set to it), rendered once per chart: FreeType's
        autohinter costs ~40 us a glyph, and ``FT2Font.set_text`` shapes a whole string per call (~0.6 ms)."""
        key = (char, size)
        glyph = self.glyphs.get(key)
        if glyph is None:
            index = font.get_char_index(ord(char))
            # A character the font lacks (a scenario named in CJK, a tab in a title): the font's .notdef box,
            # as Agg draws one (Matplotlib 3.11's load_char raises "No glyphs have been loaded" for it).
            loaded = font.load_char(ord(char), flags=hinting_flag()) if index else \
                font.load_glyph(0, flags=hinting_flag())
            bearing_x, bearing_y = loaded.horiBearingX // 64, loaded.horiBearingY // 64
            pad_x = 2 + max(0, -bearing_x)
            shape = (loaded.height // 64 + 4, loaded.width // 64 + bearing_x + pad_x + 4)
            try:
                image: Any = np.zeros(shape, dtype=np.uint8)  # Matplotlib >= 3.10 draws into an array
                font.draw_glyph_to_bitmap(image, pad_x, 2, loaded, antialiased=True)
            except TypeError:  # older: into an FT2Image
                image = ft2font.FT2Image(shape[1], shape[0])  # type: ignore[attr-defined]
                font.draw_glyph_to_bitmap(image, pad_x, 2, loaded, antialiased=True)
            glyph = Glyph(np.asarray(image, dtype=np.float32) / 255, -pad_x, -bearing_y - 2, bearing_y,
                          (loaded.height - loaded.horiBearingY) // 64, loaded.horiAdvance,
                          index)
            self.glyphs[key] = glyph
        return glyph

    def text_bitmap(self, text: str, size: float) -> TextBitmap:
        """``text`` at ``size`` points as FreeType lays it out for Agg (``RendererAgg.draw_text``: the font at
        the figure's dpi, Matplotlib's hinting flag, antialiased): each glyph at the pen position, which moves by
        its hinted advance plus the pair's kerning; a glyph is drawn at the pen's whole pixel (FreeType would
        shift its outline by the kerning's fraction before rasterising it)."""
        key = (text, size)
        cached = self.texts.get(key)
        if cached is not None:
            return cached
        font: Any = get_font(findfont(FontProperties(size=size)))
        font.set_size(size, self.dpi)
        glyphs = [self._glyph(font, char, size) for char in text]
        pen, previous, origins = 0, None, []
        for glyph in glyphs:
            if previous is not None:
                pen += font.get_kerning(previous, glyph.index, KERNING)
            origins.append(pen // 64)
            pen += glyph.advance
            previous = glyph.index
        if not glyphs:
            result = TextBitmap(np.zeros((0, 0), dtype=np.float32), 0, 0, 0.0, 0.0, 0.0)
        else:
            left = min(o + g.dx for o, g in zip(origins, glyphs, strict=True))
            top = min(g.dy for g in glyphs)
            right = max(o + g.dx + g.bitmap.shape[1] for o, g in zip(origins, glyphs, strict=True))
            bottom = max(g.dy + g.bitmap.shape[0] for g in glyphs)
            bitmap = np.zeros((bottom - top, right - left), dtype=np.float32)
            for origin, glyph in zip(origins, glyphs, strict=True):
                r, c = glyph.dy - top, origin + glyph.dx - left
                h, w = glyph.bitmap.shape
                np.maximum(bitmap[r:r + h, c:c + w], glyph.bitmap, out=bitmap[r:r + h, c:c + w])
            result = TextBitmap(bitmap, left, top, pen / 64, float(max(g.ascent for g in glyphs)),
                                float(max(g.descent for g in glyphs)))
        self.texts[key] = result
        return result

    def line_metrics(self, size: float) -> tuple[float, float]:
        """(height, descent) of a line of text at ``size`` points, as Matplotlib's text layout takes them: at
        least those of "lp" (``Text._get_layout``), so labels with and without descenders line up."""
        metrics = self.text_bitmap("lp", size)
        return metrics.ascent + metrics.descent, metrics.descent

    def text(self, text: str, x: float, y: float, size: float, ha: str = "left", va: str = "baseline",
             color: tuple[int, int, int] = BLACK) -> None:
        """Draw ``text`` anchored at (x, y) (image coordinates, rows down) with Matplotlib's alignments: ha
        left / center / right on the advance width; va baseline / top / center_baseline / bottom on the line's
        height and descent (at least those of "lp")."""
        drawn = self.text_bitmap(text, size)
        line_height, line_descent = self.line_metrics(size)
        height = max(drawn.ascent + drawn.descent, line_height)
        descent = max(drawn.descent, line_descent)
        left = x - {"left": 0.0, "center": drawn.width / 2, "right": drawn.width}[ha]
        baseline = y + {"baseline": 0.0, "top": height - descent, "center_baseline": (height - descent) / 2,
                        "bottom": -descent}[va]
        self.blend(int(round(baseline)) + drawn.top, int(round(left)) + drawn.left, drawn.bitmap, color)

    def stamp(self, text: str, x: np.ndarray, y: np.ndarray, size: float, color: tuple[int, int, int]) -> None:
        """Draw ``text`` centred (on its inked pixels) at every (x, y): one indexing operation for all of them."""
        bitmap = self.text_bitmap(text, size).bitmap
        inked_rows, inked_cols = np.flatnonzero(bitmap.any(axis=1)), np.flatnonzero(bitmap.any(axis=0))
        if not len(inked_rows) or not len(x):
            return
        bitmap = bitmap[inked_rows[0]:inked_rows[-1] + 1, inked_cols[0]:inked_cols[-1] + 1]
        h, w = bitmap.shape
        top = np.rint(y - h / 2).astype(np.int64)
        left = np.rint(x - w / 2).astype(np.int64)
        inside = (top >= 0) & (left >= 0) & (top + h <= self.height) & (left + w <= self.pixels.shape[1])
        rows = top[inside, None, None] + np.arange(h)[None, :, None]
        cols = left[inside, None, None] + np.arange(w)[None, None, :]
        old = self.pixels[rows, cols].astype(np.float32)
        mix = old + (np.asarray(color, dtype=np.float32) - old) * bitmap[None, :, :, None]
        self.pixels[rows, cols] = np.rint(mix).astype(np.uint8)


def hinting_flag() -> Any:
    """The ``text.hinting`` rcParam as FreeType load flags, mapped as ``matplotlib.backends.backend_agg``'s
    ``get_hinting_flag`` maps it (the same table: importing the Agg backend for it took 0.1-0.3 s of the chart
    process's start in ``sim run``)."""
    flags = getattr(ft2font, "LoadFlags", None)  # Matplotlib >= 3.10; before, LOAD_* integers
    names: dict[Any, str] = {
        "default": "DEFAULT", "no_autohint": "NO_AUTOHINT", "force_autohint": "FORCE_AUTOHINT",
        "no_hinting": "NO_HINTING", True: "FORCE_AUTOHINT", False: "NO_HINTING", "either": "DEFAULT",
        "native": "NO_AUTOHINT", "auto": "FORCE_AUTOHINT", "none": "NO_HINTING"}
    name = names[matplotlib.rcParams["text.hinting"]]
    return getattr(flags, name) if flags is not None else getattr(ft2font, f"LOAD_{name}")


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
    below_labels = label_top + canvas.line_metrics(TICK_FONT)[0]
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
    baseline = top_y - (LEGEND_BORDERAXESPAD + LEGEND_BORDERPAD) * em - canvas.line_metrics(LEGEND_FONT)[1]
    edge = canvas.px(PATCH_EDGE) / 2
    for label, color in content.legend:
        handle_w = LEGEND_HANDLELENGTH * em
        canvas.rect(x - edge, baseline - LEGEND_HANDLEHEIGHT * em - edge, x + handle_w + edge, baseline + edge,
                    _rgb(color))
        x += handle_w + LEGEND_HANDLETEXTPAD * em
        canvas.text(label, x, baseline, LEGEND_FONT)
        x += canvas.text_bitmap(label, LEGEND_FONT).width + LEGEND_COLUMNSPACING * em
    if title:
        canvas.text(title, ax_x0, top_y - canvas.px(TITLE_PAD), TITLE_FONT)
    return canvas.pixels


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(rgb: np.ndarray, dpi: float = DPI) -> bytes:
    """PNG bytes of an (height, width, 3) uint8 image (PNG spec, ISO/IEC 15948: IHDR 8-bit truecolour, pHYs in
    pixels per metre, one IDAT of the zlib-compressed rows, each under filter type 2, "Up": the byte minus the
    one above it, modulo 256)."""
    height, width = rgb.shape[:2]
    flat = np.ascontiguousarray(rgb).reshape(height, width * 3)
    rows = np.empty((height, width * 3 + 1), dtype=np.uint8)
    rows[:, 0] = 2
    rows[0, 1:] = flat[0]
    np.subtract(flat[1:], flat[:-1], out=rows[1:, 1:])  # uint8: wraps modulo 256 as the filter wants
    per_metre = int(round(dpi / 0.0254))
    return b"".join([
        b"\x89PNG\r\n\x1a\n",
        _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)),
        _chunk(b"pHYs", struct.pack(">IIB", per_metre, per_metre, 1)),
        _chunk(b"IDAT", zlib.compress(rows.data, PNG_LEVEL)),
        _chunk(b"IEND", b""),
    ])


def write_png(content: GanttContent, path: Path | str, size: tuple[float, float], title: str | None = None,
              dpi: float = DPI) -> Path:
    """``render`` the chart and write it to ``path`` as a PNG, whole or not at all (``write_atomically``)."""
    data = encode_png(render(content, size, title, dpi), dpi)
    return write_atomically(Path(path), lambda temporary: temporary.write_bytes(data))
