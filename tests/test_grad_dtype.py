"""The dtype gradients are accumulated and reduced in: fp32 for Megatron-LM's bf16 (arguments.py: "bfloat16
requires gradient accumulation and all-reduce to be done in fp32"), the training dtype where gradients are
sharded (FSDP's MixedPrecision reduce_dtype, DeepSpeed's communication_data_type default), and what memory,
communication and the optimizer step make of it."""

import pytest

from sim.costs.models import RooflineCosts
from sim.hardware.gpus import GPU_PRESETS
from sim.model.memory import adam_step_bytes_per_param, model_state_bytes
from sim.plan import resolve
from sim.workload import build as workload
from sim.workload.footprint import stage_memory

from conftest import make_scenario

TRAINING = {"global_batch": 8, "micro_batch": 1, "seq_len": 512}
H100 = {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8}  # FP8 needs Hopper's tensor cores


@pytest.mark.parametrize(("sections", "expected"), [
    ({}, "fp32"),  # Megatron-LM with bf16
    ({"parallel": {"tp": 1, "pp": 1, "dp": 8, "zero": 1}}, "fp32"),  # Megatron's distributed optimizer
    ({"parallel": {"tp": 1, "pp": 1, "dp": 8, "zero": 2}}, "bf16"),  # sharded gradients
    ({"parallel": {"tp": 1, "pp": 1, "dp": 8, "zero": 3}}, "bf16"),
    ({"fsdp": {"sharding": "FULL_SHARD"}}, "bf16"),
    ({"fsdp": {"sharding": "NO_SHARD"}}, "bf16"),  # FSDP's MixedPrecision reduce_dtype, whatever the sharding
    ({"zero_optimization": {"stage": 1}}, "bf16"),  # DeepSpeed: communication_data_type = the model's dtype
    ({"training": {**TRAINING, "dtype": "fp16"}}, "fp16"),  # Megatron keeps fp16 gradients for fp16
    ({"training": {**TRAINING, "dtype": "fp32"}}, "fp32"),
    ({"training": {**TRAINING, "grad_dtype": "bf16"}}, "bf16"),  # Megatron's --grad-reduce-in-bf16
    ({"training": {**TRAINING, "grad_dtype": "fp32"}, "fsdp": {"sharding": "FULL_SHARD"}}, "fp32"),
    # FP8 (Transformer Engine): FP8 GEMMs from bf16 weights, so the gradients are bf16's (issue 22)
    ({"training": {**TRAINING, "dtype": "fp8"}, "cluster": H100}, "fp32"),  # Megatron's fp32 main grads
    ({"training": {**TRAINING, "dtype": "fp8"}, "cluster": H100, "parallel": {"tp": 1, "pp": 1, "dp": 8, "zero": 2}},
     "bf16"),
    ({"training": {**TRAINING, "dtype": "fp8"}, "cluster": H100, "zero_optimization": {"stage": 1}}, "bf16"),
    ({"training": {**TRAINING, "dtype": "tf32"}, "zero_optimization": {"stage": 1}}, "fp32"),  # was an error
])
def test_auto_grad_dtype_follows_the_framework_default(sections, expected):
    assert resolve(make_scenario(**sections)).grad_dtype == expected


def test_fp32_gradients_make_mixed_precision_18_bytes_per_param():
    psi, n = 1.0, 64
    assert model_state_bytes(psi, "bf16", grad_dtype="fp32").total == 2 + 4 + 12
    assert model_state_bytes(psi, "bf16", 1, n, grad_dtype="fp32").total == pytest.approx(2 + 4 + 12 / n)
    assert model_state_bytes(psi, "bf16", 2, n, grad_dtype="bf16").total == pytest.approx(2 + 14 / n)
    assert model_state_bytes(7e9, "bf16").total == 112e9  # the textbook 16 bytes without it


def test_memory_and_buckets_carry_fp32_gradients_for_megatron_bf16():
    megatron = make_scenario()
    bf16 = make_scenario(training={**TRAINING, "grad_dtype": "bf16"})
    params = resolve(megatron).stage_params(0)
    assert stage_memory(resolve(megatron), 0)["gradients"] == pytest.approx(4 * params)
    assert stage_memory(resolve(bf16), 0)["gradients"] == pytest.approx(2 * params)
    # Megatron's buckets are views of its fp32 grad buffer; torch DDP's default copies the gradients into them
    assert stage_memory(resolve(megatron), 0)["comm_buffers"] == 0.0
    assert stage_memory(resolve(bf16), 0)["comm_buffers"] == pytest.approx(2 * params)
    for scenario, elem in ((megatron, 4), (bf16, 2)):
        buckets = [t for t in workload.build(resolve(scenario)).tasks if t.kind == "dp" and t.rank == 0]
        assert sum(t.nbytes for t in buckets) == pytest.approx(elem * params)


def test_the_optimizer_reads_the_gradient_in_its_dtype():
    costs = RooflineCosts(GPU_PRESETS["A100-80GB-SXM"], "bf16")
    fp32_grads = adam_step_bytes_per_param("bf16", 4.0)
    assert fp32_grads == 30
    assert costs.optimizer_time(1e9, fp32_grads) / costs.optimizer_time(1e9) == pytest.approx(30 / 28)


def test_fp8_keeps_megatrons_fp32_main_gradients_in_memory():
    """Switching a Megatron-LM run from bf16 to FP8 changes which GEMMs run in FP8, not the model states:
    bf16 weights, fp32 main gradients and Adam (2 + 4 + 12 bytes per parameter) either way. The old rule
    resolved fp8's gradients to 2 bytes and dropped 2 bytes per parameter (Llama 3 8B: 82.3 -> 67.4 GiB)."""
    bf16 = resolve(make_scenario(cluster=H100))
    fp8 = resolve(make_scenario(cluster=H100, training={**TRAINING, "dtype": "fp8"}))
    params = fp8.stage_params(0)
    assert stage_memory(fp8, 0)["gradients"] == pytest.approx(4 * params)
    for part in ("weights", "gradients", "optimizer", "comm_buffers", "total"):
        assert stage_memory(fp8, 0)[part] == pytest.approx(stage_memory(bf16, 0)[part])

