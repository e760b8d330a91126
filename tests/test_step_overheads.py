"""Kernel launch floors, blocking pipeline sends and the optimizer's gradient checks (issue 22, 'Kernels beyond
GEMMs' and 'Pipeline and step overheads'; docs/mechanisms/kernel_launch.md, p2p_wait.md, grad_clip.md), each
against its closed form."""

import pytest

from sim import runner
from sim.costs.models import RooflineCosts, Work
from sim.hardware.gpus import GPU_PRESETS
from sim.model.layer_ops import layer_forward_ops
from sim.model.layer_shape import LayerShape
from sim.model.ops import EAGER_RMSNORM_KERNELS, Op
from sim.network import models as network_models
from sim.plan import resolve
from sim.workload.cost_model import make_costs
from sim.workload.optimizer_step import grad_checks, grad_stats_group, optimizer_params

from conftest import BASE, make_scenario

A100 = GPU_PRESETS["A100-80GB-SXM"]


def tiny_ops(n: int) -> Work:
    """n element-wise kernels of 1 KB each: far under any launch floor."""
    return Work(tuple(Op(f"op{i}", 0.0, 1024.0, False) for i in range(n)), 0.5)


def test_a_block_of_tiny_kernels_costs_n_floors_or_n_launches():
    n, floor, launch = 12, 2e-6, 7e-6
    device_only = RooflineCosts(A100, "bf16", kernel_floor=floor)
    assert device_only.compute_time(tiny_ops(n), "forward") == pytest.approx(n * floor, rel=1e-12)
    assert device_only.compute_time(tiny_ops(n), "backward") == pytest.approx(2 * n * floor, rel=1e-12)
    host_bound = RooflineCosts(A100, "bf16", kernel_floor=floor, launch_overhead=launch)
    assert host_bound.compute_time(tiny_ops(n), "forward") == pytest.approx(n * launch, rel=1e-12)
    assert host_bound.compute_time(tiny_ops(n), "weight_grad") == 0.0  # no weights: no W kernels
    # A large GEMM is far above both: its time is the roofline's, unchanged.
    gemm = Work((Op("gemm", 2.0 * 8192**3, 3 * 2 * 8192**2, True, True),), 0.5)
    assert host_bound.compute_time(gemm, "forward") == RooflineCosts(A100, "bf16").compute_time(gemm, "forward")


def test_an_eager_rmsnorm_is_eight_launches():
    llama = make_scenario().model.model_copy(update={"norm": "rmsnorm"})  # eager LayerNorm is one ATen kernel
    ops = layer_forward_ops(LayerShape(llama, 1, 8, 1, sequence_parallel=False, elem_bytes=2, flash_attention=True,
                                       fused_kernels=False))
    norm = next(op for op in ops["attention"] if op.name == "input_norm")
    assert norm.kernels == EAGER_RMSNORM_KERNELS == 8
    costs = RooflineCosts(A100, "bf16", kernel_floor=1e-6)
    assert costs.kernel_time(norm) == pytest.approx(8e-6, rel=1e-12)  # 8 tokens: the floors dominate
    fused = layer_forward_ops(LayerShape(make_scenario().model, 1, 8, 1, sequence_parallel=False, elem_bytes=2,
                                         flash_attention=True))
    assert next(op for op in fused["attention"] if op.name == "input_norm").kernels == 1


def test_cuda_graphs_remove_the_host_launches_and_the_defaults_are_the_documented_ones():
    costs = make_costs(resolve(make_scenario(costs="roofline")))
    assert (costs.kernel_floor, costs.launch_overhead) == pytest.approx((1.2e-6, 5e-6), rel=1e-15)  # type: ignore[attr-defined]
    graphed = make_costs(resolve(make_scenario(costs="roofline", training={"cuda_graphs": True})))
    assert (graphed.kernel_floor, graphed.launch_overhead) == pytest.approx((1.2e-6, 0.0), rel=1e-15)  # type: ignore[attr-defined]


def two_stages(m: int, overlap: bool, c_ms: float = 0.25):
    """1F1B on 2 stages of one layer, F = 1 ms, B = 2 ms, sends of latency c on an infinitely fast link."""
    return make_scenario(
        cluster={"gpu": "A100-80GB-SXM", "nodes": 1, "gpus_per_node": 2,
                 "intra_node": {"bandwidth": "1e30 B/s", "latency": f"{c_ms} ms", "efficiency": 1, "base_latency": 0,
                                "efficiency_curve": []}},
        model={**BASE["model"], "num_layers": 2},
        training={"global_batch": m, "micro_batch": 1, "seq_len": 512, "clip_grad": 0},
        parallel={"tp": 1, "pp": 2, "dp": 1, "overlap_p2p_comm": overlap}, schedule="1f1b",
        costs={"model": "fixed", "forward": "1 ms", "backward": "2 ms"}, network="analytic")


def test_blocking_sends_put_one_more_hop_on_the_critical_path():
    """p = 2, m = 2, 1F1B (worked by hand): with sends the receiver alone waits for, the step is 3F + 3B + 2c; when
    the sender also waits for each send (Megatron's _communicate without overlap), stage 1's second forward waits
    for its first backward's send, and the step is 3F + 3B + 3c."""
    f, b, c = 1e-3, 2e-3, 0.25e-3
    assert runner.run(two_stages(2, overlap=True)).summary.step_time_s == pytest.approx(3 * f + 3 * b + 2 * c)
    assert runner.run(two_stages(2, overlap=False)).summary.step_time_s == pytest.approx(3 * f + 3 * b + 3 * c)
    # One micro-batch: the trip down and back is the same either way, F0 + c + F1 + B1 + c + B0.
    for overlap in (True, False):
        assert runner.run(two_stages(1, overlap)).summary.step_time_s == pytest.approx(2 * f + 2 * b + 2 * c)


def test_with_blocking_sends_no_compute_runs_beside_its_own_send():
    trace = runner.run(two_stages(4, overlap=False)).trace
    for rank, rows in trace.groupby("rank"):
        sends = rows[rows["stream"] == "pp"]
        compute = rows[rows["stream"] == "compute"]
        for _, send in sends.iterrows():
            beside = compute[(compute["start_s"] < send["end_s"] - 1e-15)
                             & (compute["end_s"] > send["start_s"] + 1e-15)]
            assert beside.empty, f"rank {rank} computes during its send"


def tail(training=None, parallel=None, **sections):
    """One stage, tp 2 on 2 GPUs (the model-parallel group), roofline costs."""
    return make_scenario(cluster={"gpu": "A100-80GB-SXM", "nodes": 1, "gpus_per_node": 2},
                         training={**BASE["training"], **(training or {})},
                         parallel={"tp": 2, "pp": 1, "dp": 1, **(parallel or {})}, costs="roofline", **sections)


def test_clip_grad_adds_one_read_of_the_gradients_and_a_four_byte_all_reduce():
    on, off = runner.run(tail()), runner.run(tail({"clip_grad": 0}))
    plan = on.plan
    grads = optimizer_params(plan, 0) * plan.grad_bytes_per_param
    assert grad_checks(plan, 0) == [("grad_norm", grads)]
    group = grad_stats_group(plan, 0)
    assert group == (0, 1)  # the model-parallel group: the TP pair
    net = network_models.make("analytic", runner.build_topology(plan))
    expected = make_costs(plan).memory_time(grads) + net.collective_time("all_reduce", 4.0, group)
    assert on.summary.step_time_s - off.summary.step_time_s == pytest.approx(expected, rel=1e-9)
    factor = plan.profile.end_to_end_factor  # type: ignore[union-attr]  # A100's end-to-end calibration
    assert grads / (A100.hbm_bandwidth * A100.memory_efficiency) * factor == pytest.approx(
        make_costs(plan).memory_time(grads), rel=1e-12)


def test_fp16_adds_the_unscale_and_inf_check_before_the_norm():
    plan = resolve(tail({"dtype": "fp16"}))
    grads = optimizer_params(plan, 0) * plan.grad_bytes_per_param
    assert grad_checks(plan, 0) == [("grad_unscale_check", 2 * grads), ("grad_norm", grads)]
    assert grad_checks(resolve(tail({"dtype": "fp16", "clip_grad": 0})), 0) == [
        ("grad_unscale_check", 2 * grads)]
    assert grad_checks(resolve(tail({"dtype": "bf16", "clip_grad": 0})), 0) == []


def test_a_sharded_optimizer_reduces_the_norm_over_every_rank():
    plan = resolve(make_scenario(parallel={"tp": 2, "pp": 2, "dp": 2, "zero": 1}, costs="roofline"))
    assert grad_stats_group(plan, 0) == tuple(range(8))
    plan = resolve(make_scenario(parallel={"tp": 2, "pp": 2, "dp": 2}, costs="roofline"))
    dp1 = plan.grid.rank(0, 1, 0)
    assert grad_stats_group(plan, dp1) == tuple(sorted(plan.grid.rank(t, 1, p) for t in (0, 1) for p in (0, 1)))
