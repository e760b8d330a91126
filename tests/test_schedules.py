"""Schedules as pure action lists: counts, order, and the in-flight bound each promises (in closed form)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.parallel.schedules import SCHEDULES, in_flight_peak, interleaved, one_f_one_b, zb_h1


def valid_point(name, p, m, v):
    schedule = SCHEDULES[name]
    return schedule.invalid_reason(p, m, v) is None


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(SCHEDULES)), p=st.integers(1, 10), m=st.integers(1, 40), v=st.integers(1, 4))
def test_every_stage_runs_each_pass_once_in_order(name, p, m, v):
    schedule = SCHEDULES[name]
    v = {"interleaved": v, "zb-v": 2, "dualpipev": 2}.get(name, 1)
    if not valid_point(name, p, m, v):
        return
    stages = schedule.actions(p, m, v)
    assert len(stages) == p
    phases = ("F", "B", "W") if schedule.splits_backward else ("F", "B")
    for s, actions in enumerate(stages):
        expected = sorted((j, c) for j in range(m) for c in range(v))
        if schedule.layout == "dual":  # DualPipe: micro-batches m/2.. run the reverse copy, local chunk 1
            expected = sorted((j, int(j >= m // 2)) for j in range(m))
        for phase in phases:
            assert sorted((a.microbatch, a.chunk) for a in actions if a.phase == phase) == expected
        assert len(actions) == len(phases) * m * v
        position = {(a.phase, a.microbatch, a.chunk): i for i, a in enumerate(actions)}
        for j, c in expected:
            order = [position[(phase, j, c)] for phase in phases]
            assert order == sorted(order), (s, j, c)
        peak = in_flight_peak(actions, schedule.splits_backward)
        assert peak <= schedule.in_flight(p, m, v, s)
        if m >= p:  # the bound is reached once the pipeline is full
            assert peak == schedule.in_flight(p, m, v, s)


def test_1f1b_small_table():
    order = ["".join((a.phase, str(a.microbatch))) for a in one_f_one_b(3, 4)[0]]
    assert order == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    last = ["".join((a.phase, str(a.microbatch))) for a in one_f_one_b(3, 4)[2]]
    assert last == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]


def test_interleaved_follows_megatrons_virtual_microbatch_order():
    # p=2, m=4, v=2, stage 0: warm-up 2(p-s-1) + (v-1)p = 4 forwards, chunk changes every p micro-batches.
    order = [(a.phase, a.microbatch, a.chunk) for a in interleaved(2, 4, 2)[0]]
    assert order[:6] == [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1), ("F", 2, 0), ("B", 0, 1)]
    assert order[-1] == ("B", 3, 0)


def test_zb_h1_defers_s_weight_passes_on_stage_s():
    stages = zb_h1(4, 8)
    for s, actions in enumerate(stages):
        tail = []
        for action in reversed(actions):
            if action.phase != "W":
                break
            tail.append(action)
        assert len(tail) >= s


def test_rules():
    assert "multiple of pp" in SCHEDULES["interleaved"].invalid_reason(4, 6, 2)
    assert SCHEDULES["interleaved"].invalid_reason(4, 8, 2) is None
    assert "one model chunk" in SCHEDULES["1f1b"].invalid_reason(4, 8, 2)
    assert "set parallel.vpp = 2" in SCHEDULES["zb-v"].invalid_reason(4, 8, 1)


def test_v_layout_places_chunks_in_a_v():
    from sim.parallel.chunks import chunk_location, model_chunk
    p = 4
    assert [model_chunk("v", p, s, 0) for s in range(p)] == [0, 1, 2, 3]
    assert [model_chunk("v", p, s, 1) for s in range(p)] == [7, 6, 5, 4]
    assert all(chunk_location("v", p, model_chunk("v", p, s, c)) == (s, c) for s in range(p) for c in (0, 1))
    assert all(chunk_location("interleaved", p, model_chunk("interleaved", p, s, c)) == (s, c)
               for s in range(p) for c in (0, 1, 2))


@pytest.mark.parametrize("p, m", [(4, 2), (8, 3)])
def test_1f1b_with_fewer_microbatches_than_stages(p, m):
    assert SCHEDULES["1f1b"].in_flight(p, m, 1, 0) == m
