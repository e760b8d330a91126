"""training.train_metric_states: the trainer's sync of its train metrics after every step (sim.workload.train_metrics,
docs/mechanisms/train_metric_sync.md): the host costs and the measurement they come from
(sim/data/reference/metric_sync_host_measurements.csv), the tasks on the trace, the step against the closed form,
growth with the world, the estimate against the simulation, and the one-line error."""

from __future__ import annotations

import statistics
from importlib import resources

import pandas as pd
import pytest

import sim
from sim.errors import ConfigError
from sim.workload.train_metrics import COPY_S, STACK_S, STATE_BYTES, ZEROS_LIKE_S

from conftest import SCENARIOS

MPT_512 = SCENARIOS / "validation" / "mosaic-mpt-7b-h100-512-s2048.yaml"


def _layout(gpus: int, states: int) -> list[str]:
    """The MPT-7B validation scenario on ``gpus`` GPUs (the same micro-batch per GPU) with ``states`` metric states."""
    return [f"cluster.nodes={gpus // 8}", f"parallel.dp={gpus}", f"training.global_batch={6 * gpus}",
            f"training.train_metric_states={states}"]


def test_the_host_costs_are_the_measured_medians() -> None:
    """ZEROS_LIKE_S, COPY_S and STACK_S are the medians of the replay's twelve (round, world, dtype) rows, each
    quantity within 5.9-10.7 us (zeros_like, copy) or 0.5-1.4 us (stack and sum) per entry: per rank, the loops
    cost the same at 128 and at 2,048 entries, so the sync's host time is linear in the world."""
    path = resources.files("sim").joinpath("data/reference/metric_sync_host_measurements.csv")
    table = pd.read_csv(path)  # type: ignore[arg-type]
    for quantity, constant, low, high in (("zeros_like", ZEROS_LIKE_S, 5.9, 10.7), ("copy", COPY_S, 5.9, 10.7),
                                          ("stack_sum", STACK_S, 0.5, 1.4)):
        values = table.loc[table["quantity"] == quantity, "median_us"]
        assert len(values) == 12
        assert values.between(low, high).all()
        assert statistics.median(values) * 1e-6 == pytest.approx(constant, rel=1e-12)


def test_the_step_ends_with_the_sync_one_part_after_another() -> None:
    """Four states on 512 ranks: after the optimizer step, per state a barrier (one float all-reduced over every
    rank), 512 x 7.775 us of host, the all-gather of 512 x 8 bytes and 512 x (6.725 + 0.69) us of host, in that
    order and nothing between; the step grows by exactly their sum."""
    base = sim.run(MPT_512, _layout(512, 0))
    run = sim.run(MPT_512, _layout(512, 4))
    trace = run.trace
    parts = trace[trace["name"].str.startswith("metric_")].sort_values("start_s")
    assert list(parts["name"]) == [f"metric_{part}{state}" for state in range(4)
                                   for part in ("barrier", "zeros_like", "all_gather", "copies")]
    assert list(parts["op"]) == ["all_reduce", "", "all_gather", ""] * 4
    assert (parts[parts["op"] == "all_gather"]["bytes"] == 512 * STATE_BYTES).all()
    host = parts[parts["stream"] == "host"]
    spans = (host["end_s"] - host["start_s"]).to_numpy()
    assert spans[0::2] == pytest.approx([512 * ZEROS_LIKE_S] * 4, rel=1e-12)
    assert spans[1::2] == pytest.approx([512 * (COPY_S + STACK_S)] * 4, rel=1e-12)
    starts, ends = parts["start_s"].to_numpy(), parts["end_s"].to_numpy()
    assert starts[1:] == pytest.approx(ends[:-1], abs=1e-12)  # each part waits for the one before, and only it
    optimizer = trace[(trace["kind"] == "optimizer") & (trace["name"] == "optimizer")]
    assert starts[0] == pytest.approx(optimizer["end_s"].max(), abs=1e-12)
    assert run.summary.step_time_s - base.summary.step_time_s == pytest.approx(
        float((parts["end_s"] - parts["start_s"]).sum()), rel=1e-9)


def test_the_host_part_grows_linearly_with_the_world_and_the_estimate_follows() -> None:
    """4 x N x 15.19 us of host: 4x from 128 to 512 GPUs; the closed-form estimate adds what the simulation adds."""
    added = {}
    for gpus in (128, 512):
        base, run = sim.run(MPT_512, _layout(gpus, 0)), sim.run(MPT_512, _layout(gpus, 4))
        host = run.trace[(run.trace["stream"] == "host") & run.trace["name"].str.startswith("metric_")]
        assert float((host["end_s"] - host["start_s"]).sum()) == pytest.approx(
            4 * gpus * (ZEROS_LIKE_S + COPY_S + STACK_S), rel=1e-12)
        added[gpus] = run.summary.step_time_s - base.summary.step_time_s
        estimated = sim.estimate(MPT_512, _layout(gpus, 4)).step_time_s \
            - sim.estimate(MPT_512, _layout(gpus, 0)).step_time_s
        assert estimated == pytest.approx(added[gpus], rel=1e-9)
    assert 3.7 < added[512] / added[128] < 4.0  # host x4, the ring all-gather's latency about x4, the barrier less


def test_off_by_default_and_on_one_rank() -> None:
    """Frameworks that reduce only the loss (the default 0) and a single GPU (nothing to sync) end with no sync."""
    default = sim.run(SCENARIOS / "llama2-7b_h100-16_fsdp.yaml")
    assert not default.trace["name"].str.startswith("metric_").any()
    single = sim.run(MPT_512, ["cluster.nodes=1", "cluster.gpus_per_node=1", "parallel.dp=1",
                               "training.global_batch=6"])
    assert not single.trace["name"].str.startswith("metric_").any()


def test_a_negative_count_is_one_line_naming_the_field() -> None:
    with pytest.raises(ConfigError) as error:
        sim.load_scenario(MPT_512, ["training.train_metric_states=-1"])
    message = str(error.value)
    assert "training.train_metric_states" in message and "\n" not in message
