"""moe.host_sync: a MoE layer pass lasts at least the host's time to issue it, behind the token dispatcher's host
sync (sim.costs.host, docs/mechanisms/moe_host_sync.md): the closed form, the measurement it comes from
(sim/data/reference/moe_host_measurements.csv), when Megatron-Core syncs, the pass spans on the trace, and the
estimate against the simulation."""

from __future__ import annotations

import statistics
from importlib import resources
from typing import Any

import pandas as pd
import pytest

from sim import runner
from sim.api import estimate
from sim.costs.host import (
    EAGER_MOE_LAYER_KERNELS,
    EAGER_MOE_PART_KERNELS,
    EXPERT_GEMMS,
    MEGATRON_MOE_PASSES,
    TE_MODULE_PASSES,
    host_bound,
    moe_layer_host_seconds,
    te_linear_modules,
)
from sim.plan import resolve
from sim.spec.scenario import Scenario, load_scenario, scenario_from_dict

from conftest import SCENARIOS, small_moe_model

TP4 = SCENARIOS / "validation" / "moe" / "mz-qwen3-235b-h100-256-deepep-tp4.yaml"


def _measured() -> pd.DataFrame:
    path = resources.files("sim").joinpath("data/reference/moe_host_measurements.csv")
    table = pd.read_csv(path)  # type: ignore[arg-type]
    return table.pivot_table(index=["row", "exchange", "pass", "local_experts"], columns="quantity",
                             values="median").reset_index()


def test_the_host_cost_per_kernel_is_the_measured_median() -> None:
    """costs.eager_op_overhead's default (32 us) is the median host time per kernel of the H100 replay's twelve
    (row, exchange stand-in, pass) measurements, each 26-36 us: six times the 5 us of a bare CUDA launch."""
    table = _measured()
    per_kernel = table["host_per_kernel_s"]
    assert len(per_kernel) == 12
    assert per_kernel.between(26e-6, 36e-6).all()
    assert statistics.median(per_kernel) == pytest.approx(32e-6, abs=0.5e-6)
    assert load_scenario(TP4).costs.eager_op_overhead == 32e-6  # type: ignore[union-attr]


def test_the_eager_kernel_counts_are_the_replays_less_its_expert_gemms() -> None:
    """EAGER_MOE_LAYER_KERNELS: the replay's kernels per layer pass (exchange stand-in ``copy``) less its
    per-expert GEMMs (2 per local expert forward, 4 backward), averaged over the three rows, to the kernel."""
    table = _measured()
    copy = table[table["exchange"] == "copy"]
    for direction in ("forward", "backward"):
        rows = copy[copy["pass"] == direction]
        eager = rows["kernels"] - EXPERT_GEMMS[direction] * rows["local_experts"]  # type: ignore[literal-required]
        assert round(eager.mean()) == EAGER_MOE_LAYER_KERNELS[direction]  # type: ignore[index]


def test_a_pass_takes_the_larger_of_its_kernel_and_host_time_on_the_h100() -> None:
    """The rule, on the measurement: each replayed layer pass's wall time (without the sync, so the host time is
    the same run's) is the larger of its kernel time and its host time, up to 0.7 ms above it (the host-bound
    router stretch and the device-bound expert GEMMs do not fully average out inside a pass); the sync itself
    adds at most 0.2 ms to a pass (the GPU has little queued when the host waits)."""
    table = _measured()
    bound = table[["kernel_s", "host_s"]].max(axis=1)
    assert (table["wall_nosync_s"] >= 0.99 * bound).all()
    assert (table["wall_nosync_s"] - bound <= 0.7e-3).all()
    assert (table["exposed_sync_s"] <= 0.2e-3).all()
    assert host_bound(1e-3, 3e-3) == 3e-3 and host_bound(4e-3, 3e-3) == 4e-3


def test_the_qwen3_tp4_rows_host_time_in_closed_form() -> None:
    """DeepEP tp 4, ep 8: 16 local experts. Forward (100 eager kernels + 63 eager ops' worth of Megatron-Core's
    own MoE code) x 32 us + 32 expert GEMMs x 5 us + 4 Transformer Engine linear modules x 83 us = 5.708 ms;
    backward 92 x 32 us + 64 x 5 us = 3.264 ms (no TE module or Megatron term: neither was measured above the
    replay in a backward)."""
    plan = resolve(load_scenario(TP4))
    assert plan.local_experts == 16
    assert plan.moe_host_seconds["forward"] == pytest.approx((100 + 63) * 32e-6 + 32 * 5e-6 + 4 * 83e-6,
                                                             rel=1e-12)
    assert plan.moe_host_seconds["forward"] == pytest.approx(5.708e-3, rel=1e-12)
    assert plan.moe_host_seconds["backward"] == pytest.approx(92 * 32e-6 + 64 * 5e-6, rel=1e-12)
    assert moe_layer_host_seconds("forward", 4, 10e-6, 1e-6, 0.0) == pytest.approx(100 * 10e-6 + 8 * 1e-6)
    assert moe_layer_host_seconds("forward", 4, 10e-6, 1e-6, 50e-6) == pytest.approx(
        100 * 10e-6 + 8 * 1e-6 + 4 * 50e-6)
    assert moe_layer_host_seconds("backward", 4, 10e-6, 1e-6, 50e-6) == pytest.approx(92 * 10e-6 + 16 * 1e-6)
    assert moe_layer_host_seconds("forward", 4, 10e-6, 1e-6, 0.0, megatron_moe_host_ops=7) == pytest.approx(
        (100 + 7) * 10e-6 + 8 * 1e-6)
    assert moe_layer_host_seconds("backward", 4, 10e-6, 1e-6, 0.0, megatron_moe_host_ops=7) == pytest.approx(
        92 * 10e-6 + 16 * 1e-6)


def _te_measured() -> pd.DataFrame:
    path = resources.files("sim").joinpath("data/reference/te_module_host_measurements.csv")
    return pd.read_csv(path)  # type: ignore[arg-type]


def test_the_te_module_overhead_is_the_measured_te_linear_less_the_replays_eager_op() -> None:
    """costs.te_module_overhead's default (83 us) is the host time of one Megatron-Core TEColumnParallelLinear
    forward as measured in NVIDIA/TransformerEngine#1191 (115 us, BF16, TP 1, with that PR's 1.22x: 140 us before)
    less the one eager op (costs.eager_op_overhead, 32 us) the plain-PyTorch replay issued for its GEMM; the same
    source's Megatron-Core ColumnParallelLinear (a torch GEMM) took 74 us, so TE's module costs the host more than
    Megatron's own. Counted four times per forward (qkv, proj, fc1, fc2), none in the backward."""
    table = _te_measured()
    issue_1191 = table[table["source"].str.startswith("NVIDIA/TransformerEngine#1191")]
    te_after = issue_1191[issue_1191["module"] == "Megatron-Core TEColumnParallelLinear"]["value_us"].min()
    torch_module = float(issue_1191[issue_1191["module"].str.startswith("Megatron-Core ColumnParallel")]
                         ["value_us"].iloc[0])
    assert te_after == 115 and torch_module == 74
    assert issue_1191["value_us"].max() / te_after == pytest.approx(1.22, abs=0.005)  # the PR's speed-up
    costs = load_scenario(TP4).costs
    assert costs.te_module_overhead == pytest.approx(te_after * 1e-6 - costs.eager_op_overhead)  # type: ignore[union-attr]
    assert TE_MODULE_PASSES == {"forward": 1, "backward": 0}


def test_te_linear_costs_the_host_more_than_torchs_on_every_host_measured() -> None:
    """The cross-check rows (NVIDIA/TransformerEngine#2053, BF16 hidden 2048 x 8192 tokens): on both Grace hosts
    te.Linear's forward costs the host 2.7x torch.nn.Linear's (GB200 99.66 / 37.08 us, GH200 90.53 / 33.17 us);
    the DGX H100's Xeon 8480C issues torch.nn.Linear in 13.48 us. The extra over torch, 57-63 us on Grace, is of
    the order of the 41 us TransformerEngine#1191 measured between Megatron's TE and torch column-parallel linears
    (115 against 74 us)."""
    table = _te_measured().set_index(["host", "module"])["value_us"]
    for grace in ("GB200 (Grace)", "GH200 (Grace)"):
        ratio = table[(grace, "te.Linear")] / table[(grace, "torch.nn.Linear")]
        assert ratio == pytest.approx(2.71, abs=0.03)
        assert 55 <= table[(grace, "te.Linear")] - table[(grace, "torch.nn.Linear")] <= 65
    assert table[("H100 DGX (Intel Xeon Platinum 8480C)", "torch.nn.Linear")] == 13.48


def test_the_te_module_term_moves_only_the_forward_bound() -> None:
    """costs.te_module_overhead adds 4 x its value to each MoE layer forward's host time and nothing to the
    backward's; 0 restores the replay-only bound, and costs.eager_op_overhead 0 still turns the whole bound off."""
    base = resolve(_scenario()).moe_host_seconds
    doc = _doc()
    doc["costs"] = {"model": "roofline", "te_module_overhead": 0, "megatron_moe_host_ops": 63}
    bare = resolve(scenario_from_dict(doc)).moe_host_seconds
    assert base["forward"] - bare["forward"] == pytest.approx(4 * 83e-6, rel=1e-9)
    assert base["backward"] == bare["backward"]
    doc["costs"] = {"model": "roofline", "eager_op_overhead": 0, "te_module_overhead": 200e-6}
    assert resolve(scenario_from_dict(doc)).moe_host_seconds == {"forward": 0.0, "backward": 0.0}


def _doc(**moe: Any) -> dict[str, Any]:
    """One MoE layer of a small model on 8 GPUs (ep 8, flex), no pipeline, 4 micro-batches: its passes last well
    under the host's ~3.2 ms."""
    return {
        "name": "host-sync", "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
        "model": small_moe_model("moe-one", num_layers=1, hidden_size=1024, heads=8, ffn_hidden_size=2048,
                                 max_seq_len=2048),
        "training": {"global_batch": 32, "micro_batch": 1, "seq_len": 2048, "flash_attention": True},
        "parallel": {"tp": 1, "pp": 1, "ep": 8, "zero": 1},
        "moe": {"token_dispatcher": "flex", **moe},
        "schedule": "1f1b",
    }


def _scenario(**moe: Any) -> Scenario:
    return scenario_from_dict(_doc(**moe))


@pytest.mark.parametrize(("moe", "training", "costs", "on"), [
    ({"token_dispatcher": "flex"}, {}, {}, True),
    ({"token_dispatcher": "alltoall"}, {}, {}, True),  # dropless: cuda_dtoh_stream.synchronize()
    ({"token_dispatcher": "allgather"}, {}, {}, True),  # local_map.sum(dim=0).long().cpu()
    ({"token_dispatcher": "alltoall", "capacity_factor": 1.0}, {}, {}, True),  # before_permutation_1
    ({"token_dispatcher": "alltoall", "capacity_factor": 1.0, "pad_to_capacity": True}, {}, {}, False),
    ({"token_dispatcher": "flex", "host_sync": False}, {}, {}, False),
    ({"token_dispatcher": "alltoall", "capacity_factor": 1.0, "pad_to_capacity": True, "host_sync": True}, {}, {},
     True),
    ({"token_dispatcher": "flex"}, {"cuda_graphs": True}, {}, False),
    ({"token_dispatcher": "flex"}, {}, {"eager_op_overhead": 0}, False),
])
def test_which_configurations_sync_the_host(moe: dict[str, Any], training: dict[str, Any], costs: dict[str, Any],
                                            on: bool) -> None:
    """Megatron-Core's rule (token_dispatcher.py at 1e05700595): every dispatcher syncs the host in each MoE
    layer's forward except alltoall with pad_to_capacity (drop_and_pad: fixed shapes); moe.host_sync overrides it;
    training.cuda_graphs and costs.eager_op_overhead 0 turn the bound off."""
    doc = _doc(**moe)
    doc["training"] = {**doc["training"], **training}
    if costs:
        doc["costs"] = {"model": "roofline", **costs}
    plan = resolve(scenario_from_dict(doc))
    assert (plan.moe_host_seconds["forward"] > 0) is on
    assert (plan.moe_host_seconds["backward"] > 0) is on


def _pass_spans(scenario: Scenario) -> dict[tuple[str, int], float]:
    """Rank 0's layer pass spans (first compute task's start to the last one's end), per (kind, micro-batch)."""
    trace = runner.run(scenario).trace
    compute = trace[(trace["rank"] == 0) & (trace["stream"] == "compute") & (trace["layer"] == 0)]
    spans = compute.groupby(["kind", "microbatch"]).agg(start=("start_s", "min"), end=("end_s", "max"))
    return {(str(kind), int(mb)): float(row.end - row.start) for (kind, mb), row in spans.iterrows()}


def test_each_moe_layer_pass_lasts_the_larger_of_its_device_and_host_time() -> None:
    """On the trace: each MoE layer pass with the host sync spans max(its span without it, the host's issue time)
    (the host task counted from the pass's first task's start); the host stream holds one issue per pass."""
    on, off = _scenario(), _scenario(host_sync=False)
    host = resolve(on).moe_host_seconds
    spans_on, spans_off = _pass_spans(on), _pass_spans(off)
    assert spans_on.keys() == spans_off.keys()
    bound = 0
    for (kind, mb), span in spans_off.items():
        assert spans_on[(kind, mb)] == pytest.approx(max(span, host[kind]), rel=1e-9)
        bound += host[kind] > span
    assert bound == len(spans_off)  # this small layer is host-bound in every pass
    trace = runner.run(on).trace
    issues = trace[(trace["rank"] == 0) & (trace["stream"] == "host")]
    assert len(issues) == len(spans_on) and set(issues["name"]) == {"moe_host_issue"}


def test_the_estimate_follows_the_simulation_where_the_host_binds() -> None:
    """The estimate prices each MoE layer pass as max(device, host) too: within 5% of the simulation on the
    small host-bound model and on the Qwen3 tp 4 row, whose forward is host-bound (3.69 ms against ~1.7 ms)."""
    for scenario in (_scenario(), load_scenario(TP4)):
        simulated = runner.run(scenario).summary.step_time_s
        assert estimate(scenario).step_time_s == pytest.approx(simulated, rel=0.05)


def test_te_linear_modules_follow_megatrons_te_layer_spec() -> None:
    """Megatron-Core's TE layer spec (Megatron-LM 1e05700595 gpt_layer_specs.py, moe_module_specs.py): GQA's
    linear_qkv + linear_proj, MLA's q (or q_down + q_up), kv_down, kv_up and proj, the experts' two grouped linears,
    a shared expert's two: Qwen3-235B and Mixtral 4, DeepSeek-V3 (query latent, shared expert) 9; the plan prices
    that many in a MoE layer's forward."""
    assert te_linear_modules(mla=False, q_latent=False, shared_expert=False) == 4
    assert te_linear_modules(mla=True, q_latent=False, shared_expert=False) == 6
    assert te_linear_modules(mla=True, q_latent=True, shared_expert=True) == 9
    assert te_linear_modules(mla=False, q_latent=False, shared_expert=True) == 6
    plan = resolve(load_scenario(SCENARIOS / "deepseek-v3_h800-2048.yaml"))
    assert plan.local_experts == 4
    assert plan.moe_host_seconds["forward"] == pytest.approx((100 + 63) * 32e-6 + 2 * 4 * 5e-6 + 9 * 83e-6,
                                                             rel=1e-12)
    assert plan.moe_host_seconds["backward"] == pytest.approx(92 * 32e-6 + 4 * 4 * 5e-6, rel=1e-12)


def _megatron_measured() -> pd.DataFrame:
    path = resources.files("sim").joinpath("data/reference/megatron_moe_host_measurements.csv")
    table = pd.read_csv(path)  # type: ignore[arg-type]
    return table.pivot_table(index=["device", "shape", "impl", "pass"], columns="quantity", values="value")


def _megatron_extra_ops(table: pd.DataFrame, shape: str) -> list[float]:
    """Per (host, run, Megatron permute path): Megatron-Core's router + dispatch + unpermute host time less the
    replay's same parts, over the replay's host time per kernel in that run (eager ops' worth)."""
    parts = ["router_s", "dispatch_s", "combine_s"]
    out = []
    for device in table.index.get_level_values("device").unique():
        for run in (0, 1):
            replay = table.loc[(device, shape, "replay", run)]
            per_kernel = replay["host_fwd_s"] / replay["kernels_fwd"]
            for impl in ("megatron-unfused", "megatron-fused"):
                megatron = table.loc[(device, shape, impl, run)]
                out.append(float((megatron[parts].sum() - replay[parts].sum()) / per_kernel))
    return out


def test_megatrons_moe_code_costs_the_measured_eager_ops_beyond_the_replay() -> None:
    """costs.megatron_moe_host_ops's default (63) is the median, over two hosts (H100, H200), two runs and two
    permute paths, of what Megatron-LM 1e05700595's own TopKRouter, MoEAlltoAllTokenDispatcher.token_permutation
    and token_unpermutation cost the host beyond the replay's op sequence for the same parts, in the replay's host
    time per kernel on the same host; measured on the tiny shape, whose kernels are shorter than their launch, so
    the host never waits at the sync. Six of the eight samples lie within 61-82 ops (the other two come from one
    run whose replay issued at 35 us per kernel, not 17-21); Megatron's parts take 1.3-2.6x the replay's."""
    table = _megatron_measured()
    ops = _megatron_extra_ops(table, "tiny")
    assert len(ops) == 8
    assert round(statistics.median(ops)) == 63
    assert load_scenario(TP4).costs.megatron_moe_host_ops == 63  # type: ignore[union-attr]
    assert sum(61 <= o <= 82 for o in ops) == 6
    parts = ["router_s", "dispatch_s", "combine_s"]
    for device in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        for run in (0, 1):
            for impl in ("megatron-unfused", "megatron-fused"):
                ratio = (table.loc[(device, "tiny", impl, run)][parts].sum()
                         / table.loc[(device, "tiny", "replay", run)][parts].sum())
                assert 1.3 <= ratio <= 2.6


def test_megatrons_moe_backward_costs_the_host_no_more_than_the_replays() -> None:
    """Why the Megatron term is the forward's only: on every host, shape and run, Megatron-Core's MoE backward
    (the mean of its two permute paths; its grouped GEMM one kernel per GEMM) issued in no more host time than the
    replay's (whose expert GEMMs loop in Python), one sample of eight above it (H100, A2A pp 32, unfused, run 1:
    2.71 against 2.32 ms); and at the row shapes Megatron's backward is device-bound (wall within 15% of its
    kernel time)."""
    table = _megatron_measured()
    for device in table.index.get_level_values("device").unique():
        for shape in ("tiny", "tp4", "a2a-pp32"):
            for run in (0, 1):
                replay = table.loc[(device, shape, "replay", run)]["host_bwd_s"]
                paths = [table.loc[(device, shape, impl, run)] for impl in ("megatron-unfused", "megatron-fused")]
                assert statistics.mean(p["host_bwd_s"] for p in paths) <= replay
                if shape != "tiny":
                    assert all(p["wall_bwd_s"] <= 1.15 * p["kernel_bwd_s"] for p in paths)
    assert MEGATRON_MOE_PASSES == {"forward": 1, "backward": 0}


def test_recomputing_module_moe_issues_the_replayed_forwards_host_time_in_the_backward() -> None:
    """Megatron-Core's selective recomputation of module ``moe`` checkpoints the MoE layer's custom_forward, so the
    backward pass reruns the router, the dispatcher's host sync and the unpermute: on the small host-bound layer
    each backward pass then lasts at least the backward's host time plus Megatron's own MoE code's forward
    (costs.megatron_moe_host_ops x costs.eager_op_overhead, a lower bound on the replayed forward's host time).
    Found in review8; the replayed MoE part is priced as its eager kernels (63: the replay's MoE part at the tiny
    shape, 95 kernels, less its 2 x 16 expert GEMMs), Megatron's own code, the expert GEMM launches and the
    experts' two TE grouped-linear modules (Plan.moe_replay_host_seconds, sim.costs.host.moe_part_host_seconds);
    the estimate prices the backward bound with it too."""
    doc = _doc()
    doc["training"] = {**doc["training"], "recompute": "selective", "recompute_modules": ["moe"]}
    scenario = scenario_from_dict(doc)
    plan = resolve(scenario)
    costs = scenario.costs
    rerun = costs.megatron_moe_host_ops * costs.eager_op_overhead  # type: ignore[union-attr]
    assert rerun == pytest.approx(63 * 32e-6)
    trace = runner.run(scenario).trace
    compute = trace[(trace["rank"] == 0) & (trace["stream"] == "compute") & (trace["layer"] == 0)
                    & trace["kind"].isin(["recompute", "backward"])]
    assert set(compute["kind"]) == {"recompute", "backward"}
    # the backward pass with the forward it replays: from its first task's start to the host wait's end
    spans = compute.groupby("microbatch").agg(start=("start_s", "min"), end=("end_s", "max"))
    assert len(spans) == 4
    for row in spans.itertuples():
        assert row.end - row.start >= plan.moe_host_seconds["backward"] + rerun
    replay = (63 + 63) * 32e-6 + 2 * plan.local_experts * 5e-6 + 2 * 83e-6
    assert plan.moe_replay_host_seconds == pytest.approx(replay, rel=1e-12)
    assert (spans["end"] - spans["start"]).max() == pytest.approx(plan.moe_host_seconds["backward"] + replay,
                                                                  rel=0.05)
    table = _megatron_measured()
    replay_tiny = table.loc[("NVIDIA H200", "tiny", "replay", 0)]
    assert replay_tiny["kernels_fwd"] - EXPERT_GEMMS["forward"] * 16 == EAGER_MOE_PART_KERNELS == 63
    assert estimate(scenario).step_time_s == pytest.approx(runner.run(scenario).summary.step_time_s, rel=0.03)
    doc["training"] = {**doc["training"], "recompute_modules": ["layernorm", "moe_act"]}
    assert resolve(scenario_from_dict(doc)).moe_replay_host_seconds == 0.0


def test_recomputing_module_moe_replays_the_shared_experts_te_modules_too() -> None:
    """Megatron-Core's module ``moe`` checkpoints MoELayer's custom_forward, which runs the shared expert too
    (moe_layer.py at 1e05700595: ``output += self.shared_experts(hidden_states)`` inside custom_forward), so the
    replayed forward calls the shared expert's two TE linear modules (TEColumnParallelLinear, TERowParallelLinear)
    besides the experts' two grouped linears: as many TE modules as the layer's forward calls beyond attention's
    (sim.costs.host.te_linear_modules). Found in review9: the replay counted the experts' two alone."""
    doc = _doc()
    doc["training"] = {**doc["training"], "recompute": "selective", "recompute_modules": ["moe"]}
    plain = resolve(scenario_from_dict(doc))
    doc["model"] = {**doc["model"], "moe_shared_expert_intermediate_size": 2048}
    shared = resolve(scenario_from_dict(doc))
    te = shared.scenario.costs.te_module_overhead  # type: ignore[union-attr]
    assert te == pytest.approx(83e-6)
    # the forward's bound moves by the shared expert's two modules, and so does the replay of the same code
    assert shared.moe_host_seconds["forward"] - plain.moe_host_seconds["forward"] == pytest.approx(2 * te)
    assert shared.moe_replay_host_seconds - plain.moe_replay_host_seconds == pytest.approx(2 * te)
