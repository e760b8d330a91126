"""FP8 as Transformer Engine runs it: fp8_autocast makes the linear layers' GEMMs FP8, the attention core stays
bf16 unless Megatron-LM's --fp8-dot-product-attention (``training.fp8_attention``); the parameters and their
gradients stay bf16 (tests/test_grad_dtype.py)."""

from __future__ import annotations

import pytest

from sim.costs.models import RooflineCosts, Work
from sim.hardware import GPU_PRESETS
from sim.model.transformer import ATTENTION_CORE, MODEL_PRESETS, layer_forward_ops
from sim.plan import resolve
from sim.workload.step import make_costs

from conftest import make_scenario

H100 = GPU_PRESETS["H100-SXM"]


@pytest.mark.parametrize("flash", [False, True])
def test_fp8_runs_the_linear_gemms_in_fp8_and_the_attention_core_in_bf16(flash: bool) -> None:
    spec = MODEL_PRESETS["llama2-7b"]  # GEMMs large enough to be compute-bound at FP8's peak
    ops = layer_forward_ops(spec, 1, 4096, 1, False, 2, flash, True)
    core = Work(tuple(op for op in ops["attention"] if op.name in ATTENTION_CORE), 0.0)
    linear = Work(tuple(op for op in ops["mlp"] if op.has_weights), 0.0)
    fp8, bf16 = RooflineCosts(H100, "fp8"), RooflineCosts(H100, "bf16")
    fp8_dpa = RooflineCosts(H100, "fp8", fp8_attention=True)
    assert fp8.compute_time(core, "forward") == pytest.approx(bf16.compute_time(core, "forward"))
    assert fp8.compute_time(linear, "forward") == pytest.approx(fp8_dpa.compute_time(linear, "forward"))
    # FP8's dense peak is twice bf16's on H100 (1979 vs 989 TFLOP/s): the linear GEMMs gain, the core does not
    assert fp8.compute_time(linear, "forward") < 0.75 * bf16.compute_time(linear, "forward")
    # FP8 attention gains where the core is compute-bound (flash attention; unfused, the s x s scores through HBM
    # bound it either way)
    if flash:
        assert fp8_dpa.compute_time(core, "forward") < 0.75 * fp8.compute_time(core, "forward")
    else:
        assert fp8_dpa.compute_time(core, "forward") == pytest.approx(fp8.compute_time(core, "forward"))


def test_the_scenario_knob_reaches_the_cost_model() -> None:
    cluster = {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8}
    training = {"global_batch": 8, "micro_batch": 1, "seq_len": 512, "dtype": "fp8"}
    default = make_costs(resolve(make_scenario(cluster=cluster, training=training)))
    dpa = make_costs(resolve(make_scenario(cluster=cluster, training={**training, "fp8_attention": True})))
    assert isinstance(default, RooflineCosts) and default.weightless is not None
    assert isinstance(dpa, RooflineCosts) and dpa.weightless is None
