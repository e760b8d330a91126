"""An RGB image drawn with Agg's rules for lines, rectangles and text, as numpy array operations.

In: image coordinates (rows down, pixel i spans [i, i+1)), widths in pixels, RGB colours, alpha; texts set by
``analysis.gantt_text``. Out: the ``pixels`` array (height, width, 3) uint8: lines snapped as Agg's
``PathSnapper`` snaps them, partly covered pixels blended by their share, rows of a raster pasted as runs of
bytes, a text's bitmap blended at its anchor, or stamped at many positions in one indexing operation.
"""

from __future__ import annotations

import numpy as np

from analysis.gantt_text import Typesetter

BLACK, WHITE = (0, 0, 0), (255, 255, 255)


class Canvas:
    """An RGB image (rows top to bottom) with Agg's rules for where a line's pixels fall: a line ``width`` pixels
    wide is snapped to pixel centres when its rounded width is odd, to pixel borders when even
    (``PathSnapper`` in Agg), and each pixel it partly covers gets that fraction of its colour."""

    def __init__(self, width: int, height: int, dpi: float):
        self.pixels = np.full((height, width, 3), 255, dtype=np.uint8)
        self.dpi = dpi
        self.typesetter = Typesetter(dpi)

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

    def text(self, text: str, x: float, y: float, size: float, ha: str = "left", va: str = "baseline",
             color: tuple[int, int, int] = BLACK) -> None:
        """Draw ``text`` anchored at (x, y) (image coordinates, rows down) with Matplotlib's alignments: ha
        left / center / right on the advance width; va baseline / top / center_baseline / bottom on the line's
        height and descent (at least those of "lp")."""
        drawn = self.typesetter.text_bitmap(text, size)
        line_height, line_descent = self.typesetter.line_metrics(size)
        height = max(drawn.ascent + drawn.descent, line_height)
        descent = max(drawn.descent, line_descent)
        left = x - {"left": 0.0, "center": drawn.width / 2, "right": drawn.width}[ha]
        baseline = y + {"baseline": 0.0, "top": height - descent, "center_baseline": (height - descent) / 2,
                        "bottom": -descent}[va]
        self.blend(int(round(baseline)) + drawn.top, int(round(left)) + drawn.left, drawn.bitmap, color)

    def stamp(self, text: str, x: np.ndarray, y: np.ndarray, size: float, color: tuple[int, int, int]) -> None:
        """Draw ``text`` centred (on its inked pixels) at every (x, y): one indexing operation for all of them."""
        bitmap = self.typesetter.text_bitmap(text, size).bitmap
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
