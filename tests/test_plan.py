"""The resolved Plan, rule by rule, and the ZB-V head-placement bug it fixed (issue 21).

Each rule is checked against a closed form or the published convention it cites; the last tests pin where the
V layout puts the LM head (stage 0) in every consumer: the memory plan, the trace's memory, the DP buckets, and
the estimate.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sim import runner
from sim.explore.estimate import estimate
from sim.model.params import embedding_params, head_params, layer_params
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload.footprint import memory_plan

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "scenarios" / "tiny.yaml"
FSDP = ROOT / "scenarios" / "llama2-7b_h100-16_fsdp.yaml"
ZBV = ["parallel.tp=1", "parallel.pp=2", "parallel.dp=2", "schedule=zb-v", "parallel.vpp=2"]


def plan_of(path: Path = TINY, *sets: str):
    return resolve(load_scenario(path, list(sets)))


def test_degrees_batch_and_message_bytes():
    plan = plan_of(TINY)  # tp 2, pp 2, dp 1; global batch 8, micro-batch 1, seq 1024, h 1024, bf16
    assert (plan.tp, plan.pp, plan.dp, plan.vpp, plan.num_gpus) == (2, 2, 1, 1, 4)
    assert (plan.micro_batch, plan.microbatches, plan.global_batch, plan.seq_len) == (1, 8, 8, 1024)
    assert plan.tp_bytes == 1 * 1024 * 1024 * 2  # b*s*h elements of 2 bytes (Megatron's TP collective)
    assert plan.p2p_bytes == plan.tp_bytes / 2  # scattered over the TP group
    assert plan_of(TINY, "parallel.dp=null", "parallel.tp=1").dp == 2  # GPUs left by tp x pp


def test_bytes_per_parameter_follow_megatron_and_zero():
    assert plan_of(TINY).grad_bytes_per_param == 4  # bf16: fp32 main grads (accumulate_allreduce_grads_in_fp32)
    assert plan_of(TINY).main_grad_buffer
    zero2 = plan_of(TINY, "parallel.tp=1", "parallel.pp=1", "parallel.dp=4", "parallel.zero=2")
    assert zero2.grad_bytes_per_param == 2 and not zero2.main_grad_buffer  # sharded grads in the training dtype
    assert plan_of(TINY, "training.dtype=fp32").weight_bytes_per_param == 4
    assert plan_of(TINY, "training.dtype=fp16").grad_bytes_per_param == 2


def test_chunk_map_interleaved_and_v():
    interleaved = plan_of(TINY, "schedule=interleaved", "parallel.vpp=2")
    assert interleaved.stage_chunks == ((0, 2), (1, 3))  # chunk c of stage s is model chunk c*p + s
    v = plan_of(TINY, *ZBV)
    assert v.stage_chunks == ((0, 3), (1, 2))  # the V: stage s holds chunks s and 2p-1-s
    assert [v.chunk_location(g) for g in range(4)] == [(0, 0), (1, 0), (1, 1), (0, 1)]
    assert [list(v.chunk_layers(g)) for g in range(4)] == [[0], [1], [2], [3]]
    assert (v.embedding_stage, v.head_stage) == (0, 0)
    assert (interleaved.embedding_stage, interleaved.head_stage) == (0, 1)


def test_stage_parameters_place_embedding_head_and_tied_copy():
    plan = plan_of(TINY, "parallel.tp=1", "parallel.dp=2")
    model, layer = plan.model, layer_params(plan.model).total
    tied_copy = model.vocab_size * model.hidden_size  # Megatron's output-layer copy of tied embeddings
    assert plan.stage_params(0) == 2 * layer + embedding_params(model)
    assert plan.stage_params(1) == 2 * layer + head_params(model) + tied_copy
    v = plan_of(TINY, *ZBV)  # head and embedding on stage 0 share the tied weights: no copy
    assert v.stage_params(0) == 2 * layer + embedding_params(model) + head_params(model)
    assert v.stage_params(1) == 2 * layer
    untied = plan_of(TINY, *ZBV, "model.tied_embeddings=false")
    assert untied.stage_params(0) == 2 * layer + embedding_params(model) + head_params(untied.model)
    assert head_params(untied.model) == head_params(model) + tied_copy  # untied: the head's own vocab x h matrix


def test_partial_recompute_keeps_inputs_only_for_rebuilt_layers():
    plan = plan_of(TINY, "parallel.tp=1", "parallel.dp=2", "model.num_layers=8", "training.recompute=full",
                   "training.recompute_num_layers=1", "schedule=interleaved", "parallel.vpp=2")
    # chunks of 2 layers: (0,1) (2,3) on stage 0... the first layer of each chunk is rebuilt
    assert [plan.recomputes(layer) for layer in range(8)] == [True, False] * 4
    assert plan.recomputed_layers(0) == 2 and plan.recomputed_layers(1) == 2
    sbh = plan.micro_batch * plan.seq_len * plan.model.hidden_size
    assert plan.stash_bytes(0) == 2.0 * sbh  # only the layer input (Korthikanti Table 2)
    assert plan.stash_bytes(1) == plan.activation_bytes("none")
    assert plan.rebuild_bytes == plan.activation_bytes("none")
    assert plan_of(TINY).rebuild_bytes == 0.0


def test_zero_and_fsdp_semantics():
    fsdp = plan_of(FSDP)  # FULL_SHARD over 16 GPUs on 2 nodes
    assert (fsdp.zero_stage, fsdp.zero_stage_at_rest, fsdp.gathers_units, fsdp.flat_params) == (3, 3, True, True)
    assert fsdp.zero_shards == 16 and fsdp.shard_group(0) == tuple(range(16)) and fsdp.replica_group(0) == (0,)
    hybrid = plan_of(FSDP, "fsdp.sharding=HYBRID_SHARD")
    assert hybrid.zero_shards == 8 and hybrid.shard_group(9) == tuple(range(8, 16))
    assert hybrid.replica_group(9) == (1, 9)  # the same shard on the other node
    grad_op = plan_of(FSDP, "fsdp.sharding=SHARD_GRAD_OP")
    assert (grad_op.zero_stage, grad_op.zero_stage_at_rest, grad_op.gathers_units) == (2, 3, True)
    no_shard = plan_of(FSDP, "fsdp.sharding=NO_SHARD")
    assert (no_shard.zero_stage, no_shard.gathers_units, no_shard.flat_params) == (0, False, True)
    deepspeed2 = plan_of(TINY, "parallel.tp=1", "parallel.pp=1", "parallel.dp=4", "parallel.zero=2")
    assert (deepspeed2.zero_stage_at_rest, deepspeed2.gathers_units, deepspeed2.flat_params) == (2, False, False)
    assert deepspeed2.optimizer_shards == 4 and plan_of(TINY).optimizer_shards == 1
    assert plan_of(FSDP, "fsdp.unit_layers=4", "fsdp.prefetch=false").unit_layers == 4
    assert not plan_of(FSDP, "fsdp.prefetch=false").prefetch


def test_profile_is_loaded_once_and_shared():
    plan = plan_of(TINY)
    assert plan.profile is not None and plan.profile is plan.profile
    assert plan_of(TINY, "costs={model: roofline, shape_efficiency: false}").profile is None


# ------------------------------------------------------------------------------------- the ZB-V head bug
def _stage_dp_bytes(result, stage: int) -> float:
    rows = result.trace[(result.trace["stage"] == stage) & (result.trace["kind"] == "dp")]
    return float(rows["bytes"].sum())


def test_zb_v_runs_the_head_on_stage_0_and_every_consumer_agrees():
    """scenarios/tiny.yaml with tp 1, pp 2, dp 2, zb-v: the V's last chunk (with lm_head) is on stage 0, so the
    head's weights, gradients, optimizer states and DP bytes are stage 0's, and stage 1 holds its layers only.
    Before the Plan, memory and the DP buckets put the head (and a tied-embedding copy) on stage pp-1."""
    result = runner.run(load_scenario(TINY, ZBV))
    trace = result.trace
    head_stages = set(trace.loc[trace["name"] == "lm_head", "stage"])
    assert head_stages == {0}
    model = result.scenario.model
    layers_only = 2 * layer_params(model).total
    # DP buckets: fp32 gradients of what each stage holds (DDP all-reduce of 4-byte gradients)
    assert _stage_dp_bytes(result, 1) == pytest.approx(4 * layers_only, abs=2)
    assert _stage_dp_bytes(result, 0) == pytest.approx(4 * (layers_only + embedding_params(model)
                                                            + head_params(model)), abs=2)
    # Memory in the trace and in the plan: stage 1's weights are its layers' (2 bytes each)
    weights = {int(r): parts["weights"] for r, parts in result.summary.memory_breakdown_bytes.items()}
    assert weights[2] == pytest.approx(2 * layers_only)  # rank 2 is stage 1 (tp 1, dp 2)
    assert [row["weights"] for row in memory_plan(result.plan)] == pytest.approx([weights[0], weights[2]])


def test_zb_v_estimate_and_simulation_read_the_same_placement():
    scenario = load_scenario(ROOT / "scenarios" / "llama2-7b_h100-8_dp.yaml",
                             ["schedule=zb-v", "parallel.vpp=2", "parallel.pp=2", "parallel.dp=4"])
    simulated = runner.run(scenario).summary
    planned = [row["total"] for row in memory_plan(resolve(scenario))]
    assert planned[0] > planned[1]  # stage 0 holds the embedding and the head (untied Llama: two vocab x h)
    est = estimate(scenario)
    assert est.peak_memory_bytes == pytest.approx(max(planned))
    assert est.step_time_s == pytest.approx(simulated.step_time_s, rel=0.05)


def test_a_run_result_pickles_with_its_plan():
    """Notebook users send results to other processes (multiprocessing, joblib); the plan's cached schedule
    holds functions that do not pickle, so a plan pickles as its scenario and resolves again."""
    import pickle

    result = runner.run(load_scenario(TINY))
    back = pickle.loads(pickle.dumps(result))
    assert back.plan.scenario == result.scenario and back.plan.head_stage == result.plan.head_stage == 1
    assert back.summary == result.summary


def test_fsdp_shard_grad_op_keeps_weights_sharded_after_the_step():
    """SHARD_GRAD_OP stores weights sharded at rest (FSDP reshards after the backward) and gathers them unit by
    unit in the next forward: no ZeRO-1/2-style all-gather of the whole stage after the optimizer step."""
    result = runner.run(load_scenario(FSDP, ["fsdp.sharding=SHARD_GRAD_OP"]))
    names = set(result.trace["name"])
    assert "param_all_gather" not in names and "param_gather_fwd" in names
    zero1 = runner.run(load_scenario(TINY, ["parallel.tp=1", "parallel.dp=2", "parallel.zero=1"]))
    assert "param_all_gather" in set(zero1.trace["name"])  # Megatron's distributed optimizer does gather


def test_the_calibration_profile_is_read_once_per_file_version(tmp_path, monkeypatch):
    from sim.costs import profile as profiles

    source = ROOT / "sim" / "data" / "profiles" / "A100.json"
    path = tmp_path / "profile.json"
    path.write_text(source.read_text())
    reads = []
    real_open = Path.open  # the profile is read through a bounded Path.open (sim.costs.profile._load)
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: reads.append(self) or real_open(self, *a, **k))
    first, second = profiles.load(path), profiles.load(str(path))
    assert first is second and reads.count(path) == 1


@pytest.mark.parametrize("sets", [[], ["fsdp.unit_layers=4"], ["fsdp.prefetch=false"], ["training.grad_dtype=fp32"],
                                  ["fsdp.sharding=SHARD_GRAD_OP"], ["fsdp.sharding=HYBRID_SHARD"]])
def test_the_memory_bound_holds_over_the_fsdp_timeline(sets):
    """`sim check`'s per-stage bound is an upper bound of the simulated peak: under FSDP two units' gradients wait
    for their reduce-scatter at once (it queues behind the next unit's gather on the group's one stream), in the
    gradient dtype (Llama 2 7B on 16 H100: the bound was 45.41 GB against a simulated 45.56 GB before)."""
    result = runner.run(load_scenario(FSDP, sets))
    assert memory_plan(result.plan)[0]["total"] >= result.summary.peak_memory_bytes.max
