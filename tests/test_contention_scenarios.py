"""Every rank on the flow-level network: an oversubscribed spine slows the DP all-reduce by its bottleneck.

Scenario: scenarios/llama2-7b_h100-32_spine.yaml (4 DGX H100 nodes, tp 8 in a node, DDP across nodes, 2 nodes per
leaf, ranks: all, network: contention, ring).
"""

import pytest

from sim import runner
from sim.network.models import ContentionNetwork
from sim.plan import resolve
from sim.spec.scenario import load_scenario

from conftest import SCENARIOS

SPINE = SCENARIOS / "llama2-7b_h100-32_spine.yaml"


pytestmark = pytest.mark.xdist_group("contention-spine")  # one worker runs the module's two runs, once


@pytest.fixture(scope="module")
def runs():
    return {ratio: runner.run(load_scenario(SPINE, [f"cluster.fabric.oversubscription={ratio}"]), record_links=True)
            for ratio in (1, 4)}


def buckets(result, rank=0):
    return [t for t in result.graph.tasks if t.rank == rank and t.name.startswith("grad_bucket")]


def test_oversubscribed_spine_slows_each_bucket_by_the_bottleneck_factor(runs):
    scenario = runs[4].scenario
    network = ContentionNetwork(runner.build_topology(resolve(scenario)), "ring")
    nic = scenario.cluster.inter_node
    # Two nodes' rail-r NICs under a leaf, 4:1: the uplink offers 2 x 50 GB/s / 4 at the tier's efficiency.
    uplink = 2 * nic.bandwidth / 4 * nic.efficiency
    checked = 0
    for slow, fast in zip(buckets(runs[4]), buckets(runs[1]), strict=True):
        (phase,) = network.transfer(slow.op, slow.nbytes, slow.group)
        cap = phase.channels[0].rate_cap  # one NIC at the size's efficiency: what the ring runs at on 1:1
        time_4 = runs[4].trace.at[slow.id, "end_s"] - runs[4].trace.at[slow.id, "start_s"]
        time_1 = runs[1].trace.at[fast.id, "end_s"] - runs[1].trace.at[fast.id, "start_s"]
        assert (time_4 - phase.latency) / (time_1 - phase.latency) == pytest.approx(cap / min(cap, uplink), rel=1e-9)
        checked += cap > uplink
    assert checked > 10  # most buckets are large enough to be bandwidth-bound on the NIC


def test_the_step_grows_by_the_exposed_dp_communication(runs):
    slow, fast = runs[4].summary, runs[1].summary
    assert slow.step_time_s > fast.step_time_s * 1.1
    grown = slow.exposed_comm_s["dp"] - fast.exposed_comm_s["dp"]
    assert slow.step_time_s - fast.step_time_s == pytest.approx(grown, rel=0.02)


def test_links_say_which_links_were_busy(runs):
    busiest = runs[4].summary.busiest_links
    assert busiest and all("spine" in link.link and link.saturated_s > 0 for link in busiest)
    usage = runs[4].links
    assert set(usage[usage["saturated_s"] > 0]["tier"]) == {"uplink"}  # only the spine links ever saturate
    full = runs[1].links
    assert set(full[full["saturated_s"] > 0]["tier"]) <= {"nic"}  # at 1:1 the NICs are the bottleneck


def test_no_link_ever_runs_over_capacity(runs):
    for result in runs.values():
        assert (result.link_segments["load_fraction"] <= 1 + 1e-9).all()
        assert (result.links["peak_load_fraction"] <= 1 + 1e-9).all()


def test_without_contention_every_rank_agrees_with_the_analytic_slice(runs):
    analytic = runner.run(load_scenario(SPINE, ["cluster.fabric.oversubscription=1", "network.model=analytic",
                                                "ranks=slice"]))
    assert runs[1].summary.step_time_s == pytest.approx(analytic.summary.step_time_s, rel=1e-9)
    all_ranks = runner.run(load_scenario(SPINE, ["network.model=analytic"]))
    assert all_ranks.summary.step_time_s == pytest.approx(analytic.summary.step_time_s, rel=1e-12)
    assert all_ranks.trace["rank"].nunique() == 4  # one process per TP group of 8 (lockstep folding)
    unfolded = runner.run(load_scenario(SPINE, ["network.model=analytic", "fold_tp=false"]))
    assert unfolded.trace["rank"].nunique() == 32
    assert unfolded.summary.step_time_s == pytest.approx(analytic.summary.step_time_s, rel=1e-12)


def test_every_replica_prices_its_work_like_the_representative_of_its_stage():
    """ranks: all builds one pipeline per (tp, dp) replica; each rank's compute must cost exactly what its
    stage's representative costs in slice mode (roofline costs, end stages with embedding and head)."""
    sets = ["cluster.gpus_per_node=8", "parallel.pp=4", "parallel.dp=2", "training.microbatches=4",
            "costs=roofline", "network=analytic"]
    base = SCENARIOS / "pipeline-4x8.yaml"
    slice_run = runner.run(load_scenario(base, sets))
    all_run = runner.run(load_scenario(base, [*sets, "ranks=all"]))

    def durations(result):
        compute = result.trace[result.trace["stream"] == "compute"]
        return {rank: sorted(rows["end_s"] - rows["start_s"]) for rank, rows in compute.groupby("rank")}

    representative = durations(slice_run)
    stage_of = all_run.trace.groupby("rank")["stage"].first()
    reference = {int(slice_run.trace[slice_run.trace["rank"] == r]["stage"].iloc[0]): d
                 for r, d in representative.items()}
    for rank, values in durations(all_run).items():
        assert values == pytest.approx(reference[int(stage_of[rank])], rel=1e-12), rank
    assert all_run.summary.step_time_s == pytest.approx(slice_run.summary.step_time_s, rel=1e-12)
