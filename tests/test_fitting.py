"""The fitting behind the shipped link presets recovers known parameters from synthetic measurements."""

import math

import pytest

from sim.calibrate.fitting import DEFAULT_KNOTS, Measurement, fit_link, fit_log_curve, pool_adjacent_violators
from sim.network.collectives import bytes_moved, latency_steps

BASE, ALPHA, LINE, PLATEAU = 20e-6, 1.5e-6, 450e9, 0.8
TRUE_CURVE = [0.05, 0.1, 0.2, 0.3, 0.5, 0.6, 0.8, 0.85, 0.9, 0.92, 0.95, 0.97, 0.98, 0.99, 1.0, 1.0, 1.0]  # 64K..4G


def true_efficiency(size):
    x = math.log2(size)
    knots = [math.log2(k) for k in DEFAULT_KNOTS]
    if x <= knots[0]:
        return PLATEAU * TRUE_CURVE[0]
    if x >= knots[-1]:
        return PLATEAU * TRUE_CURVE[-1]
    i = max(j for j, k in enumerate(knots) if k <= x)
    share = (x - knots[i]) / (knots[i + 1] - knots[i])
    return PLATEAU * (TRUE_CURVE[i] + share * (TRUE_CURVE[i + 1] - TRUE_CURVE[i]))


def synthetic(sizes_log2=range(3, 33), ops=("all_reduce", "all_gather", "reduce_scatter"), n=8, algorithm="ring"):
    rows = []
    for e in sizes_log2:
        size = 2.0 ** e
        for op in ops:
            seconds = (BASE + latency_steps(algorithm, op, n) * ALPHA
                       + bytes_moved(algorithm, op, n, size) / (LINE * true_efficiency(size)))
            rows.append(Measurement(op, n, size, seconds))
    return rows


def test_known_alpha_beta_and_knots_are_recovered():
    fit = fit_link(synthetic(), LINE, latency_max_bytes=1024)  # below 1 KiB the bandwidth term is < 0.5%
    assert fit.base_latency == pytest.approx(BASE, rel=0.01)
    assert fit.latency == pytest.approx(ALPHA, rel=0.01)
    assert fit.efficiency == pytest.approx(PLATEAU, rel=1e-3)
    for (size, fraction), expected in zip(fit.curve, TRUE_CURVE, strict=True):
        assert fraction == pytest.approx(expected, rel=0.01, abs=0.002), size


def test_given_latency_is_used_as_is():
    fit = fit_link(synthetic(range(20, 33)), LINE, latency=(BASE, ALPHA))
    assert (fit.base_latency, fit.latency) == (BASE, ALPHA)
    assert fit.efficiency == pytest.approx(PLATEAU, rel=1e-3)


def test_pool_adjacent_violators_is_monotone_least_squares():
    assert pool_adjacent_violators([1, 3, 2, 4]) == [1, 2.5, 2.5, 4]
    assert pool_adjacent_violators([3, 2, 1], [1, 1, 2]) == [1.75, 1.75, 1.75]


def test_no_rows_is_a_clear_error():
    with pytest.raises(ValueError, match="no measurements"):
        fit_link([], LINE)


def test_log_curve_recovers_known_knots_and_is_monotone():
    knots = [2.0 ** e for e in range(20, 31)]
    truth = {k: 1e9 * min(1.0, 0.05 * 1.5 ** i) for i, k in enumerate(knots)}
    xs = [k for k in knots for _ in range(3)]
    ys = [truth[k] * f for k in knots for f in (0.9, 1.0, 1.1)]  # noise around each knot; the median is exact
    curve = fit_log_curve(xs, ys, knots)
    assert [x for x, _ in curve] == knots
    for x, y in curve:
        assert y == pytest.approx(truth[x])
    noisy = fit_log_curve([2**20, 2**21, 2**22], [3.0, 1.0, 5.0], [2**20, 2**21, 2**22])
    assert [y for _, y in noisy] == [2.0, 2.0, 5.0]  # the dip is pooled away
