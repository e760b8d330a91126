"""Expert parallelism (issue 23): Megatron-Core's MoE parallel folding in the grid, the Plan's dispatch facts, the
workload's dispatch/combine and expert-data-parallel reduction, per-rank expert memory, the estimate against the
simulation, and the rules' one-line errors. Closed forms are written out here from the shapes, not read back from
the code under test."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from sim import runner
from sim.errors import ConfigError
from sim.explore.estimate import estimate
from sim.explore.search import Layout, candidate, layouts
from sim.parallel.grid import RankGrid
from sim.plan import resolve
from sim.spec.scenario import load_scenario, scenario_from_dict
from sim.workload.build import build
from sim.workload.footprint import states_and_buffers

MIXTRAL = Path(__file__).resolve().parent.parent / "scenarios" / "mixtral-8x7b_h100-64.yaml"

# A 4-layer Mixtral-like model (8 experts, top-2, SwiGLU) on two DGX H100 nodes: small enough to simulate in a
# second with every rank.
H, FFN, E, TOPK = 1024, 2048, 8, 2
BASE: dict[str, Any] = {
    "name": "moe-small",
    "cluster": {"gpu": "H100-SXM", "nodes": 2, "gpus_per_node": 8},
    "model": {"name": "moe-small", "num_layers": 4, "hidden_size": H, "num_attention_heads": 8, "num_kv_heads": 8,
              "ffn_hidden_size": FFN, "vocab_size": 32000, "max_seq_len": 4096, "mlp": "swiglu",
              "position_embedding": "rope", "norm": "rmsnorm", "tied_embeddings": False, "bias": False,
              "num_moe_experts": E, "moe_router_topk": TOPK},
    "training": {"global_batch": 32, "micro_batch": 1, "seq_len": 2048, "flash_attention": True},
    "parallel": {"tp": 1, "pp": 2, "ep": 4, "zero": 1},
}


def scenario(**sections: dict[str, Any]):
    data = copy.deepcopy(BASE)
    for key, values in sections.items():
        data[key] = {**data.get(key, {}), **values} if isinstance(values, dict) else values
    return scenario_from_dict(data)


# ---------------------------------------------------------------------------------------------------- grid
def test_expert_groups_fold_over_a_stage_with_etp_fastest_then_ep_then_edp() -> None:
    grid = RankGrid(tp=2, pp=2, dp=8, gpus_per_node=8, ep=4, etp=2)  # 16 ranks a stage: etp 2 x ep 4 x edp 2
    assert grid.edp == 2
    # rank 21 = stage 1, local index 5: etp rank 1, ep rank 2, edp rank 0
    assert grid.etp_group(21) == (20, 21)
    assert grid.ep_group(21) == (17, 19, 21, 23)
    assert grid.edp_group(21) == (21, 29)
    assert grid.tp_ep_group(21) == tuple(range(16, 24))
    for name in ("etp_group", "ep_group", "edp_group"):  # each kind of group partitions every stage's ranks
        for stage in range(2):
            ranks = range(16 * stage, 16 * (stage + 1))
            groups = {getattr(grid, name)(rank) for rank in ranks}
            assert sorted(r for group in groups for r in group) == list(ranks)
            assert all(rank in getattr(grid, name)(rank) for rank in ranks)
    # an ep group and an edp group meet in exactly one rank; so do an ep and an etp group
    assert set(grid.ep_group(21)) & set(grid.edp_group(21)) == {21}


# ------------------------------------------------------------------------------------------ dispatch facts
@pytest.mark.parametrize("moe, load, padded", [
    ({}, 1.0, 1.0),  # dropless, even routing
    ({"imbalance": 1.5}, 1.5, 1.0),  # skewed: the most loaded rank takes 1.5x the mean
    ({"imbalance": 1.5, "capacity_factor": 1.25}, 1.25, 1.0),  # the capacity drops what is over it
    ({"imbalance": 1.1, "capacity_factor": 1.25}, 1.1, 1.0),
    ({"capacity_factor": 1.25, "pad_to_capacity": True}, 1.25, 1.25),  # padded: every expert gets its capacity
])
def test_dispatch_bytes_per_rank_uniform_and_skewed(moe: dict[str, Any], load: float, padded: float) -> None:
    plan = resolve(scenario(moe=moe, parallel={"tp": 2, "sequence_parallel": True, "ep": 4, "etp": 2}))
    tokens = 1 * 2048 / 2  # b*s/tp under sequence parallelism
    assert plan.dispatch_tokens == tokens
    # what a rank sends: tokens x topk x h x bf16 (x the capacity factor when padded); the hot receiver gets
    # ``load`` x the mean unless every expert is padded to its capacity
    assert plan.dispatch_bytes == pytest.approx(tokens * TOPK * H * 2 * padded)
    assert plan.dispatch_skew == pytest.approx(1.0 if padded > 1 else load)
    assert plan.routed_tokens == pytest.approx(tokens * TOPK * 2 * load)  # x etp: gathered over the etp group
    assert plan.local_experts == E // 4
    assert plan.expert_gather_bytes == pytest.approx(plan.routed_tokens * H * 2)


def test_the_load_is_capped_by_ep() -> None:
    """A rank cannot receive more than every token: with ep = 1 the one rank computes all its pairs however they
    route; with ep = 2 at most twice the mean."""
    one = resolve(scenario(parallel={"ep": 1}, moe={"imbalance": 1.5}))
    assert one.expert_load == 1.0 and one.routed_tokens == 2048 * TOPK and one.dispatch_skew == 1.0
    two = resolve(scenario(parallel={"ep": 2}, moe={"imbalance": 3.0}))
    assert two.expert_load == 2.0 and two.dispatch_skew == 2.0


def _ep_durations(trace, name: str):
    rows = trace[(trace["stream"] == "ep") & (trace["name"] == name)]
    return (rows["end_s"] - rows["start_s"]).to_numpy()


@pytest.mark.parametrize("imbalance", [1.0, 1.5])
def test_all_to_all_time_on_the_analytic_network_closed_form(imbalance: float) -> None:
    """ep = 4 ranks of one NVLink node: NCCL's all-to-all of S bytes a rank (S/n to every peer) takes
    base + (n-1) alpha + skew (n-1)/n S / B(S, n) on the NVLink all-to-all tier, the hottest receiver setting the
    pace (docs/mechanisms/all_to_all.md); S = b*s/tp x topk x h x bf16 whatever the skew."""
    sc = scenario(moe={"imbalance": imbalance})
    plan = resolve(sc)
    link = runner.build_topology(plan).all_to_all_link
    n, size = 4, 2048 * TOPK * H * 2
    expected = (link.base_latency + (n - 1) * link.latency
                + imbalance * (n - 1) / n * size / link.bandwidth_at(size, n))
    trace = runner.run(sc).trace
    for name in ("dispatch_all_to_all", "combine_all_to_all", "combine_grad_all_to_all", "dispatch_grad_all_to_all"):
        durations = _ep_durations(trace, name)
        assert len(durations) == 2 * 2 * 4  # 2 simulated ranks (stages) x 2 MoE layers x 4 micro-batches
        assert durations == pytest.approx(expected, rel=1e-9)
    assert (trace[trace["stream"] == "ep"]["bytes"] == size).all()


def test_groups_of_the_exchanges_and_the_expert_gradient_reduction() -> None:
    sc = scenario(parallel={"tp": 2, "sequence_parallel": True, "ep": 2, "etp": 2})  # stage: 8 ranks, edp 2
    plan = resolve(sc)
    graph = build(plan)
    rank = plan.grid.stage_representative(1)  # 8
    ops = {(t.name, t.group) for t in graph.tasks if t.rank == rank and t.stream == "ep"}
    assert ("dispatch_all_to_all", (8, 10)) in ops  # ep stride etp = 2
    assert ("dispatch_all_gather", (8, 9)) in ops  # etp: the fastest pair
    assert ("combine_reduce_scatter", (8, 9)) in ops
    buckets = [t for t in graph.tasks if t.rank == rank and t.stream == "expert_dp"]
    assert {t.group for t in buckets} == {(8, 12)}  # edp stride etp*ep = 4
    # bytes: every MoE layer's routed experts of this rank, E/(ep*etp) of them per layer, in the gradient dtype
    # (fp32 main gradients for bf16 without sharded gradients)
    expert_params = 2 * E * 3 * H * FFN / (2 * 2)
    reduced = sum(t.nbytes for t in buckets if t.op == "reduce_scatter")
    assert reduced == pytest.approx(expert_params * 4)
    dense = [t for t in graph.tasks if t.rank == rank and t.stream == "dp" and t.name.startswith("grad_bucket")]
    assert {t.group for t in dense} == {plan.grid.dp_group(rank)}
    dense_layer = (H * (H + 2 * H) + H * H) / 2 + 2 * H + H * E  # attention / tp + two norms + the router
    head = (H * 32000 + H) / 2  # the last stage's LM head and final norm, per TP rank (rank_params)
    assert sum(t.nbytes for t in dense) == pytest.approx((2 * dense_layer + head) * 4)


# ----------------------------------------------------------------------------------------------- memory
def test_per_rank_expert_memory_under_ep_and_zero1_closed_form() -> None:
    """Mixtral 8x7B, tp 1 pp 4 ep 8, dp 16 -> edp 2, ZeRO-1, bf16 gradients: a middle stage holds 8 layers;
    weights 2 B and gradients 2 B per parameter it holds, Adam's 12 B sharded over dp (dense) and edp (experts)."""
    plan = resolve(load_scenario(MIXTRAL))
    h, kv, ffn = 4096, 1024, 14336
    dense = 8 * (h * (h + 2 * kv) + h * h + 2 * h + h * 8)  # attention, two RMSNorms, router, per layer
    experts = 8 * 8 * 3 * h * ffn / 8  # 8 layers x 8 experts x SwiGLU / ep
    states, host = states_and_buffers(plan, 1)
    assert host == 0
    assert states["weights"] == pytest.approx(2 * (dense + experts))
    assert states["gradients"] == pytest.approx(2 * (dense + experts))
    assert states["optimizer"] == pytest.approx(12 * dense / 16 + 12 * experts / 2)
    assert plan.edp == 2 and plan.local_experts == 1


# -------------------------------------------------------------------------------------- estimate, ranks
@pytest.mark.parametrize("overrides", [
    {},
    {"parallel": {"ep": 8}},
    {"parallel": {"tp": 2, "sequence_parallel": True, "ep": 2}},
    {"parallel": {"tp": 2, "sequence_parallel": True, "ep": 4, "etp": 1}},
    {"parallel": {"tp": 2, "sequence_parallel": True}, "model": {"moe_shared_expert_intermediate_size": 2048}},
    {"moe": {"token_dispatcher": "allgather"}},
    {"moe": {"imbalance": 1.5}},
    {"training": {"recompute": "full"}},
    {"parallel": {"zero": 0}, "model": {"moe_layer_freq": 2}},
    {"schedule": "interleaved", "parallel": {"vpp": 2}},
], ids=str)
def test_estimate_within_5_percent_of_the_simulation(overrides: dict[str, Any]) -> None:
    sc = scenario(**overrides)
    simulated = runner.run(sc).summary
    est = estimate(sc)
    assert est.step_time_s == pytest.approx(simulated.step_time_s, rel=0.05)
    assert est.bound_s <= simulated.step_time_s * (1 + 1e-9)
    assert est.peak_memory_bytes == pytest.approx(simulated.peak_memory_bytes.max, rel=0.05)
    assert simulated.exposed_comm_s["ep"] > 0


def test_bundled_mixtral_estimate_within_5_percent() -> None:
    sc = load_scenario(MIXTRAL)
    simulated = runner.run(sc).summary
    assert estimate(sc).step_time_s == pytest.approx(simulated.step_time_s, rel=0.05)
    assert simulated.fits_in_memory


@pytest.mark.parametrize("overrides", [
    {},
    {"parallel": {"tp": 2, "sequence_parallel": True, "ep": 4, "etp": 1},
     "model": {"moe_shared_expert_intermediate_size": 1024}},
    {"moe": {"token_dispatcher": "allgather"}, "parallel": {"ep": 8}},
], ids=str)
def test_slice_and_all_ranks_give_the_same_step(overrides: dict[str, Any]) -> None:
    sliced = runner.run(scenario(**overrides)).summary.step_time_s
    every = runner.run(scenario(**overrides, ranks="all")).summary.step_time_s
    unfolded = runner.run(scenario(**overrides, ranks="all", fold_tp=False)).summary.step_time_s
    assert every == pytest.approx(sliced, rel=1e-6)
    assert unfolded == pytest.approx(sliced, rel=1e-6)


def test_same_seed_gives_a_byte_identical_trace() -> None:
    def trace_bytes() -> bytes:
        sc = scenario(seed=7, variation={"jitter": 0.05}, ranks="all")
        return runner.run(sc).trace.to_csv().encode()

    assert trace_bytes() == trace_bytes()


# --------------------------------------------------------------------------------------------- rules
@pytest.mark.parametrize("overrides, message", [
    ({"parallel": {"ep": 3, "pp": 1}, "cluster": {"nodes": 1, "gpus_per_node": 6}, "training": {"global_batch": 36}},
     "parallel.ep: 3 does not divide model.num_moe_experts = 8"),
    ({"parallel": {"tp": 2, "sequence_parallel": True, "etp": 3}, "model": {"moe_ffn_hidden_size": 1024}},
     "parallel.etp: 3 does not divide the expert FFN size 1024"),
    ({"parallel": {"ep": 8, "pp": 4}}, "parallel.ep: ep*etp = 8 does not divide tp*dp = 4"),
    ({"parallel": {"tp": 2}}, "parallel.sequence_parallel: a MoE model with tp = 2 needs sequence parallelism"),
    ({"parallel": {"zero": 2, "pp": 1}}, "parallel.zero: ZeRO-2/FSDP with a MoE model is not modelled"),
    ({"moe": {"pad_to_capacity": True}}, "moe.pad_to_capacity: padding to capacity needs moe.capacity_factor"),
    ({"moe": {"a2a_overlap": True, "token_dispatcher": "allgather"}},
     "moe.a2a_overlap: needs the alltoall or flex token dispatcher, not allgather"),
    ({"moe": {"imbalance": 0.5}}, "moe.imbalance: Input should be greater than or equal to 1"),
    ({"model": {"num_moe_experts": None}}, "parallel.ep: expert parallelism needs a MoE model"),
    ({"parallel": {"tp": 17}}, "parallel: tp*pp = 34 does not divide the cluster's 16 GPUs"),  # dp implied: 0
    ({"model": {"num_moe_experts": None}, "parallel": {"ep": 1}, "moe": {"imbalance": 1.2}},
     "moe: the token-dispatch settings need a MoE model"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_expert_layouts_get_one_line_naming_the_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        scenario(**overrides)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_dense_models_are_unchanged_by_the_moe_section() -> None:
    """A dense model has no expert facts: its stage parameters, bytes and summary keys are the dense ones."""
    dense = scenario(model={"num_moe_experts": None}, parallel={"ep": 1})
    plan = resolve(dense)
    assert not plan.is_moe and plan.stage_expert_params(0) == 0.0 and plan.grid.ep == 1
    summary = runner.run(dense).summary
    assert set(summary.exposed_comm_s) == {"tp", "pp", "dp"}


# -------------------------------------------------------------------------------------------- search
def test_search_enumerates_ep_over_divisors_of_the_experts_that_divide_tp_dp() -> None:
    sc = scenario()
    space = list(layouts(sc, {"pp": frozenset({2}), "tp": frozenset({1}), "schedule": frozenset({"1f1b"}),
                              "recompute": frozenset({"none"}), "zero": frozenset({1}),
                              "micro_batch": frozenset({1})}))
    assert sorted({layout.ep for layout in space}) == [1, 2, 4, 8]  # dp = 8: every divisor of 8 experts
    kept = [layout for layout in space if layout.ep == 4]
    assert candidate(sc, kept[0]).parallel.ep == 4
    dense = scenario(model={"num_moe_experts": None}, parallel={"ep": 1})
    assert {(layout.ep, layout.etp) for layout in layouts(dense)} == {(1, 1)}
    wide = scenario(parallel={"tp": 2, "sequence_parallel": True})  # tp 2 x dp 4: etp 1 or 2
    pairs = {(layout.ep, layout.etp) for layout in layouts(wide, {"tp": frozenset({2}), "pp": frozenset({2})})}
    assert pairs == {(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 2), (4, 2)}
    assert Layout(1, 1, 16, 1, 1, "1f1b", 0, "none", False).point()["parallel.ep"] == 1


@pytest.mark.parametrize("align", [False, True])
def test_overlapped_param_gather_also_gathers_the_expert_buckets_under_the_next_forward(align: bool) -> None:
    """Megatron-Core chains the expert buffers' bucket groups for --overlap-param-gather like the dense ones
    (distributed_data_parallel.py), so with it no expert all-gather is left after the optimizer step: each expert
    bucket is gathered over edp from the step start / as the forward reaches it, and the first micro-batch's
    forward of its first layer waits for it. Same bytes as the after-step gather (the updated bf16 expert weights),
    and the step cannot get longer."""
    common = {"tp": 2, "sequence_parallel": True, "ep": 2, "etp": 2, "pp": 2, "vpp": 2, "dp": 4,
              "overlap_grad_reduce": True, "align_param_gather": align, "dp_bucket_size": 4e6}
    model = {"num_layers": 8}
    off = runner.run(scenario(model=model, parallel={**common, "overlap_param_gather": False}, schedule="interleaved"))
    on = runner.run(scenario(model=model, parallel={**common, "overlap_param_gather": True}, schedule="interleaved"))
    rank = on.plan.grid.stage_representative(1)
    after = off.trace[(off.trace["rank"] == rank) & (off.trace["name"] == "expert_param_all_gather")]
    assert len(after) == 1
    gathers = on.trace[(on.trace["rank"] == rank) & on.trace["name"].str.startswith("expert_param_gather_bucket")]
    assert len(gathers) >= 2 and (gathers["stream"] == "expert_dp").all()
    assert not (on.trace["name"] == "expert_param_all_gather").any()
    # 2 layers x E/(ep*etp) experts x 3 projections of H x FFN/etp per chunk pair ... all of the stage's: bf16
    stage_experts = 4 * E * 3 * H * FFN / (2 * 2)
    assert gathers["bytes"].sum() == pytest.approx(stage_experts * 2) == pytest.approx(after["bytes"].iloc[0])
    tasks = {t.name: t for t in on.graph.tasks if t.rank == rank}
    assert {tasks[name].group for name in gathers["name"]} == {tuple(on.plan.expert_dp_group(rank))}
    # each expert bucket's gather is waited for by the first task of its first layer's micro-batch-0 forward (with
    # sequence parallelism, the TP all-gather), which starts after it ends
    ids = {t.id: t for t in on.graph.tasks if t.rank == rank}
    ends = dict(zip(on.trace["task"], on.trace["end_s"], strict=True))
    starts = dict(zip(on.trace["task"], on.trace["start_s"], strict=True))
    for name in gathers["name"]:
        gather = tasks[name].id
        waiting = [t for t in ids.values() if gather in t.deps]
        assert len(waiting) == 1 and waiting[0].microbatch == 0 and waiting[0].layer >= 0
        assert starts[waiting[0].id] >= ends[gather] - 1e-12
    assert on.summary.step_time_s <= off.summary.step_time_s + 1e-12
