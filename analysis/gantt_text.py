"""Text as Agg draws it, without Agg: FreeType glyph bitmaps laid out into one coverage bitmap per string.

In: a string, a size in points and the dpi. Out: the string's coverage bitmap (values in [0, 1]) with its offset
from the pen's origin, its advance width, ascent and descent, in pixels; the height and descent of a line of text
as Matplotlib's text layout takes them. The font, size, dpi and hinting are those ``RendererAgg.draw_text`` uses;
each glyph is rendered once per chart and placed by its hinted advance and the pair's kerning at positions known
beforehand (``FT2Font.set_text`` shapes every string anew, ~0.6 ms a call: 60 ms for the 175B chart's texts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import matplotlib
import numpy as np
from matplotlib import ft2font
from matplotlib.font_manager import FontProperties, findfont, get_font

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


class Typesetter:
    """Strings set at a dpi: glyphs and laid-out strings cached per (text, size) for the chart's lifetime."""

    def __init__(self, dpi: float):
        self.dpi = dpi
        self.glyphs: dict[tuple[str, float], Glyph] = {}
        self.texts: dict[tuple[str, float], TextBitmap] = {}

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
