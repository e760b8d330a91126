"""CPU offload (ZeRO-Offload / FSDP CPUOffload), communication buffers and allocator overhead."""

import pytest
from test_data_parallel import comm_bound

from sim import runner
from sim.model.memory import model_state_bytes
from sim.plan import resolve
from sim.workload.footprint import memory_plan


def tasks(result, name, rank=0):
    return [t for t in result.graph.tasks if t.rank == rank and t.name == name]


def span(result, task):
    return result.trace.at[task.id, "start_s"], result.trace.at[task.id, "end_s"]


@pytest.fixture(scope="module")
def offloaded():
    return runner.run(comm_bound(parallel={"tp": 1, "pp": 1, "dp": 16, "zero": 2}, offload={"optimizer": True}))


def test_zero_offload_moves_the_optimizer_to_the_host(offloaded):
    scenario = offloaded.scenario
    params = resolve(scenario).stage_params(0)
    parts = offloaded.summary.memory_breakdown_bytes["0"]
    assert parts["optimizer"] == 0
    assert offloaded.summary.host_memory_bytes == pytest.approx(model_state_bytes(params, "bf16", 2, 16).optimizer)
    assert not [t for t in offloaded.graph.tasks if t.stream == "compute" and t.kind == "optimizer"]


def test_each_reduced_shard_crosses_pcie_then_host_adam_then_the_weights_return(offloaded):
    scenario, pcie = offloaded.scenario, offloaded.scenario.cluster.pcie
    reduces = tasks(offloaded, "grad_reduce_scatter")
    copies = tasks(offloaded, "grads_to_host")
    assert len(copies) == len(reduces)
    for reduce, copy in zip(reduces, copies, strict=True):
        assert copy.nbytes == pytest.approx(reduce.nbytes / 16)  # the rank's reduced shard
        start, end = span(offloaded, copy)
        assert start >= span(offloaded, reduce)[1]
        assert end - start == pytest.approx(pcie.latency + copy.nbytes / (pcie.bandwidth * pcie.efficiency))
    (adam,) = tasks(offloaded, "host_adam")
    shard = resolve(scenario).stage_params(0) / 16
    assert adam.stream == "host" and adam.duration == pytest.approx(28 * shard / scenario.offload.host_bandwidth)
    assert span(offloaded, adam)[0] >= max(span(offloaded, c)[1] for c in copies)
    (back,) = tasks(offloaded, "params_to_gpu")
    assert back.nbytes == pytest.approx(2 * shard) and span(offloaded, back)[0] >= span(offloaded, adam)[1]
    (gather,) = tasks(offloaded, "param_all_gather")
    assert span(offloaded, gather)[0] >= span(offloaded, back)[1]


def test_parameter_offload_copies_each_unit_shard_before_its_gather():
    result = runner.run(comm_bound(fsdp={"sharding": "FULL_SHARD"}, offload={"optimizer": True, "params": True}))
    assert result.summary.memory_breakdown_bytes["0"]["weights"] == 0
    gathers = tasks(result, "param_gather_fwd") + tasks(result, "param_gather_bwd")
    copies = [t for t in tasks(result, "params_to_gpu") if t.layer >= 0]
    assert len(copies) == len(gathers)
    for copy, gather in zip(sorted(copies, key=lambda t: t.id), sorted(gathers, key=lambda t: t.id), strict=True):
        assert copy.nbytes == pytest.approx(gather.nbytes / 16)
        assert span(result, gather)[0] >= span(result, copy)[1]
    plain = runner.run(comm_bound(fsdp={"sharding": "FULL_SHARD"}))
    assert result.summary.step_time_s > plain.summary.step_time_s


def test_deepspeed_offload_keys():
    scenario = comm_bound(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}})
    assert scenario.offload.optimizer and not scenario.offload.params and resolve(scenario).zero_stage == 2


def test_ddp_buckets_are_a_second_copy_of_the_gradients_unless_bucket_views():
    bf16_grads = {"global_batch": 16, "micro_batch": 1, "seq_len": 512, "grad_dtype": "bf16"}
    ddp = memory_plan(resolve(comm_bound(training=bf16_grads)))[0]  # torch DDP: buckets copy the gradients
    assert ddp["comm_buffers"] == ddp["gradients"] > 0
    viewed = comm_bound(training=bf16_grads, parallel={"tp": 1, "pp": 1, "dp": 16, "grad_bucket_view": True})
    assert memory_plan(resolve(viewed))[0]["comm_buffers"] == 0
    megatron = memory_plan(resolve(comm_bound()))[0]  # fp32 main grads: the buckets are views of Megatron's grad buffer
    assert megatron["comm_buffers"] == 0 and megatron["gradients"] == 2 * ddp["gradients"]
    zero2 = memory_plan(resolve(comm_bound(parallel={"tp": 1, "pp": 1, "dp": 16, "zero": 2})))[0]
    assert zero2["comm_buffers"] == 2 * 25 * 2**20  # two reduce buckets (overlap_comm double buffer)
    traced = runner.run(comm_bound(training=bf16_grads)).summary.memory_breakdown_bytes["0"]
    assert traced["comm_buffers"] == ddp["comm_buffers"]


def test_allocator_overhead_and_reserved_memory():
    plain = runner.run(comm_bound()).summary
    padded = runner.run(comm_bound(memory={"reserved": "1 GiB", "allocator_overhead": 0.1})).summary
    assert padded.peak_memory_bytes.max == pytest.approx(1.1 * plain.peak_memory_bytes.max + 2**30)
    parts = padded.memory_breakdown_bytes["0"]
    assert parts["reserved"] == 2**30 and parts["allocator_overhead"] == pytest.approx(
        0.1 * plain.peak_memory_bytes.max)
