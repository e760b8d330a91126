"""What the emitters put in the task graph: Megatron's TP collectives, PP sends and DDP buckets, with the
volumes of Narayanan et al. SC21 Sec. 2.3 and of the model's gradient bytes."""

import pytest

from sim import runner
from sim.model.flops import model_flops_per_step
from sim.plan import resolve
from sim.workload import build as workload

from conftest import make_scenario

GPT = {"name": "g", "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16, "vocab_size": 4096,
       "max_seq_len": 1024}


def layout(tp, pp, dp, sp=False, recompute="none", mb=2):
    return make_scenario(cluster={"gpu": "A100-80GB-SXM", "nodes": tp * pp * dp // 4, "gpus_per_node": 4},
                         model=GPT, training={"global_batch": 8 * dp * mb, "micro_batch": mb, "seq_len": 1024,
                                              "recompute": recompute},
                         parallel={"tp": tp, "pp": pp, "dp": dp, "sequence_parallel": sp})


def tasks_of(graph, **match):
    return [t for t in graph.tasks if all(getattr(t, k) == v for k, v in match.items())]


def test_tp_all_reduces_two_forward_two_backward_per_layer():
    s = layout(tp=4, pp=2, dp=1)
    g = workload.build(resolve(s))
    bsh_bytes = 2 * 1024 * 1024 * 2  # b=2, s=1024, h=1024, bf16
    for stage in range(2):
        rank = resolve(s).grid.stage_representative(stage)
        per_mb_layer = len(tasks_of(g, rank=rank, kind="tp", microbatch=0, layer=stage * 4))
        assert per_mb_layer == 4
        assert {t.nbytes for t in tasks_of(g, rank=rank, kind="tp")} == {bsh_bytes}
        assert {t.group for t in tasks_of(g, rank=rank, kind="tp")} == {resolve(s).grid.tp_group(rank)}
    assert len(tasks_of(g, kind="tp")) == 4 * 8 * resolve(s).microbatches  # 4 per layer, 8 layers, m micro-batches


def test_sequence_parallel_swaps_each_all_reduce_for_reduce_scatter_plus_all_gather():
    g = workload.build(resolve(layout(tp=4, pp=1, dp=1, sp=True)))
    ops = [t.op for t in tasks_of(g, kind="tp", microbatch=0, layer=0)]
    # Forward: all-gather + reduce-scatter per block. Backward: the output gradient's all-gather, the stored
    # sharded input's all-gather for the weight gradient (Korthikanti et al. 2022 Sec. 4.2.2), reduce-scatter.
    assert ops.count("all_gather") == 6 and ops.count("reduce_scatter") == 4 and "all_reduce" not in ops


def test_full_recompute_replays_the_forward_collectives():
    g = workload.build(resolve(layout(tp=4, pp=1, dp=1, recompute="full")))
    assert len(tasks_of(g, kind="tp", microbatch=0, layer=3)) == 6  # 2 forward + 2 recompute + 2 backward
    assert len(tasks_of(g, kind="recompute", microbatch=0, layer=3)) == 2


def test_pp_sends_one_per_microbatch_boundary_each_way():
    s = layout(tp=2, pp=4, dp=1)
    g = workload.build(resolve(s))
    sends = tasks_of(g, kind="pp")
    m, p = resolve(s).microbatches, 4
    assert len([t for t in sends if t.name == "send_forward"]) == m * (p - 1)
    assert len([t for t in sends if t.name == "send_backward"]) == m * (p - 1)
    assert {t.nbytes for t in sends} == {2 * 1024 * 1024 * 2 / 2}  # b*s*h/t elements, bf16


def test_dp_buckets_carry_every_gradient_byte_once():
    s = layout(tp=2, pp=2, dp=4)
    g = workload.build(resolve(s))
    for stage in range(2):
        rank = resolve(s).grid.stage_representative(stage)
        buckets = tasks_of(g, rank=rank, kind="dp")
        assert len(buckets) > 1
        # bf16 training reduces fp32 gradients (Megatron-LM's accumulate_allreduce_grads_in_fp32)
        assert sum(t.nbytes for t in buckets) == pytest.approx(4 * resolve(s).stage_params(stage))
        assert all(t.op == "all_reduce" and t.group == resolve(s).grid.dp_group(rank) for t in buckets)


def test_dp_buckets_overlap_the_last_backward():
    result = runner.run(layout(tp=1, pp=1, dp=4))
    trace = result.trace
    first_bucket = trace[trace["kind"] == "dp"]["start_s"].min()
    last_backward = trace[trace["kind"] == "backward"]["end_s"].max()
    assert first_bucket < last_backward


def test_trace_flops_add_up_to_the_model_flops():
    s = layout(tp=2, pp=2, dp=2)
    result = runner.run(s)
    executed = result.trace["flops"].sum() * s.parallel.tp * resolve(s).dp
    plan = resolve(s)
    assert executed == pytest.approx(model_flops_per_step(s.model, plan.global_batch, plan.seq_len), rel=1e-12)


@pytest.mark.parametrize("overrides", [
    [], ["schedule=zb-h1"], ["schedule=interleaved", "parallel.vpp=2", "training.microbatches=8"],
    ["training.recompute=full"], ["training.recompute=none", "parallel.sequence_parallel=false"],
    ["ranks=all"], ["ranks=all", "fold_tp=false"], ["parallel.tp_comm_overlap=true"],
    ["parallel.tp_comm_overlap=true", "parallel.sequence_parallel=true", "training.recompute=selective"],
    ["parallel.tp_comm_overlap=true", "parallel.sequence_parallel=true", "parallel.tp_comm_overlap_method=async_tp",
     "training.recompute=full"],
    ["schedule=zb-v", "parallel.vpp=2"], ["schedule=dualpipev", "parallel.vpp=2"],
    ["schedule=zb-h1", "ranks=all", "parallel.dp=2", "cluster.nodes=4"],
    ["cluster.nodes=4", "parallel.dp=2", "parallel.zero=3", "fsdp.sharding=FULL_SHARD"],  # FSDP + PP
], ids=lambda o: ",".join(o) or "base")
def test_stamping_a_layer_chain_builds_the_same_graph(overrides):
    from pathlib import Path

    from sim.spec.scenario import load_scenario
    path = Path(__file__).resolve().parent.parent / "scenarios" / "tiny.yaml"
    scenario = load_scenario(path, overrides)
    stamped, emitted = workload.build(resolve(scenario)), workload.build(resolve(scenario), stamp=False)
    assert stamped.tasks == emitted.tasks
    assert stamped.streams == emitted.streams


@pytest.mark.parametrize("sp", [True, False], ids=["sp", "no-sp"])
@pytest.mark.parametrize("overlap", [False, True], ids=["blocking", "async"])
@pytest.mark.parametrize("stamp", [True, False], ids=["stamped", "emitted"])
def test_a_backward_waits_for_the_tp_collective_it_reads_even_when_tp_communication_is_asynchronous(sp, overlap,
                                                                                                     stamp):
    # tp_comm_overlap only lifts the wait on collectives a compute task does not read. A block's input-gradient
    # GEMM reads the gradient of its output: with SP the all-gather of it (issued in the block), without SP the
    # previous block's all-reduce. It once lost that dependency under asynchronous TP (and ran before the
    # gather it reads), which made tp_comm_overlap look 4% faster on the 175B interleaved layouts.
    s = make_scenario(cluster={"gpu": "A100-80GB-SXM", "nodes": 1, "gpus_per_node": 2}, model=GPT,
                      training={"global_batch": 4, "micro_batch": 1, "seq_len": 1024, "recompute": "none"},
                      parallel={"tp": 2, "pp": 1, "dp": 1, "sequence_parallel": sp, "tp_comm_overlap": overlap})
    g = workload.build(resolve(s), stamp=stamp)
    reads = 0
    for task in g.tasks:
        if task.stream != "compute" or task.kind != "backward" or task.name not in ("mlp", "attention"):
            continue
        before = [g.tasks[task.id - back] for back in (1, 2, 3)]
        if sp and overlap and all(t.op == "all_gather" for t in before):  # the input-gradient GEMM, whose
            # gather runs in two chunks under TE's userbuffers (the first read, the other beside the GEMM)
            assert before[2].id in task.deps and before[1].id not in task.deps, task
            assert before[2].nbytes == before[1].nbytes == before[0].nbytes / 2, task  # tp 2: two chunks
            reads += 1
        elif sp and not overlap and before[0].op == "all_gather" and before[1].op == "all_gather":
            assert before[1].id in task.deps, task
            reads += 1
        elif not sp and before[1].op == "all_reduce" and before[0].name == "mlp":  # attention after mlp's
            assert before[1].id in task.deps, task
            reads += 1
    assert reads == 4 * GPT["num_layers"] * (2 if sp else 1)  # micro-batches x layers x blocks read


@pytest.mark.parametrize("name, overrides", [
    ("mixtral-8x7b_h100-64", ["training.global_batch=64", "schedule=zb-h1", "parallel.vpp=1"]),
    ("mixtral-8x7b_h100-64", ["training.global_batch=128", "schedule=dualpipev", "parallel.vpp=2"]),
    ("llama3-8b_h100-1_lora", ["schedule=zb-h1"]),
], ids=["mixtral zb-h1", "mixtral dualpipev", "lora zb-h1"])
def test_stamping_the_weight_gradient_pass(name, overrides):
    """Zero-bubble passes (W) are stamped like a layer's forward and backward: MoE layers (the experts' and the
    router's weight gradients; DualPipe interleaves a pair's stamped tasks), frozen LoRA layers."""
    from pathlib import Path

    from sim.spec.scenario import load_scenario
    scenario = load_scenario(Path(__file__).resolve().parent.parent / "scenarios" / f"{name}.yaml", overrides)
    stamped, emitted = workload.build(resolve(scenario)), workload.build(resolve(scenario), stamp=False)
    assert any(task.kind == "weight" for task in stamped.tasks)
    assert stamped.tasks == emitted.tasks
    assert stamped.streams == emitted.streams


@pytest.mark.parametrize("name", ["gpt3-175b_a100-1024", "llama2-7b_h100-16_fsdp", "llama2-7b_h100-8_dp"])
def test_stamping_matches_on_the_bundled_scenarios(name):
    from pathlib import Path

    from sim.spec.scenario import load_scenario
    scenario = load_scenario(Path(__file__).resolve().parent.parent / "scenarios" / f"{name}.yaml",
                             ["training.global_batch=64"] if name.startswith("gpt3") else [])
    assert workload.build(resolve(scenario)).tasks == workload.build(resolve(scenario), stamp=False).tasks
