"""FP8 accumulation as Transformer Engine's recipe runs it (docs/mechanisms/fp8.md, 'Split accumulation'): the
forward GEMM of an FP8 linear accumulates fast (``_2X_ACC_FPROP = False``), its input- and weight-gradient GEMMs
split, partial sums promoted to FP32 (``_2X_ACC_DGRAD = _2X_ACC_WGRAD = True``, transformer_engine/pytorch/module/
base.py), which runs ``costs.fp8_split_accumulation`` times slower (1.1-1.2x, pytorch/ao#2377)."""

from __future__ import annotations

import pytest

from sim.costs.models import CalibratedCosts, RooflineCosts, Work
from sim.costs.profile import DeviceInfo, GemmCurve, Profile
from sim.hardware.gpus import GPU_PRESETS
from sim.model.layer_ops import layer_forward_ops
from sim.model.layer_shape import LayerShape
from sim.model.presets import MODEL_PRESETS
from sim.plan import resolve
from sim.workload.cost_model import make_costs

from conftest import make_scenario

H100 = GPU_PRESETS["H100-SXM"]
SPLIT = 1.15


def _mlp() -> tuple[Work, Work]:
    """Llama 2 7B's MLP at 4096 tokens: its FP8 linear GEMMs, and the block's other kernels."""
    shape = LayerShape(MODEL_PRESETS["llama2-7b"], 1, 4096, 1, sequence_parallel=False, elem_bytes=2,
                       flash_attention=True)
    ops = layer_forward_ops(shape)["mlp"]
    return Work(tuple(op for op in ops if op.te_linear), 0.0), Work(tuple(op for op in ops if not op.te_linear), 0.0)


def test_split_accumulation_slows_only_the_backward_fp8_gemms_by_the_knob() -> None:
    gemms, rest = _mlp()
    assert gemms.ops and rest.ops
    fast, split = RooflineCosts(H100, "fp8"), RooflineCosts(H100, "fp8", fp8_split_accumulation=SPLIT)
    # the forward accumulates fast: unchanged
    assert split.compute_time(gemms, "forward") == pytest.approx(fast.compute_time(gemms, "forward"), rel=1e-12)
    # input gradient (dgrad) and weight gradient (wgrad) each 1.15x; the fused backward is both
    for phase in ("input_grad", "weight_grad", "backward"):
        assert split.compute_time(gemms, phase) == pytest.approx(SPLIT * fast.compute_time(gemms, phase), rel=1e-12)
    assert split.compute_time(gemms, "backward") == pytest.approx(2 * SPLIT * fast.compute_time(gemms, "forward"),
                                                                  rel=1e-12)
    # kernels that are not FP8 GEMMs (activation, norms, the casts) are untouched in every pass
    for phase in ("forward", "input_grad", "weight_grad", "backward"):
        assert split.compute_time(rest, phase) == pytest.approx(fast.compute_time(rest, phase), rel=1e-12)


def test_bf16_gemms_have_no_fp8_accumulation_to_pay() -> None:
    gemms, _ = _mlp()
    plain, knob = RooflineCosts(H100, "bf16"), RooflineCosts(H100, "bf16", fp8_split_accumulation=SPLIT)
    for phase in ("forward", "backward"):
        assert knob.compute_time(gemms, phase) == plain.compute_time(gemms, phase)


def test_a_measured_fp8_curve_is_split_accumulation_so_the_forward_runs_faster() -> None:
    """sim calibrate measures FP8 with torch._scaled_mm, whose use_fast_accum defaults to False: the measured curve
    is the backward's rate, and the forward (fast) runs at curve time / 1.15."""
    curve = GemmCurve(rate=((1e9, 400e12), (1e13, 1200e12)), peak_flops=H100.peak("fp8"))
    bf16 = GemmCurve(rate=((1e9, 300e12), (1e13, 700e12)), peak_flops=H100.peak("bf16"))
    profile = Profile(device=DeviceInfo(kind="cuda", name="test"), gemm={"fp8": curve, "bf16": bf16})
    gemms, _ = _mlp()
    as_measured = CalibratedCosts(H100, "fp8", profile)
    split = CalibratedCosts(H100, "fp8", profile, fp8_split_accumulation=SPLIT)
    assert split.compute_time(gemms, "forward") == pytest.approx(as_measured.compute_time(gemms, "forward") / SPLIT,
                                                                 rel=1e-12)
    assert split.compute_time(gemms, "backward") == pytest.approx(as_measured.compute_time(gemms, "backward"),
                                                                  rel=1e-12)


def test_the_knob_defaults_to_1_15_and_reaches_the_cost_model() -> None:
    cluster = {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8}
    training = {"global_batch": 8, "micro_batch": 1, "seq_len": 512, "dtype": "fp8"}
    default = make_costs(resolve(make_scenario(cluster=cluster, training=training)))
    off = make_costs(resolve(make_scenario(cluster=cluster, training=training,
                                           costs={"model": "roofline", "fp8_split_accumulation": 1.0})))
    assert isinstance(default, RooflineCosts) and default.fp8_split_accumulation == SPLIT
    assert isinstance(off, RooflineCosts) and off.fp8_accumulation_scale("weight_grad") == 1.0
    assert default.fp8_accumulation_scale("forward") == 1.0 and default.fp8_accumulation_scale("input_grad") == SPLIT


# ------------------------------------------------------------------------------------ delayed vs current scaling
from sim.model.fp8_casts import AMAX_SCAN_BYTES, NORM_FUSED_LINEAR, Fp8Casts, fp8_cast_ops  # noqa: E402
from sim.workload.blocks import fp8_casts  # noqa: E402


@pytest.mark.parametrize("sp", [False, True])
def test_current_scaling_adds_one_bf16_read_per_cast_tensor(sp: bool) -> None:
    """Current scaling scans each bf16 tensor for its amax before casting it (TE Float8CurrentScalingQuantizer,
    torchao tensor_to_amax): 2 bytes per element of the input (not of a norm-fused one, quantized in the norm), of
    the weight (as often as it is cast) and of the output gradient (the local shard for a row-parallel linear
    under sequence parallelism), in the pass of the cast."""
    tp, m = 2, 4
    ops = layer_forward_ops(LayerShape(MODEL_PRESETS["llama2-7b"], 1, 4096, tp, sequence_parallel=sp, elem_bytes=2,
                                       flash_attention=True))
    gemms = [op for block in ops.values() for op in block if op.te_linear]
    assert {op.name for op in gemms} >= NORM_FUSED_LINEAR
    for op in gemms:
        delayed = fp8_cast_ops(op, tp, sp, Fp8Casts(1.0 / m))
        current = fp8_cast_ops(op, tp, sp, Fp8Casts(1.0 / m, current_scaling=True))
        assert current[:len(delayed)] == delayed
        scans = {o.name.rsplit("_", 2)[-2]: o for o in current[len(delayed):]}
        batch, tokens, n, k = op.shape  # type: ignore[misc]
        assert ("input" in scans) == (op.name not in NORM_FUSED_LINEAR)
        if "input" in scans:
            assert scans["input"].bytes == tokens * k * AMAX_SCAN_BYTES and scans["input"].runs_in == "forward"
        assert scans["weight"].bytes == pytest.approx(k * n * AMAX_SCAN_BYTES / m) and scans["weight"].runs_in == \
            "forward"
        shard = tp if (sp and op.name in ("out_proj", "mlp_down")) else 1
        assert scans["grad"].bytes == tokens * n / shard * AMAX_SCAN_BYTES and scans["grad"].runs_in == "input_grad"


def test_the_recipe_knob_reaches_the_casts() -> None:
    cluster = {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8}
    training = {"global_batch": 8, "micro_batch": 1, "seq_len": 512, "dtype": "fp8"}
    delayed = fp8_casts(resolve(make_scenario(cluster=cluster, training=training)))
    current = fp8_casts(resolve(make_scenario(cluster=cluster, training={**training, "fp8_recipe": "current"})))
    assert delayed is not None and not delayed.current_scaling
    assert current is not None and current.current_scaling
