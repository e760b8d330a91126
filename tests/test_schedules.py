"""Schedules as pure action lists: counts, order, and the in-flight bound each promises."""

import pytest
from hypothesis import given, strategies as st

from sim.schedules import SCHEDULES, Action, one_f_one_b


def in_flight_peak(actions: list[Action]) -> int:
    alive = peak = 0
    for action in actions:
        alive += 1 if action.phase == "F" else -1
        peak = max(peak, alive)
    return peak


@given(p=st.integers(1, 12), m=st.integers(1, 40), name=st.sampled_from(sorted(SCHEDULES)))
def test_every_stage_runs_each_microbatch_once_forward_then_backward(p, m, name):
    schedule = SCHEDULES[name]
    stages = schedule.actions(p, m)
    assert len(stages) == p
    for s, actions in enumerate(stages):
        assert sorted(a.microbatch for a in actions if a.phase == "F") == list(range(m))
        assert sorted(a.microbatch for a in actions if a.phase == "B") == list(range(m))
        position = {(a.phase, a.microbatch): i for i, a in enumerate(actions)}
        assert all(position[("F", j)] < position[("B", j)] for j in range(m))
        assert in_flight_peak(actions) == schedule.in_flight(p, m, s)


def test_1f1b_small_table():
    # p=3, m=4, stage 0: two warm-up forwards, then F/B pairs, then the drain.
    order = ["".join((a.phase, str(a.microbatch))) for a in one_f_one_b(3, 4)[0]]
    assert order == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    last = ["".join((a.phase, str(a.microbatch))) for a in one_f_one_b(3, 4)[2]]
    assert last == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]


@pytest.mark.parametrize("p, m", [(4, 2), (8, 3)])
def test_1f1b_with_fewer_microbatches_than_stages(p, m):
    assert SCHEDULES["1f1b"].in_flight(p, m, 0) == m
