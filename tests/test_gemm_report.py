"""The shipped GEMM profiles against OpenXLA's measured tables (analysis.gemm_report), and their fit."""

import subprocess
import sys
from pathlib import Path

import pytest

from analysis.gemm_report import large, report, to_markdown
from sim.costs.models import RooflineCosts
from sim.costs.profile import default_for
from sim.hardware.gpus import GPU_PRESETS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def table():
    return report()


def test_h100_profile_predicts_transformer_sized_bf16_gemms_within_10_percent_median(table):
    big = large(table, "H100-SXM", "bf16")
    assert len(big) == 81  # m, n, k in {1024, 2048, 4096} and b in {1, 2, 4}: 3**4 GEMMs
    assert big["error"].abs().median() < 0.10
    assert large(table, "B200", "bf16")["error"].abs().median() < 0.10
    assert "| H100-SXM | bf16 | 81 |" in to_markdown(table)


def test_the_profile_curve_slows_small_gemms_and_reaches_mamf_on_large_ones():
    h100 = GPU_PRESETS["H100-SXM"]
    costs = RooflineCosts(h100, "bf16", default_for("H100-SXM"))
    assert costs.gemm_rate(2 * 256**3) < 0.05 * h100.peak("bf16")  # a 256^3 GEMM is launch-bound
    assert costs.gemm_rate(2 * 8192**3) == pytest.approx(h100.peak("bf16") * h100.matmul_efficiency, rel=0.02)
    # H200 shares GH100's tensor cores: the H100 profile, scaled by the (equal) peak.
    assert RooflineCosts(GPU_PRESETS["H200"], "bf16", default_for("H200")).gemm_rate(1e10) == costs.gemm_rate(1e10)


def test_fp16_is_priced_on_the_bf16_curve_where_the_peaks_are_equal():
    # The shipped A100 profile measured bf16 only; fp16 runs on the same tensor cores at the same 312 TFLOP/s.
    a100 = GPU_PRESETS["A100-80GB-SXM"]
    profile = default_for("A100-80GB-SXM")
    assert "fp16" not in profile.gemm
    bf16, fp16 = RooflineCosts(a100, "bf16", profile), RooflineCosts(a100, "fp16", profile)
    for flops in (2 * 1024**3, 2 * 6144 * 6912 * 2304, 2 * 8192**3):
        assert fp16.gemm_rate(flops) == bf16.gemm_rate(flops)
    assert fp16.bytes_rate == bf16.bytes_rate == a100.hbm_bandwidth * a100.memory_efficiency
    # With A100's end-to-end factor (1.23) the curve tops out at 71% of peak, not the flat large-GEMM rate fp16
    # used to fall back to (87%, and no factor).
    assert profile.end_to_end_factor == pytest.approx(1.23)
    assert fp16.factor == bf16.factor == profile.end_to_end_factor
    assert fp16.gemm_rate(2 * 8192**3) / fp16.factor == pytest.approx(0.711 * 312e12, rel=0.01)
    # Where the two peaks differ there is no shared curve: the flat rate of the preset stays.
    uneven = a100.model_copy(update={"peak_flops": {**a100.peak_flops, "fp16": 624e12}})
    assert RooflineCosts(uneven, "fp16", profile).gemm_rate(1e12) == 624e12 * a100.matmul_efficiency


@pytest.mark.parametrize("gpu", sorted(GPU_PRESETS))
def test_no_dtype_is_priced_above_its_dense_peak(gpu):
    # XLA's f32 rows ran as TF32 (403 TFLOP/s on H100, 6x the 67 of fp32) and its sm_90 fp8 rows beat the
    # 1,979 TFLOP/s fp8 peak; neither may price a dtype above what the GPU can do.
    spec = GPU_PRESETS[gpu]
    for dtype, peak in spec.peak_flops.items():
        costs = RooflineCosts(spec, dtype, default_for(gpu))
        assert max(costs.gemm_rate(2.0 ** e) for e in range(20, 44)) <= peak, dtype
    fp32 = RooflineCosts(spec, "fp32", default_for(gpu))
    assert fp32.gemm_rate(2 * 8192**3) == pytest.approx(spec.peak("fp32") * spec.matmul_efficiency)


@pytest.mark.slow
def test_shipped_profiles_are_a_fresh_fit_of_the_shipped_rows():
    done = subprocess.run([sys.executable, "scripts/fit_default_profiles.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_skinny_gemms_sit_on_the_flops_curve():
    """docs/mechanisms/gemm_shape.md: on OpenXLA's H100 bf16 rows of training size (>= 2^34 FLOPs), the GEMMs with a
    small inner or outer dimension (m >= 4096, n or k <= 1024: a TP-split layer's shape) run within 10% of the
    FLOPs-only curve (worst: k = 512 at 0.917; the fastest 1.100), so the cost model has no shape term."""
    from sim.calibrate import reference

    rows = reference.xla_gemms()
    rows = rows[(rows["platform"] == "sm_90") & (rows["dtype"] == "bf16") & (rows["b"] == 1) & (rows["flops"] >= 2**34)]
    skinny = rows[(rows["m"] >= 4096) & ((rows["n"] <= 1024) | (rows["k"] <= 1024))]
    profile = default_for("H100-SXM")
    ratio = [measured / profile.gemm_rate("bf16", flops) for flops, measured in zip(skinny["flops"],
                                                                                    skinny["flops_per_s"], strict=True)]
    assert len(ratio) == 6 and min(ratio) == pytest.approx(0.917, abs=0.001) and max(ratio) < 1.11
