"""Cross-check: with fixed costs and an ideal network, GPipe and 1F1B take (m+p-1)(t_f+t_b) and their bubble
fraction is (p-1)/(m+p-1) (Narayanan et al. SC21 Sec. 2.2.1), for every p in 1..8 and m in 1..32. Times are
powers of two so the float arithmetic is exact and the assertions use ==."""

import numpy as np
import pytest

from sim import runner

from conftest import pipeline_scenario

T_F, T_B = 0.5, 1.0


def in_flight_per_stage(trace):
    """Most micro-batches a stage held at once: from its first forward's start to its last backward's end.
    Per stage, +1 at each first-forward start and -1 at each last-backward end, sorted by time with a release
    before an acquisition at the same instant; the peak of the running sum is the answer."""
    compute = trace[trace["stream"] == "compute"]
    stage, microbatch = compute["stage"].to_numpy(), compute["microbatch"].to_numpy()
    kind = compute["kind"].to_numpy()
    forward, backward = kind == "forward", kind == "backward"
    shape = (stage.max() + 1, microbatch.max() + 1)
    first_f, last_b = np.full(shape, np.inf), np.full(shape, -np.inf)
    np.minimum.at(first_f, (stage[forward], microbatch[forward]), compute["start_s"].to_numpy()[forward])
    np.maximum.at(last_b, (stage[backward], microbatch[backward]), compute["end_s"].to_numpy()[backward])
    held = {}
    for s in np.unique(stage):
        starts, ends = first_f[s][np.isfinite(first_f[s])], last_b[s][np.isfinite(last_b[s])]
        times = np.concatenate([starts, ends])
        deltas = np.concatenate([np.ones(len(starts), dtype=int), -np.ones(len(ends), dtype=int)])
        order = np.lexsort((deltas, times))  # by time, then -1 before +1
        held[int(s)] = max(0, int(np.cumsum(deltas[order]).max()))
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
