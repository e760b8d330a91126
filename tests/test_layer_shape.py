"""The record every layer op builder reads (sim.model.layer_shape.LayerShape): what it derives once, and that the
Plan's one builder of it (sim.workload.blocks.layer_shape) carries the scenario's shape and kernel options."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace

import pytest

from sim.model.fp8_casts import Fp8Casts
from sim.model.layer_shape import LayerShape
from sim.model.moe_ops import moe_forward_ops
from sim.model.ops import EAGER_RMSNORM_KERNELS
from sim.model.presets import MODEL_PRESETS
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload.blocks import fp8_casts, layer_shape

from conftest import SCENARIOS

LLAMA = MODEL_PRESETS["llama3-8b"]  # RMSNorm, RoPE, hidden 4096
GPT = MODEL_PRESETS["gpt3-13b"]  # LayerNorm, hidden 5120


def test_tokens_and_the_tokens_each_tp_rank_repeats() -> None:
    """b x s tokens feed the GEMMs; the norms and residuals run on b*s/tp per rank under sequence parallelism and
    on all b*s without (Korthikanti et al. 2022 Sec. 4.2.2)."""
    shape = LayerShape(LLAMA, 2, 4096, 8, sequence_parallel=True, elem_bytes=2, flash_attention=True)
    assert shape.tokens == 8192
    assert shape.replicated_tokens == 1024.0
    assert replace(shape, sequence_parallel=False).replicated_tokens == 8192


@pytest.mark.parametrize("fused_kernels, fused_norm_rope, fused", [
    (True, None, True), (False, None, False), (False, True, True), (True, False, False)])
def test_fused_norm_rope_overrides_fused_kernels_where_given(fused_kernels: bool, fused_norm_rope: bool | None,
                                                             fused: bool) -> None:
    """The norm of 1024 tokens x 4096: one read and one write when fused; eager RMSNorm's eight kernels otherwise,
    and eager LayerNorm is still one ATen kernel (one read, one write)."""
    shape = LayerShape(LLAMA, 1, 1024, 1, sequence_parallel=False, elem_bytes=2, flash_attention=True,
                       fused_kernels=fused_kernels, fused_norm_rope=fused_norm_rope)
    assert shape.norm_rope_fused is fused
    rms = shape.norm("input_norm", 1024 * 4096, 2, reads=1, writes=1)
    assert rms.kernels == (1 if fused else EAGER_RMSNORM_KERNELS)
    layernorm = replace(shape, spec=GPT).norm("input_norm", 1024 * 5120, 2, reads=1, writes=1)
    assert layernorm.kernels == 1 and layernorm.bytes == 1024 * 5120 * 2 * 2


def test_the_moe_builder_reads_only_the_shape_its_kernels_depend_on() -> None:
    """The MoE MLP's kernels are Megatron-Core's fused ones whatever the dense layer's kernel options say."""
    shape = LayerShape(MODEL_PRESETS["mixtral-8x7b"], 1, 4096, 2, sequence_parallel=True, elem_bytes=2,
                       flash_attention=True)
    blocks = moe_forward_ops(shape, 1, 4, 4 * 2048.0)
    other = replace(shape, flash_attention=False, fused_kernels=False, causal=True, fused_norm_rope=False)
    assert moe_forward_ops(other, 1, 4, 4 * 2048.0) == blocks
    assert blocks["moe_router"][0].bytes == 2048 * 4096 * 2 * 2  # post-attention norm on b*s/tp tokens, one pass


def test_the_plan_builds_one_shape_with_its_context_parallel_tokens_and_kernel_options() -> None:
    """Llama 3.1 405B at 128k tokens with cp 16: each rank's 8192 tokens per sequence; the training section's
    kernel options and, in FP8 with the weight cache, one weight cast per layer over the 16 micro-batches."""
    plan = resolve(load_scenario(SCENARIOS / "llama3.1-405b_h100-16384_cp16-128k.yaml", ["training.dtype=fp8"]))
    shape = layer_shape(plan)
    t = plan.scenario.training
    assert (plan.seq_len, plan.cp) == (131072, 16) and shape.seq_len == 8192
    assert (shape.spec, shape.micro_batch, shape.tp, shape.sequence_parallel, shape.elem_bytes) == (
        plan.model, plan.micro_batch, plan.tp, plan.sequence_parallel, plan.elem_bytes)
    assert (shape.flash_attention, shape.fused_kernels, shape.causal, shape.fused_norm_rope) == (
        t.flash_attention, t.fused_kernels, t.causal_attention, t.fused_norm_rope)
    assert shape.fp8_casts == fp8_casts(plan) == Fp8Casts(weight_casts_per_microbatch=1 / 16)
    assert plan.microbatches == 16
    with pytest.raises(FrozenInstanceError):
        shape.tp = 1  # type: ignore[misc]
