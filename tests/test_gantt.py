"""The Gantt chart's raster (issue 25): each lane is a band of pixels painted by the time each kind covers.

Pure checks of ``coverage`` / ``paint`` / ``bands`` with exact numbers, then a rendered chart of a small
hand-made trace whose blocks must paint the right columns of the right lane in their kind's colour, with the
micro-batch numbers where a block is wide enough.
"""

import matplotlib.colors
import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.gantt import (
    BAND,
    COLORS,
    EXPOSED_COLOR,
    EXPOSED_SHARE,
    MicrobatchLabels,
    _lane_index,
    bands,
    compute_blocks,
    coverage,
    exposed_blocks,
    paint,
    paint_kinds,
    plot_gantt,
)
from sim.output import summary as summary_module
from sim.output.summary import exposed_intervals
from sim.output.trace import TRACE_COLUMNS


def test_coverage_is_the_covered_share_of_each_column():
    # columns of 1 s over [0, 10]; lane 1, kind 2: [2.5, 5.0] and [7.2, 7.7] (inside one column)
    cover = coverage(np.array([1, 1]), np.array([2, 2]), np.array([2.5, 7.2]), np.array([5.0, 7.7]), lanes=3,
                     kinds=4, lo=0.0, hi=10.0, columns=10)
    assert cover.shape == (4, 3, 10)
    expected = np.zeros(10)
    expected[2], expected[3], expected[4], expected[7] = 0.5, 1.0, 1.0, 0.5
    assert cover[2, 1] == pytest.approx(expected, abs=1e-12)
    assert cover.sum() == pytest.approx(expected.sum())  # nothing on the other lanes or kinds


def test_coverage_clips_to_the_window_and_weights():
    cover = coverage(np.array([0, 0]), np.array([0, 0]), np.array([-5.0, 9.5]), np.array([0.5, 30.0]), lanes=1,
                     kinds=1, lo=0.0, hi=10.0, columns=10, weight=np.array([0.25, 1.0]))
    assert cover[0, 0, 0] == pytest.approx(0.125) and cover[0, 0, 9] == pytest.approx(0.5)
    assert cover[0, 0, 1:9] == pytest.approx(np.zeros(8))


def test_coverage_total_is_the_busy_time_of_random_blocks():
    rng = np.random.default_rng(7)
    start = rng.uniform(0, 3, 2000)
    end = start + rng.exponential(0.01, 2000)
    lane, kind = rng.integers(0, 5, 2000), rng.integers(0, 3, 2000)
    cover = coverage(lane, kind, start, end, lanes=5, kinds=3, lo=0.0, hi=4.0, columns=777)
    for k in range(3):
        for lane_id in range(5):
            mine = (kind == k) & (lane == lane_id)
            assert cover[k, lane_id].sum() * 4.0 / 777 == pytest.approx((end - start)[mine].sum(), rel=1e-9)


def test_paint_mixes_white_and_kind_colours_by_coverage():
    colors = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    cover = np.zeros((2, 1, 4))
    cover[0, 0, 1] = 1.0  # all red
    cover[1, 0, 2] = 0.5  # half blue
    cover[0, 0, 3], cover[1, 0, 3] = 1.0, 1.0  # overlapping: scaled to fill the column once
    lane = paint(cover, colors)[0]
    assert lane[0] == pytest.approx([1, 1, 1]) and lane[1] == pytest.approx([1, 0, 0])
    assert lane[2] == pytest.approx([0.5, 0.5, 1.0]) and lane[3] == pytest.approx([0.5, 0, 0.5])


def test_bands_paint_the_middle_of_each_lane():
    lane_colors = np.array([[[0.0, 0.0, 0.0]], [[1.0, 0.0, 0.0]]])  # lane 0 black, lane 1 red; one column
    image = bands(lane_colors, 20)  # 10 rows per lane
    assert image.shape == (20, 1, 4) and image.dtype == np.uint8
    painted = [r for r in range(20) if tuple(image[r, 0, :3]) != (255, 255, 255)]
    assert painted == [1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 14, 15, 16, 17, 18]  # BAND 0.8: 8 of 10 rows
    assert BAND == 0.8 and tuple(image[5, 0, :3]) == (0, 0, 0) and tuple(image[15, 0, :3]) == (255, 0, 0)


def _trace(rows):
    frame = pd.DataFrame(rows, columns=["rank", "stage", "stream", "kind", "microbatch", "start_s", "end_s"])
    frame = frame.assign(task=range(len(frame)), name=frame["kind"], layer=0, bytes=0, flops=0.0,
                         op=np.where(frame["stream"] == "compute", "", "all_reduce"))
    return frame[list(TRACE_COLUMNS)].astype(TRACE_COLUMNS)


def test_compute_blocks_merge_a_microbatch_and_split_on_a_visible_wait():
    rows = _trace([(0, 0, "compute", "forward", 0, 0.0, 1.0), (0, 0, "compute", "forward", 0, 1.0, 2.0),
                   (0, 0, "compute", "backward", 0, 2.0, 3.0), (0, 0, "compute", "recompute", 0, 3.0, 3.5),
                   (0, 0, "compute", "backward", 0, 4.5, 5.0), (0, 0, "compute", "forward", 1, 5.0, 6.0)])
    blocks = compute_blocks(rows, min_gap=0.5)
    assert list(blocks["kind"]) == ["forward", "backward", "backward", "forward"]
    assert list(blocks["start_s"]) == [0.0, 2.0, 4.5, 5.0] and list(blocks["end_s"]) == [2.0, 3.5, 5.0, 6.0]
    assert list(blocks["microbatch"]) == [0, 0, 0, 1]


def labels(ax):
    """(x, lane, text) of the micro-batch numbers drawn on ``ax``."""
    return [label for c in ax.collections if isinstance(c, MicrobatchLabels) for label in c.labels]


def test_a_block_paints_its_columns_of_its_lane_in_its_kinds_colour():
    trace = _trace([(0, 0, "compute", "forward", 3, 0.0, 4.0), (0, 0, "compute", "backward", 3, 6.0, 7.0),
                    (0, 0, "tp", "tp", 3, 2.0, 2.5), (1, 1, "compute", "forward", 3, 4.0, 8.0),
                    (1, 1, "pp", "pp", 3, 9.0, 10.0)])
    fig = Figure(figsize=(10, 3), dpi=100)
    ax = fig.add_axes((0.2, 0.1, 0.7, 0.8))  # 700 x 240 pixels: 70 per second, 60 per lane (4 lanes)
    plot_gantt(trace, ax=ax)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    pixels = np.asarray(canvas.buffer_rgba())[:, :, :3]
    x0, y1 = ax.bbox.x0, fig.bbox.height - ax.bbox.y1  # the Axes' left and top edges, in image rows/columns

    def at(t, lane):  # the pixel at time t, in the middle of lane (0 at the top)
        return tuple(pixels[int(y1 + (lane + 0.5) * 60), int(x0 + t * 70)])

    def rgb(kind):
        return tuple(int(round(c * 255)) for c in matplotlib.colors.to_rgb(COLORS[kind]))

    lanes = [label.get_text() for label in ax.get_yticklabels()]
    assert lanes == ["stage 0 · rank 0 · compute", "stage 0 · rank 0 · tp", "stage 1 · rank 1 · compute",
                     "stage 1 · rank 1 · pp"]
    assert at(1.0, 0) == rgb("forward") and at(3.5, 0) == rgb("forward") and at(6.8, 0) == rgb("backward")
    assert at(5.0, 0) == (255, 255, 255) and at(8.5, 0) == (255, 255, 255)  # idle
    assert at(2.25, 1) == rgb("tp") and at(1.5, 1) == (255, 255, 255) and at(3.0, 1) == (255, 255, 255)
    assert at(4.5, 2) == rgb("forward") and at(7.5, 2) == rgb("forward") and at(1.0, 2) == (255, 255, 255)
    assert at(9.5, 3) == rgb("pp")
    assert tuple(pixels[int(y1 + 2), int(x0 + 1.0 * 70)]) == (255, 255, 255)  # between lanes: the band is 0.8
    # micro-batch numbers on the blocks wide enough (all of these), centred on them (the samples above avoid them)
    assert {(round(x, 6), y, text) for x, y, text in labels(ax)} == {(2.0, 0, "3"), (6.5, 0, "3"), (6.0, 2, "3")}
    # and they are drawn: near-white (antialiased) glyph pixels on the backward block, around its centre only
    light = (pixels[int(y1 + 20):int(y1 + 40), int(x0 + 6.2 * 70):int(x0 + 6.8 * 70)] > 200).all(axis=2)
    assert light[:, 8:34].any() and not light[:, :6].any() and not light[:, -6:].any()


def test_narrow_blocks_get_no_label():
    rows = [(0, 0, "compute", "forward", mb, mb * 0.001, mb * 0.001 + 0.0005) for mb in range(100)]
    trace = _trace(rows + [(0, 0, "compute", "backward", 7, 1.0, 2.0)])
    ax = plot_gantt(trace, ax=Figure().subplots())
    assert [text for _, _, text in labels(ax)] == ["7"]


def test_labels_are_capped_to_the_widest_blocks(monkeypatch):
    import analysis.gantt_lanes

    monkeypatch.setattr(analysis.gantt_lanes, "MAX_LABELS", 400)
    rows = [(r, r, "compute", "forward" if mb % 2 else "backward", mb, mb * 1.0, mb + 0.9 + 0.001 * r)
            for r in range(10) for mb in range(100)]  # 1,000 blocks, each wider than 1/160 of the window
    drawn = labels(plot_gantt(_trace(rows), ax=Figure().subplots()))
    assert len(drawn) == 400
    assert {lane for _, lane, _ in drawn} == {6, 7, 8, 9}  # ranks 6..9 have the widest blocks


def test_figure_height_is_capped_for_deep_pipelines():
    from analysis.gantt import MAX_HEIGHT, figure_size

    def lanes(n):
        return _trace([(r, r, "compute", "forward", 0, 0.0, 1.0) for r in range(n)])

    assert figure_size(lanes(10)) == (16.0, pytest.approx(0.32 * 10 + 1.4))
    assert figure_size(lanes(128))[1] == pytest.approx(MAX_HEIGHT)
    assert figure_size(lanes(400))[1] == pytest.approx(0.16 * 400 + 1.4)  # lanes never thinner than 0.16 inch


def test_marked_bands_blend_the_exposed_colour_into_the_bottom_of_the_band():
    lane_colors = np.array([[[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]])  # one blue lane, two columns
    image = bands(lane_colors, 10, marks=np.array([[0.0, 1.0]]))  # column 1 fully exposed
    red = tuple(int(round(255 * c)) for c in matplotlib.colors.to_rgb(EXPOSED_COLOR))
    painted = [r for r in range(10) if tuple(image[r, 0, :3]) != (255, 255, 255)]
    assert painted == list(range(1, 9))  # the band: rows 1..8
    # EXPOSED_SHARE 0.3 of 8 rows: the bottom rows 7 and 8 (centres 7.5 and 8.5 of 10) of column 1 are red
    strip = [r for r in painted if tuple(image[r, 1, :3]) == red]
    assert EXPOSED_SHARE == 0.3 and strip == [7, 8]
    assert all(tuple(image[r, 0, :3]) == (0, 0, 255) for r in painted)  # column 0 not exposed: blue all the way


def test_exposed_blocks_are_the_comm_outside_its_ranks_compute():
    rows = _trace([(0, 0, "compute", "forward", 0, 0.0, 1.0), (0, 0, "compute", "backward", 0, 2.0, 3.0),
                   (0, 0, "dp", "dp", -1, 0.5, 2.5),  # hidden 0.5-1 and 2-2.5, exposed 1-2
                   (1, 0, "dp", "dp", -1, 0.0, 3.0)])  # rank 1 computes nothing: all exposed
    lanes, lane_of = _lane_index(rows)
    lane, start, end = exposed_blocks(rows, lane_of)
    got = sorted(zip(lane.tolist(), start.tolist(), end.tolist(), strict=True))
    dp0, dp1 = lanes.index((0, 0, "dp")), lanes.index((0, 1, "dp"))
    assert got == sorted([(dp0, 1.0, 2.0), (dp1, 0.0, 3.0)])


def test_the_host_streams_work_is_not_exposed_communication():
    """The host's issue time of a MoE layer pass (kind host, moe.host_sync) and ZeRO-Offload's CPU Adam (kind
    optimizer on the host stream) are the CPU's work, not communication: no exposed-comm strip on the host lane,
    as the summary's exposed_comm_s has no such kind; the dp lane beside them keeps its strip."""
    rows = _trace([(0, 0, "compute", "forward", 0, 0.0, 1.0),
                   (0, 0, "host", "host", 0, 0.0, 2.0),  # issues past the compute's end: idle GPU, not comm
                   (0, 0, "host", "optimizer", -1, 3.0, 4.0),
                   (0, 0, "dp", "dp", -1, 0.5, 2.5)])  # exposed 1-2.5
    lanes, lane_of = _lane_index(rows)
    lane, start, end = exposed_blocks(rows, lane_of)
    got = sorted(zip(lane.tolist(), start.tolist(), end.tolist(), strict=True))
    assert got == [(lanes.index((0, 0, "dp")), 1.0, 2.5)]


def test_fsdp_gathers_and_reduce_scatters_get_their_own_colours():
    rows = _trace([(0, 0, "dp", "dp", -1, 0.0, 1.0), (0, 0, "dp", "dp", -1, 1.0, 2.0),
                   (0, 0, "pp", "pp", 0, 2.0, 3.0)])
    rows["op"] = ["all_gather", "reduce_scatter", "send"]
    assert list(paint_kinds(rows)) == ["dp all-gather", "dp reduce-scatter", "pp"]
    assert len({COLORS[k] for k in paint_kinds(rows)}) == 3


def test_exposed_intervals_sum_to_the_summarys_exposed_time():
    rng = np.random.default_rng(7)
    for _ in range(50):
        a = rng.uniform(0, 10, 30)
        b = a + rng.uniform(0, 1, 30)
        c = rng.uniform(0, 10, 20)
        d = c + rng.uniform(0, 1.5, 20)
        start, end = exposed_intervals(a, b, c, d)
        assert np.all(end > start) and np.all(start[1:] >= end[:-1])  # disjoint, sorted
        assert float(np.sum(end - start)) == pytest.approx(
            summary_module._exposed(pd.DataFrame({"start_s": a, "end_s": b}), summary_module._merge(c, d)), abs=1e-12)
