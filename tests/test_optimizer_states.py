"""The optimizer's states per trained parameter (``training.master_weights``, ``training.optimizer_dtype``;
sim.model.memory.optimizer_bytes_per_param): mixed precision keeps an fp32 master and fp32 Adam moments (2 + 2 + 12
= 16 bytes per parameter with 16-bit gradients, Rajbhandari et al. SC20 Sec. 3.1), pure bf16 training (torchtune's
``dtype: bf16``: no master, torch.optim.AdamW's moments allocated like the bf16 parameter) 2 + 2 + 2 + 2 = 8; and
what the memory bound, the gradient dtype and the optimizer step's HBM traffic make of it."""

from __future__ import annotations

import pytest

from sim.errors import ConfigError
from sim.model.memory import adam_step_bytes_per_param, model_state_bytes, optimizer_bytes_per_param
from sim.plan import resolve
from sim.runner import run
from sim.workload.footprint import stage_memory

from conftest import make_scenario

TRAINING = {"global_batch": 8, "micro_batch": 1, "seq_len": 512}
PURE_BF16 = {**TRAINING, "master_weights": False, "optimizer_dtype": "bf16"}


@pytest.mark.parametrize(("dtype", "master", "moments", "state_bytes", "step_bytes"), [
    ("bf16", True, "fp32", 4 + 4 + 4, 2 + 12 + 12 + 2),  # mixed precision: master, m, v; 16-bit weight written
    ("bf16", False, "bf16", 2 + 2, 2 + 6 + 6),  # torchtune dtype: bf16: the weight, m and v, read and written
    ("bf16", True, "bf16", 4 + 2 + 2, 2 + 8 + 8 + 2),  # Megatron-Core's precision-aware optimizer, bf16 moments
    ("bf16", False, "fp32", 4 + 4, 2 + 10 + 10),  # bf16 weights updated in place, fp32 moments
    ("fp16", False, "fp16", 2 + 2, 2 + 6 + 6),
    ("fp8", True, "fp32", 12, 28),  # Transformer Engine's FP8 keeps bf16 weights and their fp32 master
    ("fp32", True, "fp32", 4 + 4, 4 + 12 + 12),  # fp32 weights are their own master: m and v only
])
def test_bytes_per_trained_parameter(dtype: str, master: bool, moments: str, state_bytes: int,
                                     step_bytes: int) -> None:
    grad = 4 if dtype == "fp32" else 2
    assert optimizer_bytes_per_param(dtype, master, moments) == state_bytes
    assert adam_step_bytes_per_param(dtype, grad, master, moments) == step_bytes
    states = model_state_bytes(1.0, dtype, master_weights=master, optimizer_dtype=moments)
    assert states.total == (4 if dtype == "fp32" else 2) + grad + state_bytes


def test_pure_bf16_is_8_bytes_per_parameter_under_every_zero_stage() -> None:
    # 2 + 2 + 4 bytes per parameter; ZeRO-1/2/3 shard the states as for mixed precision: (2 + 2 + 4/N),
    # (2 + 6/N), 8/N (the mixed-precision forms are 4 + 12/N, 2 + 14/N, 16/N).
    n = 64
    pure = {"master_weights": False, "optimizer_dtype": "bf16"}
    assert model_state_bytes(1.0, "bf16", 0, n, "bf16", **pure).total == 8
    assert model_state_bytes(1.0, "bf16", 1, n, "bf16", **pure).total == pytest.approx(2 + 2 + 4 / n)
    assert model_state_bytes(1.0, "bf16", 2, n, "bf16", **pure).total == pytest.approx(2 + 6 / n)
    assert model_state_bytes(1.0, "bf16", 3, n, "bf16", **pure).total == pytest.approx(8 / n)


def test_without_master_weights_gradients_stay_in_the_weights_dtype() -> None:
    # Megatron-LM's auto rule keeps fp32 main gradients for bf16 beside its fp32 master; without a master,
    # autograd accumulates into the bf16 parameter's own .grad.
    assert resolve(make_scenario(training=TRAINING)).grad_dtype == "fp32"
    assert resolve(make_scenario(training={**TRAINING, "master_weights": False})).grad_dtype == "bf16"
    explicit = {**TRAINING, "master_weights": False, "grad_dtype": "fp32"}
    assert resolve(make_scenario(training=explicit)).grad_dtype == "fp32"


def test_memory_bound_drops_by_the_states_it_no_longer_keeps() -> None:
    # DDP over 8 GPUs, every parameter on every rank: mixed precision 2 + 4 (Megatron's fp32 gradients) + 12, pure
    # bf16 2 + 2 + 4 per parameter; the gradient buckets (torch DDP copies bf16 gradients) are counted apart.
    mixed, pure = resolve(make_scenario(training=TRAINING)), resolve(make_scenario(training=PURE_BF16))
    params = mixed.stage_params(0)
    a, b = stage_memory(mixed, 0), stage_memory(pure, 0)
    assert (a["weights"], a["gradients"], a["optimizer"]) == pytest.approx((2 * params, 4 * params, 12 * params))
    assert (b["weights"], b["gradients"], b["optimizer"]) == pytest.approx((2 * params, 2 * params, 4 * params))


@pytest.mark.parametrize("zero", [0, 1])
def test_pure_bf16_with_fp32_reduction_keeps_its_unsharded_gradients_in_fp32(zero: int) -> None:
    # DDP / ZeRO-1 over 8 GPUs, no master, gradients reduced in fp32 (grad_dtype: fp32): the unsharded gradients the
    # buckets reduce are the fp32 main-gradient buffer (Megatron-LM's param_and_grad_buffer.py; the plan's
    # main_grad_buffer, so no separate bucket copy is counted), 4 bytes per parameter at rest, and Adam reads them
    # there (the fp32 gradient read, the bf16 weight, m and v read and written: 4 + 6 + 6 bytes moved). Only sharded
    # gradients (FSDP's foreach_reduce, ZeRO-2/3) are cast back to the parameters' dtype. Asking for fp32 reduction
    # must not hold fewer gradient bytes than bf16's.
    parallel = {"tp": 1, "pp": 1, "dp": 8, "zero": zero}
    fp32 = resolve(make_scenario(training={**PURE_BF16, "grad_dtype": "fp32"}, parallel=parallel))
    bf16 = resolve(make_scenario(training={**PURE_BF16, "grad_dtype": "bf16"}, parallel=parallel))
    params = fp32.stage_params(0)
    wide, narrow = stage_memory(fp32, 0), stage_memory(bf16, 0)
    assert fp32.grad_storage_dtype == "fp32" and fp32.main_grad_buffer
    assert (wide["gradients"], wide["comm_buffers"]) == pytest.approx((4 * params, 0.0))
    assert wide["gradients"] + wide["comm_buffers"] >= narrow["gradients"] + narrow["comm_buffers"]
    assert fp32.optimizer_step_bytes_per_param == 4 + 6 + 6


def test_the_optimizer_step_moves_half_the_bytes() -> None:
    # FSDP FULL_SHARD (bf16 gradients either way): the roofline's memory-bound Adam step over the rank's shard,
    # 28 bytes per parameter with the fp32 master, 14 without.
    fsdp = {"sharding": "FULL_SHARD"}
    mixed = run(make_scenario(training={**TRAINING, "grad_dtype": "bf16"}, fsdp=fsdp, costs="roofline"))
    pure = run(make_scenario(training=PURE_BF16, fsdp=fsdp, costs="roofline"))
    assert mixed.plan.optimizer_step_bytes_per_param == 28 and pure.plan.optimizer_step_bytes_per_param == 14

    def step_seconds(result: object) -> float:
        trace = result.trace  # type: ignore[attr-defined]
        rows = trace[(trace["name"] == "optimizer") & (trace["rank"] == 0)]
        return float((rows["end_s"] - rows["start_s"]).sum())

    assert step_seconds(pure) / step_seconds(mixed) == pytest.approx(14 / 28, rel=1e-9)


@pytest.mark.parametrize(("training", "sections", "message"), [
    ({"dtype": "fp32", "master_weights": False}, {}, "training.master_weights: false needs 16-bit weights"),
    ({"master_weights": False}, {"offload": {"optimizer": True}, "parallel": {"tp": 1, "pp": 1, "dp": 8, "zero": 2}},
     "offload.optimizer: the host Adam is modelled with an fp32 master"),
    ({"optimizer_dtype": "fp8"}, {}, "training.optimizer_dtype"),
])
def test_one_line_errors(training: dict, sections: dict, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        make_scenario(training={**TRAINING, **training}, **sections)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)
