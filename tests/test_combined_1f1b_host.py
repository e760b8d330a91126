"""The host time Megatron-Core's combined 1F1B machinery adds to each MoE layer pass (``costs.
a2a_overlap_node_overhead``; docs/mechanisms/a2a_overlap.md "What f3e6c5 runs"): its default is the measurement's,
the plan adds it per schedule-node call under ``moe.a2a_overlap`` only, and the simulation and the estimate move
with it alike, by the closed form where every pass is host-bound."""

from __future__ import annotations

import csv
import statistics
from importlib import resources
from typing import Any

import pytest

from sim import runner
from sim.api import estimate
from sim.costs.host import SCHEDULE_NODE_CALLS, schedule_node_host_seconds
from sim.plan import resolve
from sim.spec.scenario import KernelCostsSpec, scenario_from_dict

from conftest import small_moe_model


def _doc(a2a: bool, node_overhead: float, **changes: Any) -> dict[str, Any]:
    """One MoE layer, no pipeline (combined_1f1b_schedule_for_no_pipelining: F0, then (F i+1, B i) pairs, then the
    last B), ep 8 in a node, DeepEP's exchanges fast, and a slow host (``eager_op_overhead`` 200 us): every MoE
    layer pass, alone or in a pair, is bound by the host's issue time."""
    doc: dict[str, Any] = {
        "name": "nodes", "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
        "model": small_moe_model("moe-one", num_layers=1, hidden_size=2048, heads=16, ffn_hidden_size=4096,
                                 max_seq_len=4096),
        "training": {"global_batch": 64, "micro_batch": 1, "seq_len": 4096, "flash_attention": True},
        "parallel": {"tp": 1, "pp": 1, "ep": 8, "zero": 1},
        "moe": {"token_dispatcher": "flex", "deepep_nvlink_bandwidth": "2000 GB/s", "a2a_overlap": a2a,
                "deepep_sms": 0, "host_sync": True},
        "costs": {"model": "roofline", "eager_op_overhead": 200e-6, "a2a_overlap_node_overhead": node_overhead},
        "schedule": "1f1b",
    }
    for section, values in changes.items():
        doc[section] = {**doc.get(section, {}), **values} if isinstance(values, dict) else values
    return doc


def _quiet(load: str) -> bool:
    try:
        return float(load) < 3.0
    except ValueError:  # a range, as the shared runs record it
        return False


def test_the_default_is_the_measured_extra_per_node_call() -> None:
    """costs.a2a_overlap_node_overhead's default is the measured host time per schedule-node call: f3e6c5's
    combined 1F1B (plan built per micro-batch, a merged F&B layer pair through its nodes) less the same layer
    functions run as plain 1F1B's forward and backward, over the pair's 10 node calls; the median over the quiet runs in
    sim/data/reference/combined_1f1b_host_measurements.csv (each run's median of paired repetitions), in us."""
    path = resources.files("sim").joinpath("data/reference/combined_1f1b_host_measurements.csv")
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    # the runs on a quiet host (1-minute load average below 3 on its 2 cores); runs on the host shared 8 ways (load
    # 10-16) stay in the file for the record, ~1.6x slower
    per_call = [float(r["median_s"]) for r in rows
                if r["quantity"] == "extra_per_node_call" and _quiet(r["load_avg_1min"])]
    assert len(per_call) >= 3
    median = statistics.median(per_call)
    default = KernelCostsSpec.model_fields["a2a_overlap_node_overhead"].default
    assert default == pytest.approx(round(median * 1e6) * 1e-6, abs=1e-9)
    # the per-pair figure is the per-call one times the pair's calls, and every run measured more than nothing
    for row in rows:
        if row["quantity"] == "extra_pair":
            assert float(row["median_s"]) > 0
    assert sum(SCHEDULE_NODE_CALLS.values()) == 10


def test_the_plan_adds_the_node_calls_to_each_pass_under_the_overlap_only() -> None:
    """Plan.moe_host_seconds under moe.a2a_overlap = without the knob + 4 x c (forward: attn, dispatch, mlp,
    combine node forwards) and + 6 x c (backward: four node backwards, two dw calls); without the overlap the
    knob changes nothing."""
    c = 50e-6
    with_nodes = resolve(scenario_from_dict(_doc(True, c))).moe_host_seconds
    without = resolve(scenario_from_dict(_doc(True, 0.0))).moe_host_seconds
    assert with_nodes["forward"] - without["forward"] == pytest.approx(4 * c, rel=1e-12)
    assert with_nodes["backward"] - without["backward"] == pytest.approx(6 * c, rel=1e-12)
    assert schedule_node_host_seconds("forward", c) == pytest.approx(4 * c)
    plain = resolve(scenario_from_dict(_doc(False, c))).moe_host_seconds
    assert plain == resolve(scenario_from_dict(_doc(False, 0.0))).moe_host_seconds == without
    # no host sync: nothing is host-bound, the knob does nothing either
    off = resolve(scenario_from_dict(_doc(True, c, moe={"host_sync": False}))).moe_host_seconds
    assert off == {"forward": 0.0, "backward": 0.0}


def test_the_simulation_and_the_estimate_move_together_by_the_closed_form() -> None:
    """Every pass host-bound (the host's 200 us per eager op): each of the m micro-batches' forward gains 4 x c
    and backward 6 x c of host time, alone or merged in a pair (the pair lasts at least both passes' host time),
    so the step gains m x 10 x c, in the simulation and in the estimate."""
    c = 100e-6
    steps = {}
    for knob in (0.0, c):
        scenario = scenario_from_dict(_doc(True, knob))
        steps[knob] = runner.run(scenario).summary.step_time_s, estimate(scenario).step_time_s
    m = resolve(scenario_from_dict(_doc(True, c))).microbatches
    simulated, estimated = (steps[c][i] - steps[0.0][i] for i in range(2))
    assert simulated == pytest.approx(m * 10 * c, rel=0.01)
    assert estimated == pytest.approx(simulated, rel=0.01)
