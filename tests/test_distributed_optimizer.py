"""Megatron-LM's distributed optimizer and DDP overlap flags (docs/mechanisms/distributed_optimizer.md): gradient
buckets (param_and_grad_buffer.py), the per-bucket weight all-gather overlapped with the next forward
(--overlap-param-gather; distrib_optimizer.py), one bucket per chunk without --overlap-grad-reduce, against closed
forms on fixed costs."""

import math

import pytest

from sim import runner
from sim.errors import ConfigError
from sim.explore.estimate import estimate
from sim.plan import resolve
from sim.workload.grad_buckets import fill_buckets, gradient_bytes, group_buckets
from sim.workload.param_gather import final_weight_gather_bytes, param_gather_buckets

from conftest import make_scenario

SMALL = {"name": "s", "num_layers": 8, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 32000,
         "max_seq_len": 1024, "mlp": "swiglu", "ffn_hidden_size": 5504, "position_embedding": "rope",
         "norm": "rmsnorm", "tied_embeddings": False, "bias": False}
# A layer's fixed forward long enough that a layer's weight all-gather over InfiniBand hides under it.
FIXED = {"model": "fixed", "forward": 0.2, "backward": 0.4}


def distopt(parallel=None, **sections):
    """16 A100s on two nodes (dp 16 over InfiniBand), ZeRO-1, fixed layer times, one bucket per layer."""
    base = dict(cluster={"gpu": "A100-80GB-SXM", "nodes": 2, "gpus_per_node": 8}, model=SMALL,
                training={"global_batch": 32, "micro_batch": 1, "seq_len": 512},
                parallel={"tp": 1, "pp": 1, "dp": 16, "zero": 1, "dp_bucket_size": 1, **(parallel or {})},
                costs=FIXED, network="analytic")
    base.update(sections)
    return make_scenario(**base)


def durations(result, prefix):
    return [t.end_s - t.start_s for t in result.trace.itertuples() if t.name.startswith(prefix) and t.rank == 0]


def test_buckets_fill_in_backward_order_and_gather_in_forward_order():
    """ceil(n / per_bucket) buckets of equal items; the forward's first bucket is the remainder (Megatron fills
    buckets from the end of the model, and gathers them from its start)."""
    plan = resolve(distopt({"dp_bucket_size": 3}))
    ready = [(layer, 1.0) for layer in range(9, -1, -1)]  # 10 items of 1 byte, the last layer's first
    grouped = group_buckets(plan, ready)
    assert len(grouped) == math.ceil(10 / 3)
    assert [len(layers) for layers, _ in grouped] == [3, 3, 3, 1]
    assert fill_buckets(plan, ready) == [(7, 3.0), (4, 3.0), (1, 3.0), (0, 1.0)]


@pytest.mark.parametrize("bucket", [1, 2**40])
def test_gather_buckets_hold_the_stage_weights(bucket):
    """Per layer (bucket 1 byte: each layer closes one; the embedding its own) or one bucket for the whole chunk;
    either way the buckets sum to the single all-gather they replace."""
    on = resolve(distopt({"dp_bucket_size": bucket, "overlap_param_gather": True}))
    off = resolve(distopt({"dp_bucket_size": bucket}))
    buckets = param_gather_buckets(on, 0)
    assert sum(b.nbytes for b in buckets) == pytest.approx(final_weight_gather_bytes(off, 0), rel=1e-12)
    assert final_weight_gather_bytes(on, 0) == 0.0
    if bucket == 1:
        assert [b.layers for b in buckets] == [(-1,)] + [(layer,) for layer in range(8)]
    else:
        assert [b.layers for b in buckets] == [(-1, *range(8))]


@pytest.mark.parametrize("aligned", [False, True])
def test_overlapped_gather_exposes_only_what_precedes_the_first_layer(aligned):
    """Compute-bound forward: the step shortens by exactly the end-of-step all-gather minus what the first layer
    waits for: the embedding's bucket (no compute under fixed costs) and layer 0's. Every later layer's gather
    runs under the previous layer's forward (0.2 s against a few ms)."""
    off = runner.run(distopt())
    on = runner.run(distopt({"overlap_param_gather": True, "align_param_gather": aligned}))
    (whole,) = durations(off, "param_all_gather")
    gathers = durations(on, "param_gather_bucket")
    assert len(gathers) == 9 and not durations(on, "param_all_gather")
    assert max(gathers[1:]) < FIXED["forward"]
    saved = off.summary.step_time_s - on.summary.step_time_s
    assert saved == pytest.approx(whole - gathers[0] - gathers[1], rel=1e-9)
    layer0 = [t for t in on.trace.itertuples() if t.kind == "forward" and t.layer == 0 and t.microbatch == 0][0]
    assert layer0.start_s == pytest.approx(gathers[0] + gathers[1], rel=1e-9)


def test_one_bucket_hides_nothing():
    """A single bucket: the forward waits for the whole gather at the start instead of the end; same step."""
    off = runner.run(distopt({"dp_bucket_size": 2**40}))
    on = runner.run(distopt({"dp_bucket_size": 2**40, "overlap_param_gather": True}))
    assert on.summary.step_time_s == pytest.approx(off.summary.step_time_s, rel=1e-12)


def test_communication_bound_chain():
    """A forward shorter than a layer's gather: unaligned, each gather is issued when the previous bucket starts,
    so layer i starts at g_e + (i+1) g (the gathers back to back); the step is that chain plus the rest."""
    fast = {"model": "fixed", "forward": 1e-4, "backward": 2e-4}
    on = runner.run(distopt({"overlap_param_gather": True}, costs=fast))
    gathers = durations(on, "param_gather_bucket")
    starts = sorted((t.layer, t.start_s) for t in on.trace.itertuples()
                    if t.kind == "forward" and t.microbatch == 0 and t.rank == 0 and t.name == "attention")
    for layer, start in starts:
        assert start == pytest.approx(sum(gathers[:layer + 2]), rel=1e-9)


def test_no_overlap_grad_reduce_reduces_one_bucket_after_the_backward():
    """Megatron-LM's default (no --overlap-grad-reduce): bucket_size None, one reduce-scatter of the whole
    gradient buffer after the last backward, wholly exposed; with buckets (1 byte: one per layer) all but the
    last hide under the backward."""
    one = runner.run(distopt({"overlap_grad_reduce": False}))
    buckets = runner.run(distopt())
    (reduce,) = [t for t in one.trace.itertuples() if t.kind == "dp" and t.name.startswith("grad_bucket")]
    last_backward = max(t.end_s for t in one.trace.itertuples() if t.kind == "backward")
    assert reduce.start_s == pytest.approx(last_backward, rel=1e-12)
    (task,) = [t for t in one.graph.tasks if t.name.startswith("grad_bucket")]
    assert task.nbytes == pytest.approx(sum(gradient_bytes(one.plan, 0).values()), rel=1e-12)
    assert len([t for t in buckets.graph.tasks if t.name.startswith("grad_bucket")]) == 9
    assert one.summary.step_time_s > buckets.summary.step_time_s


def test_interleaved_pipeline_gathers_a_chunk_ahead_and_ranks_all_agrees():
    scenario = distopt({"pp": 2, "dp": 8, "vpp": 2, "overlap_param_gather": True, "align_param_gather": True},
                       schedule="interleaved", training={"global_batch": 32, "micro_batch": 1, "seq_len": 512})
    sliced = runner.run(scenario)
    names = [t.name for t in sliced.graph.tasks if t.rank == sliced.graph.tasks[0].rank and t.kind == "dp"]
    assert sum(name.startswith("param_gather_bucket") for name in names) == 5  # embedding + 4 layers, stage 0
    every = runner.run(scenario.model_copy(update={"ranks": "all"}))
    assert every.summary.step_time_s == pytest.approx(sliced.summary.step_time_s, rel=1e-9)


@pytest.mark.parametrize("parallel", [{"overlap_param_gather": True},
                                      {"overlap_param_gather": True, "align_param_gather": True},
                                      {"overlap_grad_reduce": False}])
def test_estimate_follows_the_simulation(parallel):
    scenario = distopt({"dp_bucket_size": 2**27, **parallel}, costs="roofline")
    assert estimate(scenario).step_time_s == pytest.approx(runner.run(scenario).summary.step_time_s, rel=0.05)


@pytest.mark.parametrize("sections, message", [
    (dict(parallel={"tp": 1, "pp": 1, "dp": 16, "overlap_param_gather": True}),
     "parallel.overlap_param_gather: needs the distributed optimizer"),
    (dict(parallel={"tp": 1, "pp": 1, "dp": 16, "overlap_param_gather": True}, fsdp={"sharding": "SHARD_GRAD_OP"}),
     "parallel.overlap_param_gather: needs the distributed optimizer"),
    (dict(parallel={"tp": 1, "pp": 1, "dp": 16, "zero": 1, "overlap_param_gather": True},
          offload={"optimizer": True}), "parallel.overlap_param_gather: the weights come back from the host"),
])
def test_rules(sections, message):
    with pytest.raises(ConfigError, match=message):
        make_scenario(cluster={"gpu": "A100-80GB-SXM", "nodes": 2, "gpus_per_node": 8}, training={"global_batch": 16},
                      **sections)


def test_a_later_stages_first_bucket_gathers_from_the_step_start_and_the_holds_add_up():
    """``align_param_gather: false`` under a pipeline: Megatron-Core dispatches each stage's bucket 0 all-gather in
    zero_grad_buffer, before any forward, and the next one in the forward pre-hook as the compute reaches the
    bucket. So stage 1's bucket 0 gather starts at 0 (it does not wait for stage 0's activations, as it did
    when it was the pass's first task), its first layer still waits for them, and the estimate adds each stage's
    hold to the next stage's start (the later gathers are issued only when the compute reaches them)."""
    scenario = distopt({"pp": 2, "dp": 8, "overlap_param_gather": True, "dp_bucket_size": 2**20}, costs="roofline")
    run = runner.run(scenario)
    stage1 = run.trace[run.trace["stage"] == 1]
    gathers = stage1[stage1["name"].str.startswith("param_gather_bucket")].sort_values("start_s")
    first_forward = stage1[stage1["kind"] == "forward"]["start_s"].min()
    stage0_send = run.trace[(run.trace["stage"] == 0) & (run.trace["kind"] == "pp")]["end_s"].min()
    assert gathers["start_s"].iloc[0] == 0.0
    assert gathers["start_s"].iloc[1] >= stage0_send  # dispatched when the compute reaches the chunk
    assert first_forward >= stage0_send
    assert estimate(scenario).step_time_s == pytest.approx(run.summary.step_time_s, rel=0.05)
