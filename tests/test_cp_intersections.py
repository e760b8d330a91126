"""Context parallelism where it meets other features (found by review after the merges of issue 24): selective
recomputation's rebuilt activations, HYBRID_SHARD over the dp x cp gradient group, the run-size estimate's data-
parallel tasks, the estimator's per-shape cache, and the summary's layout."""

from __future__ import annotations

import pytest

from sim import runner
from sim.errors import ConfigError
from sim.explore.estimate import Estimator
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload.build import build
from sim.workload.size import estimate_size

from conftest import SCENARIOS

LONG = SCENARIOS / "llama3.1-405b_h100-16384_cp16-128k.yaml"
FSDP = SCENARIOS / "llama2-7b_h100-16_fsdp.yaml"


def test_selective_rebuild_bytes_fall_by_cp_like_the_kept_activations():
    selective = ["training.recompute=selective", "training.recompute_num_layers=null",
                 "training.recompute_modules=[core_attn,mlp]"]
    plans = {cp: resolve(load_scenario(LONG, [f"parallel.cp={cp}", f"parallel.dp={128 // cp}", *selective]))
             for cp in (1, 2, 16)}
    for cp in (2, 16):
        assert plans[cp].rebuild_bytes == pytest.approx(plans[1].rebuild_bytes / cp, rel=1e-12)
        assert plans[cp].activation_bytes() == pytest.approx(plans[1].activation_bytes() / cp, rel=1e-12)


def test_hybrid_shard_spans_the_dp_x_cp_gradient_group():
    """dp 8 x cp 2 = 16 ranks over two 8-GPU nodes: FSDP shards inside a node and replicates across (as
    grid.dp_group is dp x cp); refused before because only dp = 8 was counted."""
    plan = resolve(load_scenario(FSDP, ["parallel.dp=8", "parallel.cp=2", "fsdp.sharding=HYBRID_SHARD"]))
    assert plan.hybrid and plan.cp == 2
    with pytest.raises(ConfigError, match="HYBRID_SHARD needs the dp x cp = 8 ranks"):
        load_scenario(FSDP, ["cluster.nodes=1", "parallel.dp=4", "parallel.cp=2", "fsdp.sharding=HYBRID_SHARD"])


def test_run_size_counts_fsdp_tasks_when_only_cp_makes_the_gradient_group():
    plan = resolve(load_scenario(FSDP, ["cluster.nodes=1", "cluster.gpus_per_node=2", "parallel.dp=1",
                                        "parallel.cp=2"]))
    assert plan.data_parallel and plan.dp == 1
    built = len(build(plan).tasks)
    assert estimate_size(plan).tasks == pytest.approx(built, rel=0.25)


@pytest.mark.parametrize("change", [["training.sequence={packing: true, lengths: fixed, length: 512}"],
                                    ["training.method=lora"]])
def test_an_estimator_reused_for_another_scenario_prices_it_afresh(change):
    base = load_scenario(FSDP, ["parallel.dp=8", "parallel.cp=2"])
    other = load_scenario(FSDP, ["parallel.dp=8", "parallel.cp=2", *change])
    assert Estimator(base).estimate(other).step_time_s == pytest.approx(
        Estimator(other).estimate(other).step_time_s, rel=1e-12)


def test_summary_layout_names_cp():
    summary = runner.run(load_scenario(LONG)).summary
    layout = summary.layout
    assert (layout.tp, layout.cp, layout.pp, layout.dp, layout.ep) == (8, 16, 16, 8, 1)
    assert layout.tp * layout.cp * layout.pp * layout.dp == summary.num_gpus
