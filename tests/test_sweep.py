"""Sweeps: grid parsing, one row per point with a status, parallel runs equal serial ones, and a killed sweep
resumes with only the missing points."""

import csv
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from sim import runner
from sim.cli import main
from sim.errors import ConfigError
from sim.explore.sweep import SweepSpec, make_spec, parse_axis, point_id, run_sweep
from sim.spec.scenario import load_scenario

from conftest import ROOT, SCENARIOS

TINY = SCENARIOS / "tiny.yaml"


def test_parse_axis():
    assert parse_axis("training.microbatches=1..4") == ("training.microbatches", [1, 2, 3, 4])
    assert parse_axis("schedule=1f1b,zb-h1") == ("schedule", ["1f1b", "zb-h1"])
    assert parse_axis("parallel.sequence_parallel=true,false") == ("parallel.sequence_parallel", [True, False])
    with pytest.raises(ConfigError, match="expected key=v1,v2"):
        parse_axis("schedule")


def test_points_in_grid_order_with_linked_values():
    spec = SweepSpec(TINY, {"schedule": ["1f1b", {"schedule": "interleaved", "parallel.vpp": 2}],
                            "training.microbatches": [2, 4]})
    assert spec.points() == [
        {"schedule": "1f1b", "training.microbatches": 2}, {"schedule": "1f1b", "training.microbatches": 4},
        {"schedule": "interleaved", "parallel.vpp": 2, "training.microbatches": 2},
        {"schedule": "interleaved", "parallel.vpp": 2, "training.microbatches": 4}]
    assert spec.keys == ["schedule", "parallel.vpp", "training.microbatches"]


def test_rows_carry_status_and_match_direct_runs(tmp_path):
    spec = make_spec(TINY, ["training.microbatches=2,3", "schedule=1f1b,interleaved"], ["parallel.vpp=1"])
    table = run_sweep(spec, tmp_path)
    assert list(table["status"]) == ["ok", "ok", "ok",
                                     "invalid: schedule: interleaved needs the micro-batch count (3) to be a "
                                     "multiple of pp (2)"]
    direct = runner.run(load_scenario(TINY, ["training.global_batch=null", "training.microbatches=3"]))
    assert table.loc[2, "step_time_s"] == direct.summary.step_time_s
    assert table.loc[2, "global_batch"] == 3  # the global batch follows m (dp = 1)
    assert (tmp_path / "results.parquet").is_file()


def test_parallel_jobs_give_the_same_table(tmp_path):
    spec = make_spec(TINY, ["training.microbatches=1..4", "schedule=gpipe,1f1b"], [])
    serial = run_sweep(spec, tmp_path / "serial", jobs=1)
    parallel = run_sweep(spec, tmp_path / "parallel", jobs=2)
    pd.testing.assert_frame_equal(serial, parallel)


def test_sweep_file_with_linked_axis(tmp_path):
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(f"base: {TINY}\nset: [parallel.dp=1]\ngrid:\n  schedule:\n    - 1f1b\n"
                          "    - {schedule: interleaved, parallel.vpp: 2}\n  training.microbatches: 2..4\n")
    table = run_sweep(make_spec(sweep_file, [], []), tmp_path / "out")
    assert len(table) == 6
    interleaved = table[table["schedule"] == "interleaved"]
    assert list(interleaved["parallel.vpp"]) == [2, 2, 2]
    assert list(table[table["schedule"] == "1f1b"]["parallel.vpp"]) == [1, 1, 1]  # resolved value, not blank
    assert interleaved["status"].str.startswith("invalid").sum() == 1  # m = 3


def test_a_point_that_raises_anything_is_a_row_and_the_rest_go_on(tmp_path, monkeypatch):
    """Issue 27: a point failing with something other than a simulator error (a bug) used to abort the whole sweep
    with a traceback and no row, so it could never finish; now it is a row with its error."""
    real_run = runner.run

    def flaky(scenario, *args, **kwargs):
        if scenario.training.microbatches == 3:
            raise ZeroDivisionError("float division by zero")
        return real_run(scenario, *args, **kwargs)

    monkeypatch.setattr(runner, "run", flaky)
    table = run_sweep(make_spec(TINY, ["training.microbatches=2..4"], []), tmp_path)
    assert list(table["status"]) == ["ok", "error: internal ZeroDivisionError: float division by zero", "ok"]


def test_missing_base_is_one_error(tmp_path):
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text("base: nowhere.yaml\ngrid: {schedule: [1f1b]}\n")
    with pytest.raises(ConfigError, match="sweep.base: file .* not found"):
        make_spec(sweep_file, [], [])


@pytest.mark.slow
def test_killed_sweep_resumes_with_only_the_missing_points(tmp_path, capsys):
    out = tmp_path / "sweep"
    args = ["sweep", str(TINY), "--grid", "training.microbatches=1..48", "--grid", "schedule=gpipe,1f1b", "-o",
            str(out), "--no-plot"]
    # The first run is a real process, killed with SIGKILL half-way; the resumed run is main() in this process.
    first = subprocess.Popen([sys.executable, "-m", "sim", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    results = out / "results.csv"
    deadline = time.time() + 60
    while time.time() < deadline:
        if results.is_file() and len(results.read_text().splitlines()) > 11:
            break
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait()
    with results.open() as handle:
        before = [row for row in csv.DictReader(handle) if row.get("status")]
    assert 10 <= len(before) < 96, "the sweep should have been killed half-way"

    capsys.readouterr()
    assert main(args) == 0
    done = len(before)
    assert f"resuming: {done} of 96 points already" in capsys.readouterr().out.replace("\n", " ")
    table = pd.read_csv(results)
    assert len(table) == 96 and table["point_id"].is_unique
    assert sorted(table["point"]) == list(range(96))
    # The rows that finished before the kill were kept as they were, not recomputed.
    kept = table.head(done)
    assert list(kept["point_id"]) == [row["point_id"] for row in before]
    spec = make_spec(TINY, ["training.microbatches=1..48", "schedule=gpipe,1f1b"], [])
    assert set(table["point_id"]) == {point_id(p) for p in spec.points()}


def test_base_that_is_not_a_scenario_is_one_error(tmp_path):
    base = tmp_path / "list.yaml"
    base.write_text("- not\n- a scenario\n")
    with pytest.raises(ConfigError, match="sweep.base: .* must be a scenario mapping"):
        make_spec(base, ["schedule=1f1b"], [])


def test_a_directory_of_another_scenarios_results_is_refused_not_mixed(tmp_path):
    """Resuming adds only the missing points, so a directory that holds another base scenario's (or other
    overrides') rows must be refused: their rows would otherwise join this sweep's table as if they were its."""
    out = tmp_path / "sweep"
    run_sweep(make_spec(TINY, ["training.microbatches=2,4"], []), out)
    again = run_sweep(make_spec(TINY, ["training.microbatches=2,4"], []), out)  # the same sweep resumes
    assert len(again) == 2
    with pytest.raises(ConfigError, match="holds results of another base scenario or overrides"):
        run_sweep(make_spec(TINY, ["training.microbatches=2,4"], ["parallel.tp=1", "parallel.dp=2"]), out)
    with pytest.raises(ConfigError, match="holds results of another base scenario"):
        run_sweep(make_spec(SCENARIOS / "pipeline-4x8.yaml", ["training.microbatches=2,4"], []), out)
    (out / "sweep.json").unlink()  # results with no record of what made them
    with pytest.raises(ConfigError, match="without a sweep.json"):
        run_sweep(make_spec(TINY, ["training.microbatches=2,4"], []), out)
