"""The loss head's logits (``training.cross_entropy``): bytes held and at the peak per logit element, the Hugging
Face upcast kernel, and that the default leaves every scenario as it was."""

from __future__ import annotations

import pytest

from sim.model.memory import LOSS_BYTES
from sim.model.presets import MODEL_PRESETS
from sim.model.vocab_ops import head_forward_ops
from sim.plan import resolve
from sim.spec.scenario import scenario_from_dict
from sim.workload.footprint import memory_plan


def plan_of(cross_entropy: str, recompute: str = "none", pp: int = 1, tp: int = 1) -> object:
    return resolve(scenario_from_dict({
        "name": "ce", "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": tp * pp},
        "model": "llama3-8b", "parallel": {"tp": tp, "pp": pp},
        "training": {"global_batch": 4, "micro_batch": 2, "seq_len": 4096, "flash_attention": True,
                     "recompute": recompute, "cross_entropy": cross_entropy}}))


def test_loss_bytes_per_logit_element() -> None:
    # HF: at log_softmax's backward nll_loss's dense fp32 gradient, the saved fp32 output and the fp32 input
    # gradient: 12 bytes per logit; Megatron: bf16 logits + their fp32 copy: 6. Llama 3 8B: vocab 128,256.
    logits = 2 * 4096 * 128_256
    assert LOSS_BYTES["hf"] == (4.0, 12.0) and LOSS_BYTES["megatron"] == (4.0, 6.0)
    assert plan_of("hf").transient_bytes(0) == pytest.approx(12 * logits)  # 12.6 GB
    assert plan_of("megatron").transient_bytes(0) == pytest.approx(6 * logits)
    assert plan_of("fused").transient_bytes(0) == 0.0
    # Split by TP (vocab-parallel logits), and only on the stage that runs the head.
    assert plan_of("hf", tp=2).transient_bytes(0) == pytest.approx(6 * logits)
    two = plan_of("hf", pp=2)
    assert two.transient_bytes(0) == 0.0 and two.transient_bytes(1) == pytest.approx(12 * logits)


def test_loss_peak_and_rebuild_do_not_add() -> None:
    # Full recomputation rebuilds a layer after the head's backward has freed the logits: the larger counts.
    plan = plan_of("hf", recompute="full")
    assert plan.transient_bytes(0) == pytest.approx(max(plan.rebuild_bytes, 12 * 2 * 4096 * 128_256))
    fused = plan_of("fused", recompute="full")
    assert fused.transient_bytes(0) == fused.rebuild_bytes
    hf_bound, fused_bound = memory_plan(plan)[0]["activations"], memory_plan(fused)[0]["activations"]
    assert hf_bound - fused_bound == pytest.approx(12 * 2 * 4096 * 128_256 - fused.rebuild_bytes)


def test_hf_upcast_kernel_bytes() -> None:
    spec = MODEL_PRESETS["llama3-8b"]
    fused = head_forward_ops(spec, 1, 4096, 1, 2)
    hf = head_forward_ops(spec, 1, 4096, 1, 2, "hf")
    assert [op.name for op in hf] == ["final_norm", "logits", "logits_upcast", "cross_entropy"]
    upcast = hf[2]
    assert upcast.flops == 0 and upcast.bytes == 4096 * 128_256 * (2 + 4)  # read bf16, write fp32
    assert hf[:2] + hf[3:] == fused


def test_default_is_the_earlier_accounting() -> None:
    # The default (fused) adds nothing: every scenario without the key has the bound it had before the knob.
    plan = plan_of("fused")
    assert plan.transient_bytes(0) == 0.0
    assert memory_plan(plan)[0]["activations"] == pytest.approx(plan.stash_bytes(0) * 32)


def test_bad_value_is_one_line() -> None:
    from sim.errors import ConfigError
    with pytest.raises(ConfigError, match="cross_entropy"):
        plan_of("apex")


def test_fused_norm_rope_overrides_fused_kernels() -> None:
    # Eager modelling code calling flash-attn's fused RMSNorm and rotary kernels: the norms one read and one
    # write, no eager rotary kernels, the rest (SwiGLU, residual adds) eager.
    from dataclasses import replace

    from sim.model.layer_ops import layer_forward_ops
    from sim.model.layer_shape import LayerShape

    shape = LayerShape(MODEL_PRESETS["llama3-8b"], 1, 1024, 1, sequence_parallel=False, elem_bytes=2,
                       flash_attention=True)
    eager = layer_forward_ops(replace(shape, fused_kernels=False))
    mixed = layer_forward_ops(replace(shape, fused_kernels=False, fused_norm_rope=True))
    fused = layer_forward_ops(replace(shape, fused_kernels=True))
    names = {block: [op.name for op in ops] for block, ops in mixed.items()}
    assert "rotary_embedding" in [op.name for op in eager["attention"]]
    assert "rotary_embedding" not in names["attention"]
    norm = next(op for op in mixed["attention"] if op.name == "input_norm")
    assert norm == next(op for op in fused["attention"] if op.name == "input_norm")
    assert norm.bytes == 1024 * 4096 * 2 * 2
    assert next(op for op in mixed["mlp"] if op.name == "mlp_activation") == next(
        op for op in eager["mlp"] if op.name == "mlp_activation")
