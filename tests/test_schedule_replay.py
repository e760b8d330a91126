"""Every schedule replayed by the engine over hypothesis-generated (p, v, m): no deadlock; on every stage each
micro-batch's F, B (and W) run in that order; a micro-batch's forward reaches a chunk only after the previous
chunk's forward ended, and its backward only after the next chunk's backward ended; the in-flight bound holds."""

from hypothesis import given, settings
from hypothesis import strategies as st

from sim import runner
from sim.parallel.schedules import SCHEDULES

from conftest import pipeline_scenario


def chunk_of(layer, p, layers_per_chunk):
    return layer // layers_per_chunk  # global chunk index g; its stage is g % p


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(SCHEDULES)), p=st.integers(1, 6), v=st.integers(1, 3), m=st.integers(1, 12),
       w=st.sampled_from(["0 s", "0.25 s", "0.5 s"]))
def test_replay_respects_order_and_bounds(name, p, v, m, w):
    schedule = SCHEDULES[name]
    v = {"interleaved": v, "zb-v": 2, "dualpipev": 2}.get(name, 1)
    if name == "interleaved":
        m = p * max(1, m // p)
    if schedule.invalid_reason(p, m, v) is not None:  # DualPipe's rules (even pp, m >= 2pp)
        return
    result = runner.run(pipeline_scenario(p, m, name, forward="0.5 s", backward="1 s", layers_per_stage=v, vpp=v,
                                          weight_grad=w))  # raises ScheduleDeadlock if anything is stuck
    trace = result.trace
    compute = trace[trace["kind"].isin(["forward", "backward", "weight"]) & (trace["layer"] >= 0)]
    spans = compute.groupby(["kind", "microbatch", "layer"]).agg(start=("start_s", "min"), end=("end_s", "max"))
    layers = p * v  # layer order is model order, whatever the chunk layout
    for j in range(m):
        for layer in range(layers):
            f, b = spans.loc[("forward", j, layer)], spans.loc[("backward", j, layer)]
            assert f["end"] <= b["start"]
            if schedule.splits_backward:
                assert b["end"] <= spans.loc[("weight", j, layer)]["start"]
            if layer > 0:  # stage (chunk) order of the forward, reversed for the backward
                assert spans.loc[("forward", j, layer - 1)]["end"] <= f["start"]
                assert b["end"] <= spans.loc[("backward", j, layer - 1)]["start"]
    # In flight, per stage, in (micro-batch, chunk) units: from a chunk's forward to its last backward pass.
    last = "weight" if schedule.splits_backward else "backward"
    for stage in range(p):
        rows = compute[compute["stage"] == stage]
        first_f = rows[rows["kind"] == "forward"].groupby(["microbatch", "layer"])["start_s"].min()
        last_b = rows[rows["kind"] == last].groupby(["microbatch", "layer"])["end_s"].max()
        events = sorted([(t, 1) for t in first_f] + [(t, -1) for t in last_b], key=lambda e: (e[0], e[1]))
        alive = peak = 0
        for _, delta in events:
            alive += delta
            peak = max(peak, alive)
        assert peak <= schedule.in_flight(p, m, v, stage)
