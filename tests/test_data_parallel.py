"""ZeRO and FSDP as replayed communication: volumes (Rajbhandari et al. SC20 Sec. 7), overlap with prefetch,
reduce-scatter placement, sharded memory, and the rules that keep layouts real."""

import numpy as np
import pytest

from sim import runner
from sim.errors import ConfigError
from sim.model.memory import model_state_bytes
from sim.network.collectives import bus_factor
from sim.plan import resolve

from conftest import make_scenario

SMALL = {"name": "s", "num_layers": 8, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 32000,
         "max_seq_len": 1024, "mlp": "swiglu", "ffn_hidden_size": 5504, "position_embedding": "rope",
         "norm": "rmsnorm", "tied_embeddings": False, "bias": False}


def comm_bound(**sections):
    """16 A100s on two nodes, a short sequence: the gradient/weight traffic crosses InfiniBand and dominates."""
    base = dict(cluster={"gpu": "A100-80GB-SXM", "nodes": 2, "gpus_per_node": 8}, model=SMALL,
                training={"global_batch": 16, "micro_batch": 1, "seq_len": 512},
                parallel={"tp": 1, "pp": 1, "dp": 16})
    base.update(sections)
    return make_scenario(**base)


def dp_bus_bytes(result):
    tasks = [t for t in result.graph.tasks if t.kind == "dp" and t.rank == 0]
    return sum(t.nbytes * bus_factor(t.op, len(t.group)) for t in tasks)


def compute_busy(trace, rank=0):
    rows = trace[(trace["rank"] == rank) & (trace["stream"] == "compute")]
    return float((rows["end_s"] - rows["start_s"]).sum())


def test_zero3_moves_one_and_a_half_times_ddp_bytes():
    """SC20's 1.5x holds for gradients reduced in the weights' dtype (bf16 here, as FSDP's reduce_dtype); DDP's
    bf16 default reduces fp32 gradients (Megatron-LM, PyTorch AMP), which is 2x the gradient bytes."""
    bf16_training = {"global_batch": 16, "micro_batch": 1, "seq_len": 512}
    ddp = runner.run(comm_bound(training={**bf16_training, "grad_dtype": "bf16"}))
    zero3 = runner.run(comm_bound(fsdp={"sharding": "FULL_SHARD"}))
    assert dp_bus_bytes(zero3) / dp_bus_bytes(ddp) == pytest.approx(1.5, rel=1e-12)
    fp32_grads = runner.run(comm_bound())
    assert fp32_grads.plan.grad_dtype == "fp32"
    assert dp_bus_bytes(fp32_grads) / dp_bus_bytes(ddp) == pytest.approx(2.0, rel=1e-12)


def test_step_difference_is_the_exposed_communication():
    """One stage: the compute stream only ever waits for data-parallel traffic, so step = compute + exposed."""
    no_clip = {"training": {"global_batch": 16, "micro_batch": 1, "seq_len": 512, "clip_grad": 0}}  # no norm
    runs = {name: runner.run(comm_bound(**no_clip, **extra)) for name, extra in  # all-reduce on the compute path
            (("ddp", {}), ("zero3", {"fsdp": {"sharding": "FULL_SHARD"}}))}
    for result in runs.values():
        s = result.summary
        assert s.step_time_s == pytest.approx(compute_busy(result.trace) + s.exposed_comm_s["dp"], rel=1e-9)
    d_step = runs["zero3"].summary.step_time_s - runs["ddp"].summary.step_time_s
    d_exposed = runs["zero3"].summary.exposed_comm_s["dp"] - runs["ddp"].summary.exposed_comm_s["dp"]
    d_compute = compute_busy(runs["zero3"].trace) - compute_busy(runs["ddp"].trace)  # the sharded optimizer step
    assert d_step == pytest.approx(d_exposed + d_compute, rel=1e-9)


def unit_rows(trace, kind="forward", mb=0):
    rows = trace[(trace["rank"] == 0) & (trace["kind"] == kind) & (trace["microbatch"] == mb) & (trace["layer"] >= 0)]
    spans = rows.groupby("layer").agg(first=("start_s", "min"), last=("end_s", "max"))
    name = "param_gather_fwd" if kind == "forward" else "param_gather_bwd"
    gathers = trace[(trace["rank"] == 0) & (trace["name"] == name) & (trace["microbatch"] == mb)].set_index("layer")
    return spans, gathers


def reduce_scatters(trace, mb=0):
    return trace[(trace["rank"] == 0) & (trace["name"] == "grad_reduce_scatter")
                 & (trace["microbatch"] == mb)].set_index("layer")


def test_backward_prefetch_issues_the_next_gather_ahead_of_the_reduce_scatter():
    """FSDP's collectives share the process group's one NCCL stream (torch.distributed.fsdp.BackwardPrefetch):
    with BACKWARD_PRE the next unit's gather runs during this unit's backward; without it, it queues behind
    this unit's reduce-scatter. The forward gathers a unit ahead either way (the CPU runs ahead)."""
    runs = {prefetch: runner.run(comm_bound(fsdp={"sharding": "FULL_SHARD", "prefetch": prefetch},
                                            training={"global_batch": 16, "micro_batch": 1, "seq_len": 1024}))
            for prefetch in (True, False)}
    for result in runs.values():
        spans, gathers = unit_rows(result.trace)
        for layer in range(1, 8):  # unit k's weights are gathered while unit k-1 computes
            assert gathers.loc[layer, "start_s"] < spans.loc[layer - 1, "last"]
            assert gathers.loc[layer, "end_s"] <= spans.loc[layer, "first"]
        dp = result.trace[(result.trace["rank"] == 0) & (result.trace["kind"] == "dp")]
        assert set(dp["stream"]) == {"dp"}
    spans, gathers = unit_rows(runs[True].trace, "backward")
    reduces = reduce_scatters(runs[True].trace)
    for layer in range(0, 7):  # unit k's backward gather runs while unit k+1's backward computes
        assert gathers.loc[layer, "start_s"] < spans.loc[layer + 1, "last"]
        assert gathers.loc[layer, "end_s"] <= reduces.loc[layer + 1, "start_s"]
    spans, gathers = unit_rows(runs[False].trace, "backward")
    reduces = reduce_scatters(runs[False].trace)
    for layer in range(0, 7):  # without it the gather waits for unit k+1's compute and reduce-scatter
        assert gathers.loc[layer, "start_s"] >= reduces.loc[layer + 1, "end_s"] >= spans.loc[layer + 1, "last"]
    exposed_on, exposed_off = (runs[p].summary.exposed_comm_s["dp"] for p in (True, False))
    assert exposed_off > exposed_on  # and the step grows by exactly the extra exposure:
    step_on, step_off = (runs[p].summary.step_time_s for p in (True, False))
    assert step_off - step_on == pytest.approx(exposed_off - exposed_on, rel=1e-9)


def test_reduce_scatter_follows_each_units_backward():
    result = runner.run(comm_bound(fsdp={"sharding": "FULL_SHARD", "unit_layers": 2}))
    trace = result.trace
    backward = trace[(trace["rank"] == 0) & (trace["kind"] == "backward") & (trace["layer"] >= 0)]
    for row in trace[trace["name"] == "grad_reduce_scatter"].itertuples():
        unit = backward[(backward["microbatch"] == row.microbatch) & (backward["layer"] // 2 == row.layer // 2)]
        assert row.start_s >= unit["end_s"].max()
    per_mb = trace[trace["name"] == "grad_reduce_scatter"].groupby("microbatch").size()
    assert set(per_mb) == {4}  # 8 layers / 2 per unit


def test_sharded_memory_and_fit():
    scenario = comm_bound(fsdp={"sharding": "FULL_SHARD"})
    summary = runner.run(scenario).summary
    parts = summary.memory_breakdown_bytes["0"]
    states = model_state_bytes(resolve(scenario).stage_params(0), "bf16", 3, 16)
    assert parts["weights"] + parts["gradients"] + parts["optimizer"] == pytest.approx(states.total)
    gathers = sorted(t.nbytes for t in runner.run(scenario).graph.tasks
                     if t.name.startswith("param_gather") and t.rank == 0)
    # One unit computing, one gathered ahead, one gather in flight (FSDP's limit of two all-gathers).
    assert 0 < parts["gathered_weights"] <= sum(gathers[-3:])
    sgo = runner.run(comm_bound(fsdp={"sharding": "SHARD_GRAD_OP"})).summary.memory_breakdown_bytes["0"]
    assert sgo["gathered_weights"] == pytest.approx(resolve(scenario).stage_params(0) * 2)  # all kept


def test_over_large_model_does_not_fit_until_sharded():
    big = dict(model="llama2-13b", cluster={"gpu": "A100-80GB-SXM", "nodes": 1, "gpus_per_node": 8},
               training={"global_batch": 8, "micro_batch": 1, "seq_len": 1024}, parallel={"tp": 1, "pp": 1, "dp": 8})
    assert not runner.run(make_scenario(**big)).summary.fits_in_memory
    assert runner.run(make_scenario(**big, fsdp={"sharding": "FULL_SHARD"})).summary.fits_in_memory


def test_zero1_with_pipeline_shards_the_optimizer_step_and_gathers_weights():
    scenario = make_scenario(cluster={"gpu": "A100-80GB-SXM", "nodes": 1, "gpus_per_node": 8}, model=SMALL,
                             training={"global_batch": 8, "seq_len": 512}, parallel={"tp": 1, "pp": 2, "dp": 4,
                                                                                      "zero": 1})
    result = runner.run(scenario)
    tasks = result.graph.tasks
    names = {t.name for t in tasks if t.kind == "dp"}
    assert "param_all_gather" in names and all(t.op in ("reduce_scatter", "all_gather") for t in tasks
                                               if t.kind == "dp")
    plain = runner.run(make_scenario(cluster={"gpu": "A100-80GB-SXM", "nodes": 1, "gpus_per_node": 8}, model=SMALL,
                                     training={"global_batch": 8, "seq_len": 512},
                                     parallel={"tp": 1, "pp": 2, "dp": 4}))
    step = {r: [t.duration for t in g.graph.tasks if t.name == "optimizer" and t.rank == 0][0]
            for r, g in (("zero1", result), ("ddp", plain))}
    assert step["zero1"] == pytest.approx(step["ddp"] / 4)


def test_hybrid_shard_reduces_inside_nodes_and_all_reduces_across():
    result = runner.run(comm_bound(fsdp={"sharding": "HYBRID_SHARD"}))
    ops = {(t.name, len(t.group)) for t in result.graph.tasks if t.kind == "dp"}
    assert ("grad_reduce_scatter", 8) in ops and ("grad_all_reduce", 2) in ops and ("param_gather_fwd", 8) in ops


def test_deepspeed_zero2_gradients_do_not_pile_up_behind_lagging_reduce_scatters():
    # Four micro-batches of short sequences whose bucketed reduce-scatters fall behind the backward on
    # InfiniBand. DeepSpeed copies each gradient into its two reduction buckets as its layer's backward ends, so
    # at most two buckets' fresh gradients are held at once (one handed over as the next is produced); counting
    # each bucket until its reduce-scatter ended once put a 175B tp 8 dp 128 ZeRO-2 layout at 169 GiB against
    # a memory plan of 76 GiB.
    scenario = comm_bound(training={"global_batch": 64, "micro_batch": 1, "seq_len": 64},
                          parallel={"tp": 1, "pp": 1, "dp": 16, "zero": 2})
    result = runner.run(scenario)
    trace = result.trace[result.trace["rank"] == 0]
    last_backward = trace[(trace["kind"] == "backward") & (trace["microbatch"] == 3)]["start_s"].min()
    reduces = trace[trace["name"] == "grad_reduce_scatter"]
    two_buckets = reduces["bytes"].nlargest(2).sum()
    pending = reduces[(reduces["microbatch"] < 3) & (reduces["end_s"] > last_backward)]["bytes"].sum()
    assert pending > 2 * two_buckets  # the earlier micro-batches' reductions are still running
    assert 0 < result.summary.memory_breakdown_bytes["0"]["unreduced_gradients"] <= two_buckets


def test_deepspeed_block_sets_the_stage_and_bucket():
    scenario = comm_bound(zero_optimization={"stage": 2, "reduce_bucket_size": 5e7, "overlap_comm": True})
    assert resolve(scenario).zero_stage == 2 and scenario.parallel.dp_bucket_size == 1e8
    assert np.isfinite(runner.run(scenario).summary.step_time_s)


@pytest.mark.parametrize("sections, message", [
    (dict(parallel={"tp": 1, "pp": 2, "dp": 8, "zero": 3}),
     "parallel.zero: ZeRO-3 with pp = 2: DeepSpeed's pipeline engine refuses"),
    (dict(parallel={"tp": 1, "pp": 1, "dp": 16, "zero": 1}, fsdp={"sharding": "FULL_SHARD"}),
     "fsdp.sharding: FULL_SHARD is ZeRO-3 but parallel.zero = 1"),
    (dict(fsdp={"unit_layers": 3}), "fsdp.unit_layers: 3 does not divide model.num_layers = 8"),
    (dict(fsdp={"sharding": "FULL_SHARD"}, schedule="zb-h1"), "schedule: zb-h1 splits the backward"),
    (dict(zero_optimization={"stage": 3, "offload_param": {"device": "nvme"}}),
     "zero_optimization.offload_param.device: 'nvme' is not modelled"),
    (dict(zero_optimization={"stage": 3, "offload_param": {"device": "cpu"}}),
     "offload.params: the host keeps the master weights only with offload.optimizer"),
    (dict(parallel={"tp": 1, "pp": 1, "dp": 16, "zero": 2}, offload={"optimizer": True, "params": True}),
     "offload.params: offloading the weights needs ZeRO-3"),
])
def test_rules(sections, message):
    with pytest.raises(ConfigError, match=message):
        comm_bound(**sections)


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_overlap_comm_false_puts_reductions_on_the_compute_stream(stage):
    """DeepSpeed reduces on its own stream only with overlap_comm (stage_1_and_2.py reduce_ipg_grads, stage3.py);
    false (the default at stages 1-2, zero/config.py) issues each reduce-scatter on the compute stream: no compute
    runs while a reduction does, so the step is at least the compute plus every reduction, and slower than with
    overlap_comm true (at stage 3 on this comm-bound case, where the weight gathers queue behind the reductions on
    the one NCCL stream anyway, no faster). The estimate composes the same rule."""
    from sim.explore.estimate import estimate

    assert comm_bound(zero_optimization={"stage": 2}).parallel.overlap_grad_reduce is False  # DeepSpeed's default
    assert comm_bound(zero_optimization={"stage": 3}).parallel.overlap_grad_reduce is True
    training = {"global_batch": 32, "micro_batch": 1, "seq_len": 512}
    serial = comm_bound(training=training, zero_optimization={"stage": stage, "overlap_comm": False})
    overlapped = comm_bound(training=training, zero_optimization={"stage": stage, "overlap_comm": True})
    result = runner.run(serial)
    trace = result.trace[result.trace["rank"] == 0]
    reduces = trace[trace["name"] == "grad_reduce_scatter"]
    compute = trace[trace["stream"] == "compute"]
    assert len(reduces) > 0
    for r in reduces.itertuples():
        overlap = compute[(compute["start_s"] < r.end_s - 1e-12) & (compute["end_s"] > r.start_s + 1e-12)]
        assert overlap.empty
    busy = compute_busy(result.trace) + float((reduces["end_s"] - reduces["start_s"]).sum())
    assert result.summary.step_time_s >= busy * (1 - 1e-9)
    faster = runner.run(overlapped).summary.step_time_s
    assert result.summary.step_time_s > faster if stage == 2 else result.summary.step_time_s >= faster
    assert estimate(serial).step_time_s == pytest.approx(result.summary.step_time_s, rel=0.1)
