"""The Gantt chart written as a PNG without a Matplotlib figure (analysis/gantt_png.py, issue 25): a valid PNG,
the same bytes for the same trace; lines cover the pixels Agg's snapping gives them; texts are FreeType's glyphs;
the time ticks are the Axes'; and the chart shows what the Matplotlib chart of the same trace shows: the same
lane pixels, the frame and texts within a pixel or two."""

import io

import matplotlib.colors
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg, get_hinting_flag
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties, findfont, get_font
from PIL import Image
from test_gantt import _trace

from analysis.gantt import COLORS, DPI, fit_margins, plot_gantt, write_gantt
from analysis.gantt_canvas import BLACK, Canvas
from analysis.gantt_lanes import gantt_content
from analysis.gantt_layout import chart_size, time_ticks
from analysis.gantt_png import render
from analysis.gantt_text import Typesetter, hinting_flag
from analysis.png_encode import encode_png

TRACE = [(0, 0, "compute", "forward", 3, 0.0, 4.0), (0, 0, "compute", "backward", 3, 6.0, 7.0),
         (0, 0, "tp", "tp", 3, 2.0, 2.5), (1, 1, "compute", "forward", 3, 4.0, 8.0),
         (1, 1, "pp", "pp", 3, 9.0, 10.0)]


def test_encode_png_round_trips_and_is_deterministic():
    rng = np.random.default_rng(3)
    image = np.repeat(rng.integers(0, 256, (7, 11, 3), dtype=np.uint8), 3, axis=0)  # rows repeat, as bands do
    data = encode_png(image, dpi=150)
    decoded = Image.open(io.BytesIO(data))
    assert decoded.mode == "RGB" and decoded.size == (11, 21)
    assert np.array_equal(np.asarray(decoded), image)
    assert decoded.info["dpi"] == pytest.approx((150, 150), abs=0.05)  # 5,906 pixels per metre
    assert encode_png(image, dpi=150) == data


def test_lines_cover_the_pixels_agg_snaps_them_to():
    canvas = Canvas(20, 20, 150)
    # a 0.8-point spine (1.667 px, rounds to 2: snapped to a pixel border) at x = 5.3: columns 4 and 5, each
    # 0.833 covered, black -> 255 * (1 - 0.833) = 42.5 (the Agg chart's spines read 42)
    canvas.vline(5.3, 0.0, 10.0, 0.8 * 150 / 72, BLACK)
    assert np.abs(canvas.pixels[:10, 4:6].astype(float) - 42.5).max() <= 0.5
    assert (canvas.pixels[:, [3, 6]] == 255).all() and (canvas.pixels[10:, 4:6] == 255).all()
    # a 0.3-point grid line (0.625 px, rounds to 1: snapped to a pixel centre) at y = 7.2, alpha 0.5, #b0b0b0:
    # row 7 only, 0.3125 of the way from white to 176
    canvas.hline(7.2, 10.0, 20.0, 0.3 * 150 / 72, (176, 176, 176), alpha=0.5)
    assert canvas.pixels[7, 10:, 0].tolist() == [round(255 - 79 * 0.3125)] * 10
    assert (canvas.pixels[[6, 8], 10:] == 255).all()


def test_the_hinting_flag_is_the_one_agg_renders_text_with():
    assert hinting_flag() == get_hinting_flag()


@pytest.mark.parametrize("text, size", [("stage 3 · rank 384 · compute", 7), ("time (s)", 10),
                                        ("tp reduce-scatter", 8), ("17", 6)])
def test_text_is_freetypes_glyphs_with_agg_metrics(text, size):
    """Width, height and descent are those Agg's text layout reads from FT2Font; the inked pixels are the same
    glyphs (the same total coverage, the same inked width within a pixel: FT2Font's string bitmap truncates
    each glyph's offset from the box's fractional left edge; where a pair is kerned, FreeType rasterises the
    glyph shifted by the kerning's fraction of a pixel, which moves a little coverage between its edges)."""
    drawn = Typesetter(DPI).text_bitmap(text, size)
    font = get_font(findfont(FontProperties(size=size)))
    font.set_size(size, DPI)
    font.set_text(text, 0.0, flags=get_hinting_flag())
    font.draw_glyphs_to_bitmap(antialiased=True)
    width, height = font.get_width_height()
    assert drawn.width == width / 64
    assert drawn.ascent + drawn.descent == height / 64 and drawn.descent == font.get_descent() / 64
    reference = np.asarray(font.get_image(), dtype=np.float32) / 255
    kerned = text == "tp reduce-scatter"  # "r" + "e" and "t" + "t" pairs
    assert drawn.bitmap.sum() == pytest.approx(reference.sum(), rel=1e-2 if kerned else 1e-6)

    def inked_width(bitmap):
        columns = np.flatnonzero(bitmap.any(axis=0))
        return columns[-1] - columns[0] + 1

    assert abs(inked_width(drawn.bitmap) - inked_width(reference)) <= 1


@pytest.mark.parametrize("lo, hi", [(0.0, 20.966), (0.0, 0.0123), (0.5, 3.7), (100.001, 100.0021)])
def test_time_ticks_are_the_ones_an_axes_draws(lo, hi):
    fig = Figure(figsize=(14.0, 3.0), dpi=DPI)
    ax = fig.add_axes((0.0, 0.2, 1.0, 0.6))  # 14 inches = 1,008 points of axis
    ax.set_xlim(lo, hi)
    FigureCanvasAgg(fig).draw()
    shown = [(tick.get_loc(), tick.label1.get_text()) for tick in ax.xaxis.get_major_ticks()
             if lo - 1e-12 <= tick.get_loc() <= hi + 1e-12]
    values, labels, offset = time_ticks(lo, hi, 14.0 * 72)
    assert [round(v, 12) for v in values] == [round(v, 12) for v, _ in shown]
    assert labels == [label for _, label in shown]
    assert offset == ax.xaxis.get_major_formatter().get_offset()


def _axes_chart(trace, size):
    """The same chart through Matplotlib: ``plot_gantt`` on a Figure of ``size`` with ``fit_margins``."""
    fig = Figure(figsize=size, dpi=DPI)
    ax = plot_gantt(trace, fig.subplots(), title="a title")
    fit_margins(fig, [label.get_text() for label in ax.get_yticklabels()])
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[:, :, :3].astype(int), ax


def test_the_png_shows_what_the_axes_chart_shows(tmp_path):
    trace = _trace(TRACE)
    size = chart_size(4)
    written = np.asarray(Image.open(write_gantt(trace, tmp_path / "g.png", title="a title"))).astype(int)
    axes, ax = _axes_chart(trace, size)
    assert written.shape == axes.shape and written.shape[1] == 16 * DPI  # 2.68 in: Agg's 402 rows, not 401
    # the lanes: every pixel inside the Axes (spines, grid lines and micro-batch numbers aside) is the same
    x0, x1 = int(ax.bbox.x0) + 3, int(ax.bbox.x1) - 3
    y0, y1 = written.shape[0] - int(ax.bbox.y1) + 3, written.shape[0] - int(ax.bbox.y0) - 3
    same = (written[y0:y1, x0:x1] == axes[y0:y1, x0:x1]).all(axis=2)
    assert same.mean() > 0.985
    rgb = tuple(int(round(c * 255)) for c in matplotlib.colors.to_rgb(COLORS["forward"]))
    forward = (written[y0:y1, x0:x1] == rgb).all(axis=2)
    # (the white micro-batch numbers on the blocks are FreeType's hinted bitmaps there, glyph outlines here)
    assert forward.sum() == pytest.approx((axes[y0:y1, x0:x1] == rgb).all(axis=2).sum(), rel=1e-3)
    assert forward.sum() > 10_000
    # the whole page, text and frame included: within a pixel or two of Matplotlib's
    difference = np.abs(written - axes).sum(axis=2)
    assert np.abs(written - axes).mean() < 2.0 and (difference > 60).mean() < 0.02

    # and the ink is where it is: rows with dark pixels (texts, spines, ticks) match within 2 pixels
    def dark_rows(image):
        return set(np.flatnonzero((image.sum(axis=2) < 300).any(axis=1)).tolist())

    mine, theirs = dark_rows(written), dark_rows(axes)
    assert all(min(abs(r - t) for t in theirs) <= 2 for r in mine)
    assert all(min(abs(r - t) for t in mine) <= 2 for r in theirs)


def test_the_png_is_the_same_bytes_for_the_same_trace(tmp_path):
    trace = _trace(TRACE)
    first = write_gantt(trace, tmp_path / "a.png", title="t").read_bytes()
    assert write_gantt(trace, tmp_path / "b.png", title="t").read_bytes() == first
    content = gantt_content(trace)
    assert np.array_equal(render(content, chart_size(4), "t"), np.asarray(Image.open(io.BytesIO(first))))


def test_a_title_with_characters_the_font_lacks_is_drawn(tmp_path):
    """A scenario named in Japanese (the run chart's title holds the name) or a tab: each missing character is
    the font's .notdef box of its advance, as Agg draws it, instead of FreeType's "No glyphs have been loaded"."""
    trace = _trace(TRACE)
    typesetter = Typesetter(DPI)
    font = get_font(findfont(FontProperties(size=10)))
    font.set_size(10, DPI)
    notdef = font.load_glyph(0, flags=get_hinting_flag()).horiAdvance
    a = font.load_char(ord("a"), flags=get_hinting_flag()).horiAdvance
    assert typesetter.text_bitmap("a\tスa", 10).width == (2 * notdef + 2 * a) / 64
    path = write_gantt(trace, tmp_path / "g.png", title="ステップ\t7")
    assert np.asarray(Image.open(path)).shape == render(gantt_content(trace), chart_size(4), "t").shape


def test_the_legend_lists_the_colours_painted():
    rows = _trace(TRACE)
    assert [label for label, _ in gantt_content(rows).legend] == ["forward", "backward", "tp", "pp",
                                                                 "exposed comm (strip)"]
    rows.loc[rows["kind"] == "backward", "kind"] = "recompute"  # painted as its backward
    assert "backward" in [label for label, _ in gantt_content(rows).legend]
