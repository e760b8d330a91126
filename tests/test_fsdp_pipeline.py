"""FSDP with pipeline parallelism (issue 24 part B): TorchTitan's FSDP2 under torch.distributed.pipelining, where
each FSDP unit is all-gathered once per step (reshard_after_forward off with PP) and reduce-scattered once after
its chunk's last backward (requires_gradient_sync only then); its memory (the gathered stage and its unsharded
gradients beside the sharded states); DeepSpeed's refusal of ZeRO-2/3 with its pipeline engine; the estimate."""

import pytest

from sim import runner
from sim.errors import ConfigError
from sim.explore.estimate import estimate
from sim.model.presets import MODEL_PRESETS
from sim.plan import resolve
from sim.workload.footprint import memory_plan

from conftest import make_scenario

SMALL = {"name": "s", "num_layers": 8, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 32000,
         "max_seq_len": 1024, "mlp": "swiglu", "ffn_hidden_size": 5504, "position_embedding": "rope",
         "norm": "rmsnorm", "tied_embeddings": False, "bias": False}


def fsdp_pp(nodes: int = 4, schedule: str = "1f1b", vpp: int = 1, sharding: str = "FULL_SHARD", **fsdp):
    """tp 2 x pp 2 x dp 2*nodes on H100 nodes, 1k tokens, 64 sequences, every layer an FSDP unit."""
    return make_scenario(cluster={"gpu": "H100-SXM", "nodes": nodes, "gpus_per_node": 8}, model=SMALL,
                         training={"global_batch": 64, "micro_batch": 1, "seq_len": 1024},
                         parallel={"tp": 2, "pp": 2, "vpp": vpp, "dp": 2 * nodes},
                         fsdp={"sharding": sharding, **fsdp}, schedule=schedule, costs="roofline")


@pytest.mark.parametrize("schedule, vpp", [("1f1b", 1), ("interleaved", 2)])
def test_each_unit_is_gathered_once_and_reduced_once_per_step(schedule, vpp):
    """Per rank: one all-gather per unit, in micro-batch 0's forward, carrying the stage's weights once (2 bytes
    per stage parameter); one reduce-scatter per unit, in the last micro-batch, carrying its gradients once."""
    result = runner.run(fsdp_pp(schedule=schedule, vpp=vpp))
    plan, trace = result.plan, result.trace
    m = plan.microbatches
    for stage in range(plan.pp):
        rank = plan.grid.stage_representative(stage)
        rows = trace[(trace["rank"] == rank) & (trace["kind"] == "dp")]
        gathers = rows[rows["name"] == "param_gather_fwd"]
        reduces = rows[rows["name"] == "grad_reduce_scatter"]
        units = plan.stage_layers(stage) // plan.unit_layers
        assert len(gathers) == units and set(gathers["microbatch"]) == {0}
        assert len(reduces) == units and set(reduces["microbatch"]) == {m - 1}
        assert not (rows["name"] == "param_gather_bwd").any()
        params = plan.stage_params(stage)
        assert gathers["bytes"].sum() == pytest.approx(params * plan.weight_bytes_per_param, rel=1e-12)
        assert reduces["bytes"].sum() == pytest.approx(params * plan.grad_bytes_per_param, rel=1e-12)
        # each chunk's reductions start after that chunk's last backward (torch's stage calls post_backward then)
        compute = trace[(trace["rank"] == rank) & (trace["kind"] == "backward") & (trace["microbatch"] == m - 1)]
        for _, reduce in reduces.iterrows():
            chunk = next(c for c in plan.stage_chunks[stage] if reduce["layer"] in plan.chunk_layers(c))
            chunk_end = compute[compute["layer"].isin(list(plan.chunk_layers(chunk)))]["end_s"].max()
            assert reduce["start_s"] >= chunk_end - 1e-12


def test_two_collectives_per_unit_per_step():
    """Per step and unit, FSDP + PP issues one all-gather and one reduce-scatter, whatever m; FULL_SHARD without a
    pipeline (sim.workload.data_parallel) issues m x (two all-gathers + one reduce-scatter)."""
    piped = runner.run(fsdp_pp())
    plan = piped.plan
    rows = piped.trace[(piped.trace["rank"] == 0) & (piped.trace["kind"] == "dp")]
    calls = rows["name"].isin(("param_gather_fwd", "param_gather_bwd", "grad_reduce_scatter")).sum()
    assert calls == 2 * plan.stage_layers(0) // plan.unit_layers  # vs 3 * m * units per step without PP


def test_model_states_per_gpu_llama31_70b_tp8_pp4_dp8():
    """Must-show 2 (FSDP + PP half): Llama 3.1 70B, tp 8, pp 4, dp 8, FSDP FULL_SHARD, bf16 (gradients in bf16,
    FSDP's reduce dtype). A middle stage holds 20 layers; per TP rank a layer has (q, o: h^2 each; k, v: h x 1024
    each; SwiGLU 3 x h x 28672)/8 + 2 RMSNorm weights of h = 106,971,136 parameters, so P = 2,139,422,720.
    Per stage parameter: 16 bytes of sharded states / dp 8 = 2 (weights 2/8, gradients 2/8, Adam 12/8), plus the
    unsharded stage kept gathered from micro-batch 0's forward to the last backward (2) and its unsharded
    gradients accumulated until the step's reduce-scatter (2): 6 bytes per stage parameter."""
    h, ffn, kv = 8192, 28672, 8 * 128
    per_layer = (2 * h * h + 2 * h * kv + 3 * h * ffn) / 8 + 2 * h
    assert per_layer == 106_971_136
    stage_params = 20 * per_layer
    scenario = make_scenario(cluster={"gpu": "H100-SXM", "nodes": 32, "gpus_per_node": 8},
                             model="llama3.1-70b-8k", training={"global_batch": 256, "micro_batch": 1, "seq_len": 8192},
                             parallel={"tp": 8, "pp": 4, "dp": 8, "sequence_parallel": True},
                             fsdp={"sharding": "FULL_SHARD"})
    plan = resolve(scenario)
    assert plan.stage_params(1) == stage_params and plan.grad_dtype == "bf16"
    row = memory_plan(plan)[1]
    assert row["weights"] == pytest.approx(2 / 8 * stage_params, rel=1e-12)
    assert row["gradients"] == pytest.approx(2 / 8 * stage_params, rel=1e-12)
    assert row["optimizer"] == pytest.approx(12 / 8 * stage_params, rel=1e-12)
    assert row["gathered_weights"] == pytest.approx(2 * stage_params, rel=1e-12)
    assert row["unreduced_gradients"] == pytest.approx(2 * stage_params, rel=1e-12)
    states = sum(row[k] for k in ("weights", "gradients", "optimizer", "gathered_weights", "unreduced_gradients"))
    assert states == pytest.approx(6 * stage_params, rel=1e-12)  # 12.84 GB
    assert states / 1e9 == pytest.approx(12.836, abs=1e-3)
    assert MODEL_PRESETS["llama3.1-70b-8k"].num_layers == 80


@pytest.mark.parametrize("sharding", ["FULL_SHARD", "SHARD_GRAD_OP"])
def test_simulated_memory_matches_the_bound(sharding):
    """The trace's timeline holds the gathered stage and its unsharded gradients at their peak: both equal to
    the bound's (every unit is alive at once between the last forward and the first reduce-scatter)."""
    result = runner.run(fsdp_pp(sharding=sharding))
    bound = memory_plan(result.plan)
    for stage in range(result.plan.pp):
        rank = str(result.plan.grid.stage_representative(stage))
        simulated = result.summary.memory_breakdown_bytes[rank]
        for part in ("gathered_weights", "unreduced_gradients", "weights", "gradients", "optimizer"):
            assert simulated[part] == pytest.approx(bound[stage][part], rel=1e-9), part


@pytest.mark.parametrize("nodes, schedule, vpp, sharding", [
    (4, "1f1b", 1, "FULL_SHARD"), (4, "interleaved", 2, "FULL_SHARD"), (4, "1f1b", 1, "HYBRID_SHARD"),
    (8, "interleaved", 2, "HYBRID_SHARD"),
])
def test_the_estimate_prices_fsdp_with_pp_within_five_percent(nodes, schedule, vpp, sharding):
    scenario = fsdp_pp(nodes=nodes, schedule=schedule, vpp=vpp, sharding=sharding)
    simulated = runner.run(scenario).summary.step_time_s
    assert estimate(scenario).step_time_s == pytest.approx(simulated, rel=0.05)


@pytest.mark.parametrize("sections, message", [
    (dict(parallel={"tp": 1, "pp": 2, "dp": 4, "zero": 2}),
     "parallel.zero: ZeRO-2 with pp = 2: DeepSpeed's pipeline engine refuses ZeRO-2/3 with pipelines"),
    (dict(zero_optimization={"stage": 3}, parallel={"tp": 1, "pp": 2, "dp": 4}),
     "parallel.zero: ZeRO-3 with pp = 2: DeepSpeed's pipeline engine refuses"),
    (dict(parallel={"tp": 1, "pp": 2, "dp": 4}, fsdp={"unit_layers": 8}),
     r"fsdp.unit_layers: 8 does not divide the layers of every model chunk \(\[4\]\)"),
])
def test_rules(sections, message):
    with pytest.raises(ConfigError, match=message):
        make_scenario(**sections)


def test_fsdp_zero1_and_no_shard_with_pp_are_accepted():
    """ZeRO-1 (Megatron's distributed optimizer) and NO_SHARD (DDP) with pp > 1 run as before."""
    for sections in (dict(parallel={"tp": 1, "pp": 2, "dp": 4, "zero": 1}),
                     dict(parallel={"tp": 1, "pp": 2, "dp": 4}, fsdp={"sharding": "NO_SHARD"})):
        plan = resolve(make_scenario(**sections))
        assert not plan.pipelined_fsdp


def test_search_enumerates_fsdp_with_pp_and_its_points_run_as_screened():
    """`sim search` keeps ZeRO-2/3 layouts with pp > 1 as FSDP SHARD_GRAD_OP / FULL_SHARD; a point's overrides
    load as the layout screened, and the estimate is within 5% of the simulation for those that fit. (vpp 4 with
    sequence parallelism is left out: there the estimate is 6.3% high with FSDP and 8.1% with ZeRO-1, the
    interleaved schedule's own error, not FSDP's.)"""
    from sim.explore import search, sweep
    from sim.spec.scenario import load_scenario

    from conftest import SCENARIOS

    path = SCENARIOS / "llama2-7b_h100-16_fsdp.yaml"
    base = load_scenario(path, ["model.num_layers=8", "training.global_batch=32"])
    only = search.parse_only(["pp=2", "zero=2,3", "schedule=1f1b,interleaved", "recompute=none", "tp=2",
                              "micro_batch=1", "vpp=1,2"])
    table = search.screen(base, list(search.layouts(base, only)))
    ok = table[table["status"] == "ok"]
    assert set(ok["zero"]) == {2, 3} and set(ok["schedule"]) == {"1f1b", "interleaved"}
    for _, row in ok.iterrows():
        point = search.to_points(row.to_frame().T)[0]
        assert point["fsdp.sharding"] == {2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}[int(row["zero"])]
        overrides = [f"{key}={sweep._encode(value)}" for key, value in point.items()]
        scenario = load_scenario(path, ["model.num_layers=8", "training.global_batch=32", "fsdp=null", *overrides])
        assert resolve(scenario).pipelined_fsdp
        simulated = runner.run(scenario).summary.step_time_s
        assert row["est_step_time_s"] == pytest.approx(simulated, rel=0.05)
