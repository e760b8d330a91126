"""The validation set (issue 8): every published run in ``scenarios/validation/published.csv`` against its
simulation. A row fails past 10% iteration-time error; over the validation rows the mean absolute error must
stay under 5% and the signed mean within +-2% (issue 22). Rows the model does not yet reach are strict xfails
that name the gap: they fail the suite the day they come inside the band, so the marker has to go.

Calibration (one end-to-end factor per GPU type, docs/mechanisms/end_to_end_calibration.md): A100's is fitted
on Korthikanti et al. 2022 Table 4's layer times, never on these iteration times; H100's on the four rows marked
``fit`` in published.csv, which every statistic here leaves out.
"""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest

from sim.cli import commands as cli
from sim.validation.validate import error_stats, published, run_validation

from conftest import SCENARIOS

FOLDER = SCENARIOS / "validation"
ROWS = list(published(FOLDER)["scenario"])
# Rows still outside the 10% band after issue 22's mechanisms and the per-GPU-type calibration (signed error,
# predicted / published - 1), each with what the evidence says; strict, so a row that comes inside says so.
_IBM_70B_A100 = ("predicted too slow (+10.2%): the IBM FSDP A100 rows rise with model size (7B -2.8%, 13B -0.6%, 34B "
                 "+4.7%, 70B +10.2%); every IBM row moved +3..+4% when eager RMSNorm was priced at its measured 52 "
                 "bytes per element (sim/model/ops.py EAGER_RMSNORM_BYTES, tests/test_eager_kernels.py), the 70B from "
                 "+8.1%; the H100 70B row of the same code is +4.9%")
OUTSIDE: dict[str, str] = {
    "ibm-fsdp-llama2-70b-a100-128.yaml": _IBM_70B_A100,
}


# The table simulates all 74 scenarios (about 50 s), once per module: every test that reads it is marked slow,
# and under pytest-xdist (--dist loadgroup) this module's tests all go to one worker, so it is built once per run.
pytestmark = pytest.mark.xdist_group("validation")


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return run_validation(FOLDER).set_index("scenario")


@pytest.mark.slow
def test_every_scenario_file_has_a_published_row_and_runs(table: pd.DataFrame) -> None:
    files = {path.name for path in FOLDER.glob("*.yaml")}
    assert files == set(ROWS)
    assert (table["error"] == "").all()


@pytest.mark.slow
@pytest.mark.parametrize("scenario", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=OUTSIDE[name])) if name in OUTSIDE else name
    for name in ROWS])
def test_iteration_time_within_10_percent(table: pd.DataFrame, scenario: str) -> None:
    row = table.loc[scenario]
    assert row["predicted_iteration_time_s"] == pytest.approx(row["published_iteration_time_s"], rel=0.10)


def test_mfu_at_most_hfu_at_most_one_and_a_finite_step(table: pd.DataFrame) -> None:
    """Issue 27's trace invariant on every validation scenario: model FLOPs never exceed the executed FLOPs, which
    never exceed the GPU's peak, and the step is a finite positive time. Model FLOPs with causal attention's
    s(s+1)/2 pairs where it is causal (the executed FLOPs count a causal flash kernel's tiles, Op.executed_flops)."""
    model = table["predicted_mfu_causal"].fillna(table["predicted_mfu"])
    assert (model <= table["predicted_hfu"] * (1 + 1e-12)).all()
    assert (table["predicted_hfu"] <= 1).all()
    assert np.isfinite(table["predicted_iteration_time_s"]).all() and (table["predicted_iteration_time_s"] > 0).all()


@pytest.mark.slow
def test_mean_absolute_error_under_5_percent(table: pd.DataFrame) -> None:
    """Issue 22: 4.96% over the 72 validation rows since attention kernels and eager RMSNorm run at their measured
    rates (5.87% before; docs/mechanisms/attention_kernels.md)."""
    assert error_stats(table.reset_index())["mean_abs"] <= 0.05  # validation rows only: fit rows are left out


@pytest.mark.slow
def test_no_systematic_optimism(table: pd.DataFrame) -> None:
    """Issue 22 must-show 1: the signed mean error within +-2% (the first version predicted too short a step on
    41 of 42 blind runs): -1.7% now (-2.8% before the measured attention and RMSNorm kernels)."""
    assert abs(error_stats(table.reset_index())["signed_mean"]) <= 0.02


@pytest.mark.slow
def test_fit_rows_are_the_h100_calibration_rows(table: pd.DataFrame) -> None:
    """The only rows marked fit are the four NeMo 24.07 runs without pipeline parallelism that H100's end-to-end
    factor is fitted on (Megatron-family measurements, as A100's Korthikanti Table 4); the profile names them
    (scripts/fit_default_profiles.py)."""
    from sim.costs.profile import default_for

    fit = sorted(table.index[table["role"] == "fit"])
    assert fit == sorted(["nemo2407-llama2-7b-8.yaml", "nemo2407-gpt3-5b-64.yaml", "nemo2407-gpt3-20b-64.yaml",
                          "nemo2407-nemotron-8b-64.yaml"])
    source = default_for("H100-SXM").end_to_end_source  # type: ignore[union-attr]
    assert all(name in source for name in fit)


@pytest.mark.slow
def test_megatron_rows_mean_absolute_error_under_5_percent(table: pd.DataFrame) -> None:
    megatron = table[table["group"].str.startswith("Megatron")]
    assert len(megatron) == 9
    assert megatron["iteration_time_error"].abs().mean() <= 0.05


@pytest.mark.slow
def test_a100_fsdp_rows_mean_absolute_error_under_5_percent(table: pd.DataFrame) -> None:
    a100 = table[table["group"].str.startswith("PyTorch FSDP") & (table["gpu"] == "A100-80GB-SXM")]
    assert len(a100) == 4
    assert a100["iteration_time_error"].abs().mean() <= 0.05


@pytest.mark.slow
def test_peak_memory_within_5_percent_where_published(table: pd.DataFrame) -> None:
    with_memory = table[table["published_peak_memory_gb"].notna()]
    assert len(with_memory) == 36  # Qi et al. 2024 Tables 3 + 4
    assert (with_memory["memory_error"].abs() <= 0.05).all(), with_memory["memory_error"].abs().max()


@pytest.mark.slow
def test_zero_bubble_speedups_over_1f1b_within_10_percent(table: pd.DataFrame) -> None:
    """The schedules' relative throughput, which the per-layer cost gap above cancels out of."""
    qi = table[table["group"].str.startswith("Zero bubble")]
    pairs = 0
    for name, row in qi.iterrows():
        if "-1f1b-" in name:
            continue
        base = qi.loc[name.replace("-zb-1p-", "-1f1b-").replace("-zb-2p-", "-1f1b-")]
        published = base["published_iteration_time_s"] / row["published_iteration_time_s"]
        predicted = base["predicted_iteration_time_s"] / row["predicted_iteration_time_s"]
        assert predicted == pytest.approx(published, rel=0.10), name
        pairs += 1
    assert pairs == 24


def test_cli_prints_the_table_and_writes_the_report(tmp_path, capsys) -> None:
    assert cli.main(["validate", str(FOLDER), "--only", "korthikanti-22b-full-recompute.yaml", "-o",
                     str(tmp_path)]) == 0
    assert "korthikanti-22b" in capsys.readouterr().out
    written = pd.read_csv(tmp_path / "validation.csv")
    assert len(written) == 1 and abs(written["iteration_time_error"].iloc[0]) < 0.10
    assert (tmp_path / "parity.png").stat().st_size > 0 and "| korthikanti" in (tmp_path / "validation.md").read_text()


def test_a_failing_scenario_keeps_its_row_and_exits_non_zero(tmp_path, capsys) -> None:
    shutil.copy(FOLDER / "korthikanti-22b-full-recompute.yaml", tmp_path)
    rows = published(FOLDER).head(1)
    broken = rows.assign(scenario="missing.yaml")
    pd.concat([rows, broken]).to_csv(tmp_path / "published.csv", index=False)
    table = run_validation(tmp_path)
    assert list(table["error"] == "") == [True, False] and "missing.yaml" in table["error"].iloc[1]
    assert cli.main(["validate", str(tmp_path)]) == 1


def test_a_folder_without_published_rows_is_a_one_line_error(tmp_path, capsys) -> None:
    assert cli.main(["validate", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().startswith("error: validate: no published.csv")
