"""The per-GPU-type end-to-end calibration (issue 22): one factor on every kernel's time, carried by the GPU's
default profile, fitted by scripts/fit_default_profiles.py on named rows and overridable per scenario."""

from __future__ import annotations

import pandas as pd
import pytest

from sim import runner
from sim.costs.models import RooflineCosts
from sim.costs.profile import default_for
from sim.hardware.gpus import GPU_PRESETS
from sim.model.ops import Op
from sim.plan import Plan
from sim.spec.scenario import scenario_from_dict
from sim.validation.validate import error_stats
from sim.workload.cost_model import make_costs

ONE_GPU = {"name": "one-gpu", "cluster": {"gpu": "A100-80GB-SXM", "nodes": 1, "gpus_per_node": 1},
           "model": "gpt3-1.3b", "training": {"microbatches": 2, "micro_batch": 1, "seq_len": 1024},
           "parallel": {"tp": 1, "pp": 1, "dp": 1}}


def _step(costs: dict[str, object] | None = None) -> float:
    data = {**ONE_GPU, "costs": costs} if costs else ONE_GPU
    return runner.run(scenario_from_dict(data)).summary.step_time_s


def test_every_kernel_and_the_optimizer_scale_by_the_factor() -> None:
    gpu, profile = GPU_PRESETS["A100-80GB-SXM"], default_for("A100-80GB-SXM")
    plain, doubled = RooflineCosts(gpu, "bf16", profile, factor=1.0), RooflineCosts(gpu, "bf16", profile, factor=2.0)
    gemm = Op("gemm", 2 * 4096.0**3, 3 * 2 * 4096.0**2, True, True)
    copy = Op("copy", 0.0, 1e9, False)
    assert doubled.kernel_time(gemm) == pytest.approx(2 * plain.kernel_time(gemm), rel=1e-12)
    assert doubled.kernel_time(copy) == pytest.approx(2 * 1e9 / (gpu.hbm_bandwidth * gpu.memory_efficiency))
    assert doubled.optimizer_time(1e9) == pytest.approx(2 * plain.optimizer_time(1e9), rel=1e-12)


def test_the_default_is_the_gpu_types_fitted_factor_and_the_scenario_overrides_it() -> None:
    assert default_for("A100-80GB-SXM").end_to_end_factor == pytest.approx(1.23)  # Korthikanti Table 4 fit
    assert "Korthikanti" in default_for("A100-80GB-SXM").end_to_end_source
    scenario = scenario_from_dict(ONE_GPU)
    assert make_costs(Plan(scenario)).factor == pytest.approx(1.23)  # type: ignore[attr-defined]
    flat = scenario_from_dict({**ONE_GPU, "costs": {"model": "roofline", "shape_efficiency": False}})
    assert make_costs(Plan(flat)).factor == pytest.approx(1.23)  # type: ignore[attr-defined]  # flat rate too
    # One GPU, no communication and no launch floors: the whole step is kernel time, so it scales exactly with
    # the factor.
    no_floor = {"model": "roofline", "kernel_floor": 0, "launch_overhead": 0}
    assert _step({**no_floor, "end_to_end_factor": 2.46}) == pytest.approx(2 * _step(no_floor), rel=1e-9)
    assert _step({**no_floor, "end_to_end_factor": 1.0}) == pytest.approx(_step(no_floor) / 1.23, rel=1e-9)


def test_a_non_positive_factor_is_a_one_line_error() -> None:
    from sim.errors import ConfigError
    with pytest.raises(ConfigError, match="end_to_end_factor"):
        scenario_from_dict({**ONE_GPU, "costs": {"model": "roofline", "end_to_end_factor": 0}})


def test_error_stats_leave_fit_rows_out_and_report_the_sign() -> None:
    table = pd.DataFrame({"group": ["a", "a", "b", "b"], "role": ["validation", "validation", "validation", "fit"],
                          "iteration_time_error": [-0.10, 0.04, -0.02, -0.50]})
    stats = error_stats(table)
    assert stats["rows"] == 3
    assert stats["mean_abs"] == pytest.approx(0.16 / 3)
    assert stats["max_abs"] == pytest.approx(0.10)
    assert stats["signed_mean"] == pytest.approx(-0.08 / 3)
    assert stats["optimistic_share"] == pytest.approx(2 / 3)
    assert stats["b: mean_abs"] == pytest.approx(0.02)
