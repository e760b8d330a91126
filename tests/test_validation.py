"""The validation set (issue 8): every published run in ``scenarios/validation/published.csv`` against its
simulation. A row fails past 10% iteration-time error; the mean absolute error over all rows must stay under
5%. Rows the model does not yet reach are strict xfails that name the gap: they fail the suite the day they
come inside the band, so the marker has to go.

Megatron-LM rows (Korthikanti et al. 2022, A100): the A100 profile's one calibration factor is fitted to
the paper's Table 4 layer times, never to these iteration times.
"""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from sim.cli import commands as cli
from sim.validation.validate import error_stats, published, run_validation

from conftest import SCENARIOS

FOLDER = SCENARIOS / "validation"
ROWS = list(published(FOLDER)["scenario"])
# The blog's authors say of these runs: "for H100s, both MFU and HFU are relatively low", with "a 10% gap due
# to network 'peeking' out" and H100's HBM bandwidth (under 2x A100's) as their hypothesis. Eager element-wise
# kernels (priced at HBM bandwidth) take the gap from -37..-51% to -29..-37%; the rest is not explained by
# anything the blog publishes (its speedup over the A100 runs, 2.0-2.2x, tracks the 2x network, not the 3.2x
# peak), so these stay outside the band until a mechanism with a source closes it.
H100_FSDP = ("the IBM H100 runs are 1.4-1.6x slower than the model's eager compute with line-rate, overlapped "
             "FSDP communication; the blog itself calls them under-performing (HBM, exposed network)")
OUTSIDE = {name: H100_FSDP for name in ("ibm-fsdp-llama2-7b-h100-96.yaml", "ibm-fsdp-llama2-13b-h100-96.yaml",
                                        "ibm-fsdp-llama2-34b-h100-96.yaml", "ibm-fsdp-llama2-70b-h100-96.yaml")}
# NeMo 24.07 H100 FP8 rows (issue 22): -12..-31% with FP8's cast kernels, the bf16 LM head, FP8 GEMMs on the
# bf16 curve and the distributed optimizer's weight gather under the forward (overlap_param_gather); H100 has no
# end-to-end factor yet (A100's x1.23 is fitted on Korthikanti), which issue 22's per-GPU calibration adds.
# Strict: a row that comes inside the band says so.
NEMO_H100 = "H100 has no end-to-end calibration yet (issue 22); FP8 mechanisms alone leave these rows fast"
OUTSIDE.update({name: NEMO_H100 for name in ("nemo2407-gpt3-5b-64.yaml", "nemo2407-gpt3-20b-64.yaml",
                                             "nemo2407-gpt3-175b-128.yaml", "nemo2407-gpt3-175b-512.yaml",
                                             "nemo2407-llama2-7b-8.yaml", "nemo2407-llama2-13b-16.yaml",
                                             "nemo2407-llama2-70b-64.yaml", "nemo2407-nemotron-8b-64.yaml",
                                             "nemo2407-nemotron-22b-64.yaml", "nemo2407-nemotron-340b-128.yaml")})


# The table simulates all 63 scenarios (about 35 s), once per module: every test that reads it is marked slow,
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


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="the four H100 FSDP rows (-29..-37%) and the ten NeMo H100 "
                                       "FP8 rows (-12..-31%) pull the mean over 5%; see OUTSIDE")
def test_mean_absolute_error_under_5_percent(table: pd.DataFrame) -> None:
    assert error_stats(table.reset_index())["mean_abs"] <= 0.05


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
