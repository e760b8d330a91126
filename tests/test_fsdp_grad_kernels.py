"""FSDP1's per-micro-batch gradient kernels (docs/mechanisms/fsdp_grad_kernels.md): the copy of a unit's parameter
gradients into its flat gradient (split_with_sizes' backward), the cast to the reduce dtype, the pre-division by
DefaultState._get_gradient_predivide_factor, each a memory-bound pass over the unit's gradient elements in the
backward; none under FSDP2, DDP, or FSDP reduced once per step under pipeline parallelism."""

from __future__ import annotations

import pytest

from sim.costs.models import RooflineCosts, phase_scale
from sim.model.params import layer_params
from sim.plan import resolve
from sim.workload.blocks import blocks
from sim.workload.cost_model import make_costs
from sim.workload.fsdp_units import fsdp_predivide_factor

from conftest import make_scenario

FSDP_NAMES = ("fsdp_grad_flatten", "fsdp_grad_cast", "fsdp_grad_predivide")


@pytest.mark.parametrize("world, factor", [(1, 1), (2, 2), (4, 2), (8, 4), (16, 4), (64, 8), (96, 16), (128, 16),
                                           (512, 32)])
def test_predivide_factor_follows_pytorch(world: int, factor: int) -> None:
    """The doubling loop of torch's DefaultState._get_gradient_predivide_factor: f doubles while world % f == 0
    and world / f > f (8 -> 4, FSDP divides by 4 before the reduce-scatter and by 2 after)."""
    assert fsdp_predivide_factor(world) == factor


def _fsdp_ops(**sections: object) -> dict[str, float]:
    plan = resolve(make_scenario(**sections))
    return {op.name: op.bytes for work in blocks(plan).block.values() for op in work.ops if op.name in FSDP_NAMES}


def _weights(**sections: object) -> float:
    """A layer's GEMM weight elements (no gated MLP: attention 4 h^2 + MLP 8 h^2 = 12 h^2)."""
    plan = resolve(make_scenario(**sections))
    return 12.0 * plan.model.hidden_size ** 2


def test_bytes_per_weight_element_with_an_fp32_reduce() -> None:
    """Composer's mixed precision DEFAULT (param bf16, reduce fp32): flatten 2 x 2 B, cast 2 + 4 B, pre-divide
    2 x 4 B per gradient element of the layer's two blocks together."""
    sections = {"fsdp": {"sharding": "FULL_SHARD"}, "training": {"global_batch": 8, "micro_batch": 1,
                                                                  "seq_len": 512, "grad_dtype": "fp32"}}
    ops = _fsdp_ops(**sections)
    w = _weights(**sections)
    plan = resolve(make_scenario(**sections))
    assert sum(op.has_weights and op.shape is not None for b in blocks(plan).block.values() for op in b.ops) == 4
    by_name: dict[str, float] = {}
    for work in blocks(plan).block.values():
        for op in work.ops:
            if op.name in FSDP_NAMES:
                by_name[op.name] = by_name.get(op.name, 0.0) + op.bytes
    assert set(ops) == set(FSDP_NAMES)
    assert by_name["fsdp_grad_flatten"] == pytest.approx(4 * w, rel=1e-12)
    assert by_name["fsdp_grad_cast"] == pytest.approx(6 * w, rel=1e-12)
    assert by_name["fsdp_grad_predivide"] == pytest.approx(8 * w, rel=1e-12)
    # the GEMM weights are the layer's parameters less its biases and norm weights (left out: 0.1% here)
    assert w == pytest.approx(layer_params(plan.model).sharded, rel=2e-3)


def test_a_bf16_reduce_has_no_cast_and_divides_in_bf16() -> None:
    plan = resolve(make_scenario(fsdp={"sharding": "FULL_SHARD"}))
    assert plan.grad_bytes_per_param == 2
    w = _weights(fsdp={"sharding": "FULL_SHARD"})
    total = {name: 0.0 for name in FSDP_NAMES}
    for work in blocks(plan).block.values():
        for op in work.ops:
            if op.name in FSDP_NAMES:
                total[op.name] += op.bytes
    assert total == pytest.approx({"fsdp_grad_flatten": 4 * w, "fsdp_grad_cast": 0.0, "fsdp_grad_predivide": 4 * w})


def test_they_run_in_the_backward_only() -> None:
    plan = resolve(make_scenario(fsdp={"sharding": "FULL_SHARD"}))
    ops = [op for work in blocks(plan).block.values() for op in work.ops if op.name in FSDP_NAMES]
    assert ops
    for op in ops:
        assert phase_scale(op, "forward") == 0 and phase_scale(op, "input_grad") == 0
        assert phase_scale(op, "weight_grad") == 1 and phase_scale(op, "backward") == 1


def test_they_add_their_memory_time_to_each_layers_backward() -> None:
    with_fsdp1 = resolve(make_scenario(fsdp={"sharding": "FULL_SHARD"}, costs={"model": "roofline",
                                                                                 "kernel_floor": 0.0}))
    fsdp2 = resolve(make_scenario(fsdp={"sharding": "FULL_SHARD", "version": 2}, costs={"model": "roofline",
                                                                                         "kernel_floor": 0.0}))
    costs = make_costs(with_fsdp1)
    assert isinstance(costs, RooflineCosts)
    w = _weights(fsdp={"sharding": "FULL_SHARD"})
    extra = sum(costs.compute_time(work, "backward") for work in blocks(with_fsdp1).block.values()) - \
        sum(costs.compute_time(work, "backward") for work in blocks(fsdp2).block.values())
    assert extra == pytest.approx(8 * w / costs.bytes_rate * costs.factor, rel=1e-9)
    for phase in ("forward", "input_grad"):
        assert sum(costs.compute_time(work, phase) for work in blocks(with_fsdp1).block.values()) == \
            pytest.approx(sum(costs.compute_time(work, phase) for work in blocks(fsdp2).block.values()), rel=1e-12)


@pytest.mark.parametrize("sections", [
    {"fsdp": {"sharding": "FULL_SHARD", "version": 2}},  # FSDP2: per-parameter sharding
    {},  # DDP
    {"parallel": {"tp": 1, "pp": 2, "dp": 4}, "fsdp": {"sharding": "FULL_SHARD"}},  # reduced once per step
])
def test_none_without_fsdp1_per_micro_batch_reduction(sections: dict[str, object]) -> None:
    assert _fsdp_ops(**sections) == {}
