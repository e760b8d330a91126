"""NCCL's SMs slow overlapped compute (sim.engine.sm_contention): closed forms, the fixed point on real traces, the
rules, and that the feature is off unless asked for."""

import numpy as np
import pytest

from sim import runner
from sim.engine import longest_path, sm_contention
from sim.errors import ConfigError
from sim.explore.estimate import estimate
from sim.spec.scenario import load_scenario
from sim.workload.ir import TaskGraph

from conftest import SCENARIOS

SMS = 100


def _one_overlap(compute_s: float, comm_s: float, held: int) -> float:
    """A compute task and a collective that both start at 0 on one GPU; the compute task's settled duration."""
    graph = TaskGraph(match_collectives=False)
    graph.add(0, 0, "compute", "forward", "mlp", 0, 0, [], duration=compute_s)
    graph.add(0, 0, "dp", "dp", "param_gather", 0, 0, [], duration=comm_s, op="all_gather", group=(0, 1))

    def replay(durations=None):
        result = longest_path.evaluate(graph, None, durations)
        return result.start, result.end

    durations, _ = sm_contention.settle(graph, replay(), replay, SMS, held, 2)
    assert [task.duration for task in graph.tasks] == [compute_s, comm_s]  # settle only reads the graph
    return durations[0]


def test_fully_overlapped_compute_runs_at_the_free_sms_rate():
    # 20 of 100 SMs held for the whole task: rate 0.8, so 1 s of work takes 1.25 s.
    assert _one_overlap(1.0, 5.0, 20) == pytest.approx(1.25, rel=1e-6)


def test_partly_overlapped_compute_loses_held_sms_times_overlap():
    # Held for the first 0.5 s: 0.4 s of work done there, 0.6 s after: T = 1 + 20/100 * 0.5 = 1.1 s.
    assert _one_overlap(1.0, 0.5, 20) == pytest.approx(1.1, rel=1e-6)


def test_no_held_sms_changes_nothing():
    assert _one_overlap(1.0, 0.5, 0) == 1.0


@pytest.fixture(scope="module")
def fsdp_pair():
    path = SCENARIOS / "llama2-7b_h100-16_fsdp.yaml"
    return runner.run(load_scenario(path)), runner.run(load_scenario(path, ["network.nccl_sms=24"]))


def test_fsdp_compute_is_stretched_by_exactly_the_held_sm_seconds(fsdp_pair):
    """At the fixed point every compute task lost n/S of the seconds it overlapped a collective (24 of an
    H100's 132 SMs, as NVIDIA's forum measured for an all-gather)."""
    base, contended = fsdp_pair
    t = contended.trace
    for rank, rows in t.groupby("rank"):
        comp = rows[rows["stream"] == "compute"]
        comm = rows[(rows["stream"] != "compute") & (rows["stream"] != "offload")]
        overlap = np.zeros(len(comp))
        for s, e in comm[["start_s", "end_s"]].to_numpy():
            overlap += np.clip(np.minimum(comp["end_s"].to_numpy(), e) - np.maximum(comp["start_s"].to_numpy(), s),
                               0, None)
        before = base.trace[(base.trace["rank"] == rank) & (base.trace["stream"] == "compute")]
        lost = (comp["end_s"] - comp["start_s"]).to_numpy() - (before["end_s"] - before["start_s"]).to_numpy()
        assert lost == pytest.approx(24 / 132 * overlap, abs=1e-5)
    assert contended.summary.step_time_s > base.summary.step_time_s
    assert contended.summary.nccl_sm_stretch_s > 0
    assert base.summary.nccl_sm_stretch_s is None and base.summary.to_dict()["nccl_sm_stretch_s"] is None


def test_contended_trace_keeps_the_invariants(fsdp_pair):
    _, run = fsdp_pair
    start, end = run.trace["start_s"].to_numpy(), run.trace["end_s"].to_numpy()
    for task in run.graph.tasks:
        for dep in task.deps:
            assert start[task.id] >= end[dep] - 1e-12
    for _, rows in run.trace.groupby(["rank", "stream"]):
        rows = rows.sort_values("start_s")
        assert np.all(rows["start_s"].to_numpy()[1:] >= rows["end_s"].to_numpy()[:-1] - 1e-12)


def test_same_scenario_gives_the_same_contended_trace(fsdp_pair):
    _, run = fsdp_pair
    again = runner.run(load_scenario(SCENARIOS / "llama2-7b_h100-16_fsdp.yaml", ["network.nccl_sms=24"]))
    assert again.trace.equals(run.trace)


def test_more_held_sms_never_make_the_step_faster():
    path = SCENARIOS / "llama2-7b_h100-8_dp.yaml"
    steps = [runner.run(load_scenario(path, [f"network.nccl_sms={n}"])).summary.step_time_s for n in (0, 8, 24)]
    assert steps[0] < steps[1] < steps[2]


@pytest.mark.parametrize("override, message", [
    ("network.nccl_sms=132", "network.nccl_sms: 132 SMs must leave some of H100-SXM's 132 to compute"),
    ("network.nccl_sms=-1", "network.nccl_sms"),
    ("network.nccl_sms=8 network.nccl_p2p_sms=140", "network.nccl_p2p_sms: 140 SMs must leave some of H100-SXM's"),
])
def test_bad_sm_counts_are_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_scenario(SCENARIOS / "llama2-7b_h100-8_dp.yaml", override.split())


@pytest.mark.parametrize("path, overrides", [
    ("llama2-7b_h100-16_fsdp.yaml", ["network.nccl_sms=24"]),
    ("gpt3-175b_a100-1024.yaml", ["network.nccl_sms=16", "parallel.tp=4", "parallel.pp=1", "parallel.dp=256",
                                  "parallel.zero=3", "training.micro_batch=3"]),
])
def test_estimate_follows_the_contended_simulation(path, overrides):
    """The closed-form estimate stretches a sharded layer's compute the same way (within 1%), so the search
    screens with it."""
    scenario = load_scenario(SCENARIOS / path, overrides)
    simulated = runner.run(scenario).summary.step_time_s
    plain = runner.run(load_scenario(SCENARIOS / path, overrides[1:])).summary.step_time_s
    assert simulated > plain * 1.02  # the effect is there to follow
    assert estimate(scenario).step_time_s == pytest.approx(simulated, rel=0.01)
