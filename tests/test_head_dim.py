"""The attention kernel priced at its own head dim's measured rate (sim.costs.head_dim).

An H100 80GB HBM3 timed causal SDPA at head dims 64, 128 and 192 (sim/data/reference/gpu_attention_head_dims.csv,
docs/mechanisms/attention_kernels.md "Head dims other than 128"); the factor on the d-128 curve is the head dim's
rate over d 128's at the same backend, pass and seq_len. These tests recompute every measured ratio from the CSV's
median times in closed form, pin two against the doc's table, and check what must stay 1 (d 128, other GPUs).
"""

from __future__ import annotations

from dataclasses import replace
from importlib import resources

import pandas as pd
import pytest

from sim.costs.head_dim import head_dim_scale, ratio_knots
from sim.costs.models import RooflineCosts
from sim.costs.profile import default_for
from sim.hardware.gpus import GPU_PRESETS
from sim.model.attention_ops import FLASH_ATTENTION
from sim.model.flash_tiles import causal_fraction
from sim.model.layer_ops import layer_forward_ops
from sim.model.layer_shape import LayerShape
from sim.model.presets import MODEL_PRESETS

BACKENDS = {"fused": "cudnn_attention", "flash": "flash_attention"}


def measured() -> pd.DataFrame:
    return pd.read_csv(resources.files("sim").joinpath("data/reference/gpu_attention_head_dims.csv"))


def closed_form(table: pd.DataFrame, backend: str, phase: str, d: int, seq: int) -> tuple[float, float]:
    """(d's executed forward FLOPs, d's rate / d 128's) from the CSV: the forward F / t_fwd; the backward
    2F / (t_fwd_bwd - t_fwd), the profile's backward count (sim.costs.profile.AttentionCurves)."""
    def rate(dim: int) -> tuple[float, float]:
        rows = table[(table.backend == BACKENDS[backend]) & (table.head_dim == dim) & (table.seq_len == seq)]
        fwd = rows[rows.kind == "attention_fwd"].iloc[0]
        both = rows[rows.kind == "attention_fwd_bwd"].iloc[0]
        # the op's count, the curves' axis: 4 b h s^2 d x causal_fraction (the CSV's flops are 2 b h s^2 d)
        executed = fwd.flops * 2 * causal_fraction(seq)
        if phase == "forward":
            return executed, executed / fwd.median_s
        return executed, 2 * executed / (both.median_s - fwd.median_s)
    flops, rate_d = rate(d)
    return flops, rate_d / rate(128)[1]


@pytest.mark.parametrize("backend", ["fused", "flash"])
@pytest.mark.parametrize("phase", ["forward", "backward"])
@pytest.mark.parametrize("d", [64, 192])
def test_the_scale_at_each_measured_point_is_the_csv_ratio(backend, phase, d):
    table = measured()
    seqs = sorted(table.seq_len.unique())
    assert seqs == [2048, 4096, 8192, 16384]
    for seq in seqs:
        flops, ratio = closed_form(table, backend, phase, d, seq)
        assert head_dim_scale("H100-SXM", backend, phase, d, flops) == pytest.approx(ratio, rel=1e-12)
        assert head_dim_scale("H800-SXM", backend, phase, d, flops) == pytest.approx(ratio, rel=1e-12)


def test_two_ratios_against_the_docs_table():
    """cuDNN forward at s 2048: 259 / 395 TFLOP/s at d 64; FlashAttention-2 forward at s 16384: 313 / 326 at
    d 192 (docs/mechanisms/attention_kernels.md; the CSV's tflops column, 3 digits)."""
    table = measured()
    assert closed_form(table, "fused", "forward", 64, 2048)[1] == pytest.approx(258.75 / 395.49, rel=1e-4)
    at_2048 = 17179869184.0 * 17 / 16  # 2 b h s^2 d x (n+1)/n, n = 16 tiles
    assert head_dim_scale("H100-SXM", "fused", "forward", 64, at_2048) == pytest.approx(0.6542, abs=1e-4)
    assert head_dim_scale("H100-SXM", "flash", "forward", 192, 3298534883328.0 * 129 / 128) == pytest.approx(
        312.70 / 325.87, rel=1e-4)


def test_head_dim_128_and_the_other_gpus_are_unchanged():
    for backend in ("fused", "flash"):
        for phase in ("forward", "backward"):
            for flops in (1e9, 5e10, 1e12, 1e14):
                assert head_dim_scale("H100-SXM", backend, phase, 128, flops) == 1.0
                for gpu in ("H200", "B200", "A100-80GB-SXM", "GB200"):
                    assert head_dim_scale(gpu, backend, phase, 64, flops) == 1.0
    assert head_dim_scale("H100-SXM", "math", "forward", 64, 1e12) == 1.0  # no rows for PyTorch's math backend
    assert head_dim_scale("H100-SXM", "fused", "forward", 0, 1e12) == 1.0  # an op without a head dim


def test_between_and_outside_the_measured_head_dims():
    """Linear in d between 64, 128 and 192; the end's ratio outside; the end seq_len's ratio off the FLOPs range."""
    flops = 2e11  # between the knots of every head dim
    for backend in ("fused", "flash"):
        for phase in ("forward", "backward"):
            at64 = head_dim_scale("H100-SXM", backend, phase, 64, flops)
            at192 = head_dim_scale("H100-SXM", backend, phase, 192, flops)
            assert head_dim_scale("H100-SXM", backend, phase, 96, flops) == pytest.approx((at64 + 1) / 2)
            assert head_dim_scale("H100-SXM", backend, phase, 80, flops) == pytest.approx(0.75 * at64 + 0.25)
            assert head_dim_scale("H100-SXM", backend, phase, 160, flops) == pytest.approx((1 + at192) / 2)
            assert head_dim_scale("H100-SXM", backend, phase, 32, flops) == at64
            assert head_dim_scale("H100-SXM", backend, phase, 256, flops) == at192
            first, last = ratio_knots()[(backend, phase, 64)][0], ratio_knots()[(backend, phase, 64)][-1]
            assert head_dim_scale("H100-SXM", backend, phase, 64, 1e6) == first[1]
            assert head_dim_scale("H100-SXM", backend, phase, 64, 1e16) == last[1]


def flash(model: str, seq_len: int = 4096):
    ops = layer_forward_ops(LayerShape(MODEL_PRESETS[model], 1, seq_len, 1, sequence_parallel=False, elem_bytes=2,
                                       flash_attention=True, causal=True))
    return next(op for op in ops["attention"] if op.name == FLASH_ATTENTION)


def test_the_ops_carry_the_q_k_head_dim():
    """GPT-OSS 64; DeepSeek-V3's MLA its q/k head, 128 + 64 rope = 192 (its v head, 128, is not read: the rows
    timed v at 192 too); Llama 3 128."""
    assert flash("gpt-oss-120b").head_dim == 64
    assert flash("deepseek-v3").head_dim == 192
    assert flash("llama3-8b").head_dim == 128


@pytest.mark.parametrize("backend", ["fused", "flash"])
def test_the_cost_model_divides_the_curves_rate_by_the_scale_on_h100_only(backend):
    """Where the kernel is compute-bound (no floor, no factor), its time at d 64 is the same op's at d 128 over the
    scale, forward and backward; on an H200 (the same profile) it is the d-128 time."""
    op = flash("gpt-oss-120b", 8192)
    as128 = replace(op, head_dim=128)
    profile = default_for("H100-SXM")
    h100 = RooflineCosts(GPU_PRESETS["H100-SXM"], "bf16", profile, factor=1.0, attention_backend=backend)
    h200 = RooflineCosts(GPU_PRESETS["H200"], "bf16", profile, factor=1.0, attention_backend=backend)
    for phase, curve in (("forward", "forward"), ("backward", "backward"), ("input_grad", "backward")):
        scale = head_dim_scale("H100-SXM", backend, curve, 64, op.executed_flops)
        assert scale < 1
        assert h100.kernel_time(op, phase) == pytest.approx(h100.kernel_time(as128, phase) / scale, rel=1e-12)
        assert h200.kernel_time(op, phase) == h200.kernel_time(as128, phase)
