"""Cross-check: with fixed costs and an ideal network, GPipe and 1F1B take (m+p-1)(t_f+t_b) and their bubble
fraction is (p-1)/(m+p-1) (Narayanan et al. SC21 Sec. 2.2.1), for every p in 1..8 and m in 1..32. Times are
powers of two so the float arithmetic is exact and the assertions use ==."""

import pytest

from sim import runner

from conftest import pipeline_scenario

T_F, T_B = 0.5, 1.0


def in_flight_per_stage(trace):
    """Most micro-batches a stage held at once: from its first forward's start to its last backward's end."""
    compute = trace[trace["stream"] == "compute"]
    held = {}
    for stage, rows in compute.groupby("stage"):
        first_f = rows[rows["kind"] == "forward"].groupby("microbatch")["start_s"].min()
        last_b = rows[rows["kind"] == "backward"].groupby("microbatch")["end_s"].max()
        events = sorted([(t, 1) for t in first_f] + [(t, -1) for t in last_b], key=lambda e: (e[0], e[1]))
        alive = peak = 0
        for _, delta in events:
            alive += delta
            peak = max(peak, alive)
        held[stage] = peak
    return held


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", range(1, 9))
def test_step_and_bubble_closed_form(schedule, p):
    for m in range(1, 33):
        result = runner.run(pipeline_scenario(p, m, schedule, forward=f"{T_F} s", backward=f"{T_B} s"))
        summary = result.summary
        assert summary.step_time_s == (m + p - 1) * (T_F + T_B), (p, m)
        assert summary.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-15), (p, m)
        held = in_flight_per_stage(result.trace)
        for stage in range(p):
            if schedule == "1f1b":
                assert held[stage] <= p - stage, (p, m, stage)
                assert held[stage] == min(p - stage, m)
            else:
                assert held[stage] == m


def test_layers_per_stage_scale_the_stage_time():
    result = runner.run(pipeline_scenario(4, 8, "1f1b", forward="0.25 s", backward="0.5 s", layers_per_stage=3))
    assert result.summary.step_time_s == (8 + 4 - 1) * 3 * (0.25 + 0.5)


@pytest.mark.parametrize("p", [2, 3, 4, 6])
@pytest.mark.parametrize("v", [1, 2, 3, 4])
def test_interleaved_closed_form(p, v):
    """Narayanan et al. SC21 Sec. 2.2.2: with v chunks per stage and m a multiple of p, the step is
    (m + (p-1)/v)(t_f+t_b), i.e. bubble/ideal = (p-1)/(v*m). A stage holds v layers of T_F, T_B each."""
    for m in (p, 2 * p, 3 * p, 5 * p):
        result = runner.run(pipeline_scenario(p, m, "interleaved", forward=f"{T_F} s", backward=f"{T_B} s",
                                              layers_per_stage=v, vpp=v))
        t_stage = v * (T_F + T_B)
        step = result.summary.step_time_s
        assert step == pytest.approx((m + (p - 1) / v) * t_stage, rel=1e-12), (p, v, m)
        assert (step - m * t_stage) / (m * t_stage) == pytest.approx((p - 1) / (v * m), rel=1e-12)
        assert result.summary.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-12)
