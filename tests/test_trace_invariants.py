"""Invariants on the trace of every bundled scenario (ARCHITECTURE.md: tests)."""

import numpy as np
import pytest

from sim import runner
from sim.parallel.schedules import SCHEDULES
from sim.plan import resolve
from sim.spec.scenario import load_scenario

from conftest import SCENARIOS

NAMES = sorted(p.name for p in SCENARIOS.glob("*.yaml"))


pytestmark = pytest.mark.xdist_group("bundled-runs")  # one worker runs each bundled scenario, once (conftest)


@pytest.fixture(scope="module", params=NAMES)
def run(request, bundled_run):
    return bundled_run(request.param)


def test_mfu_at_most_hfu_at_most_one_and_a_finite_step(run):
    """Model FLOPs never exceed the FLOPs the trace executed, which never exceed the peak (issue 27: pipeline-4x8
    reported HFU below MFU, its fixed costs running no LM head). The model FLOPs counted as the kernels run them:
    causal attention's s(s+1)/2 pairs (``mfu_causal``), since the trace counts a causal flash kernel's executed
    tiles, not Megatron's full matrix (``mfu``'s; Op.executed_flops); no task runs faster than the peak."""
    summary = run.summary
    model = summary.mfu if summary.mfu_causal is None else summary.mfu_causal
    assert model <= summary.hfu * (1 + 1e-12) <= 1
    if summary.mfu_causal is None:
        assert summary.mfu <= summary.hfu * (1 + 1e-12)
    peak = run.scenario.cluster.gpu.peak(resolve(run.scenario).dtype)
    compute = run.trace[run.trace["flops"] > 0]
    assert (compute["flops"] <= peak * (compute["end_s"] - compute["start_s"]) * (1 + 1e-12)).all()
    assert np.isfinite(summary.step_time_s) and summary.step_time_s > 0


def test_no_stream_runs_two_tasks_at_once(run):
    for _, rows in run.trace.groupby(["rank", "stream"]):
        rows = rows.sort_values(["start_s", "end_s"])
        assert np.all(rows["start_s"].to_numpy()[1:] >= rows["end_s"].to_numpy()[:-1])


def test_every_task_starts_after_its_dependencies_end(run):
    start = run.trace["start_s"].to_numpy()
    end = run.trace["end_s"].to_numpy()
    for task in run.graph.tasks:
        for dep in task.deps:
            assert start[task.id] >= end[dep]


def test_one_forward_and_one_backward_per_layer_block_per_microbatch(run):
    layered = run.trace[(run.trace["layer"] >= 0) & run.trace["kind"].isin(["forward", "backward"])]
    counts = layered.groupby(["rank", "kind", "microbatch", "layer", "name"]).size()
    # Context parallelism: the attention block is attention (norm, QKV), its core (one task per ring step under
    # p2p, else one) and attention_out (output projection, residual).
    plan = resolve(run.scenario)
    cores = 0 if plan.cp == 1 else plan.cp if plan.cp_comm_type == "p2p" else 1
    forward = counts[counts.index.get_level_values("kind") == "forward"]
    core = forward.index.get_level_values("name") == "attention_core"
    assert set(forward[~core]) == {1} and set(forward[core]) <= {cores}
    m = plan.microbatches
    # With TP, a fused backward block is two tasks: the input gradient, then the column-parallel GEMM's weight
    # gradient that Megatron runs beside the asynchronous input-gradient reduction.
    sc = run.scenario
    split = sc.parallel.tp > 1 and sc.costs.model != "fixed" and not SCHEDULES[sc.schedule].splits_backward
    # A MoE layer's MLP part is its router, grouped experts and combine (and a shared expert), one task each.
    plan = resolve(sc)
    # With the dispatcher's host sync (sim.costs.host) each MoE layer pass ends with a zero-length moe_host_wait.
    moe_blocks = 3 + bool(sc.model.moe_shared_expert_intermediate_size) + bool(plan.moe_host_seconds["forward"])
    for (rank, kind), rows in layered.groupby(["rank", "kind"]):
        stage = plan.grid.coord(int(rank)).pp
        per_stage = plan.stage_layers(stage)  # uneven first/last stages included
        moe = plan.stage_moe_layers(stage)
        attention = 2 if kind == "backward" and split else 1
        # DualPipe: a rank holds one stage of each of the two model copies and each micro-batch runs through one
        # copy (half enter from each end), so each of the rank's layers sees m/2 micro-batches.
        passes = m // 2 if sc.schedule == "dualpipe" else m
        cp_tasks = cores + 1 if cores else 0  # the core's tasks and attention_out
        assert len(rows) == passes * ((per_stage - moe) * (2 * attention + cp_tasks)
                                      + moe * (attention + cp_tasks + moe_blocks))


def test_durations_are_finite_and_non_negative(run):
    d = run.trace["end_s"] - run.trace["start_s"]
    assert np.all(np.isfinite(d)) and np.all(d >= 0)


def test_summary_is_consistent(run):
    s = run.summary
    assert s.step_time_s == pytest.approx(run.trace["end_s"].max())
    assert 0 <= s.bubble_fraction < 1 and 0 < s.mfu <= 1
    if run.scenario.costs.model != "fixed":  # fixed costs leave out the embedding and head tasks (zero time)
        assert s.hfu >= (s.mfu if s.mfu_causal is None else s.mfu_causal) - 1e-12
    assert s.tokens_per_s == pytest.approx(
        resolve(run.scenario).global_batch * resolve(run.scenario).seq_len / s.step_time_s)


def _overlap_s(trace, rank: int, same_layer_backward: bool = True) -> float:
    """Seconds a rank's compute runs while one of its TP collectives does; ``same_layer_backward=False`` leaves
    out a backward task overlapping a collective of its own micro-batch and layer (Megatron's asynchronous
    input-gradient reduction under the weight-gradient GEMM)."""
    rows = trace[trace["rank"] == rank]
    columns = ["start_s", "end_s", "kind", "microbatch", "layer"]
    compute = rows[rows["stream"] == "compute"][columns].to_numpy()
    tp = rows[rows["stream"] == "tp"][columns].to_numpy()
    return float(sum(max(0.0, min(c[1], t[1]) - max(c[0], t[0])) for c in compute for t in tp
                     if same_layer_backward or not (c[2] == "backward" and (c[3], c[4]) == (t[3], t[4]))))


def test_synchronous_tp_collectives_block_the_compute_stream():
    # Megatron's TP all-reduce / reduce-scatter is synchronous: nothing computes on the GPU while it runs, even
    # a task that does not consume it (the next micro-batch's first block after a chunk ends). The one exception
    # is the backward's input-gradient reduction, which Megatron issues asynchronously under the weight gradient.
    base = ["schedule=interleaved", "parallel.vpp=2", "training.microbatches=4", "training.global_batch=null"]
    blocking = runner.run(load_scenario(SCENARIOS / "tiny.yaml", base)).trace
    ranks = blocking["rank"].unique()
    assert all(_overlap_s(blocking, rank, same_layer_backward=False) == 0.0 for rank in ranks)
    assert all(_overlap_s(blocking, rank) > 0.0 for rank in ranks)  # the asynchronous backward reductions
    overlapped = runner.run(load_scenario(SCENARIOS / "tiny.yaml", [*base, "parallel.tp_comm_overlap=true",
                                                                     "parallel.overlap_p2p_comm=true"])).trace
    assert max(_overlap_s(overlapped, rank, same_layer_backward=False) for rank in overlapped["rank"].unique()) > 0
    assert overlapped["end_s"].max() < blocking["end_s"].max()
