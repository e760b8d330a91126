"""The shipped GEMM profiles against OpenXLA's measured tables (analysis.gemm_report), and their fit."""

import subprocess
import sys
from pathlib import Path

import pytest

from analysis.gemm_report import large, report, to_markdown
from sim.costs import RooflineCosts
from sim.hardware import GPU_PRESETS
from sim.profile import default_for

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


def test_shipped_profiles_are_a_fresh_fit_of_the_shipped_rows():
    done = subprocess.run([sys.executable, "scripts/fit_default_profiles.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
