"""Output files (issue 27): summary.json is valid JSON or not written (NaN and infinity are not JSON numbers, RFC
8259 Sec. 6: the writer names the field instead), and every file ``sim run`` writes appears whole or not at all
(sim.output.atomic: a temporary file beside it, then ``os.replace``), so a run killed while writing leaves the
earlier file or none, never a torn one."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sim import runner
from sim.cli import main
from sim.errors import SimError
from sim.output.atomic import temporary_path, write_atomically, write_text_atomically
from sim.spec.scenario import load_scenario

from conftest import SCENARIOS

TINY = SCENARIOS / "tiny.yaml"


@pytest.fixture(scope="module")
def result():
    return runner.run(load_scenario(TINY))


def test_summary_json_is_strict_json(result):
    text = result.summary.to_json()
    assert json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in summary.json")) \
        == result.summary.to_dict()


@pytest.mark.parametrize(("change", "field"), [
    ({"mfu": float("nan")}, "summary.mfu: nan"),
    ({"tokens_per_s": float("inf")}, "summary.tokens_per_s: inf"),
    ({"exposed_comm_s": {"tp": 0.0, "pp": -float("inf"), "dp": 0.0}}, "summary.exposed_comm_s.pp: -inf"),
])
def test_a_value_that_is_not_finite_is_named_not_written(result, change, field):
    broken = replace(result.summary, **change)
    with pytest.raises(SimError, match=rf"^{field} is not a finite number, which summary.json cannot hold"):
        broken.to_json()


def test_a_nested_planning_value_is_named_by_its_path(result):
    planning = replace(result.summary.planning, energy_per_step_j=float("nan"))
    with pytest.raises(SimError, match=r"^summary.planning.energy_per_step_j: nan is not a finite number"):
        replace(result.summary, planning=planning).to_json()


def test_sim_run_with_a_non_finite_summary_is_one_line_and_writes_no_summary(tmp_path, capsys, monkeypatch, result):
    real = runner.run

    def broken(*args, **kwargs):
        run = real(*args, **kwargs)
        return replace(run, summary=replace(run.summary, tokens_per_s=float("inf")))

    monkeypatch.setattr(runner, "run", broken)
    capsys.readouterr()
    assert main(["run", str(TINY), "-o", str(tmp_path), "--no-plot"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: summary.tokens_per_s: inf is not a finite number, which summary.json cannot hold (a "
                   "simulator bug; please report the scenario)"]
    assert not (tmp_path / "summary.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left behind


def test_an_interrupted_writer_leaves_the_earlier_file_whole_and_no_temporary(tmp_path):
    path = tmp_path / "summary.json"
    write_text_atomically(path, '{"step_time_s": 1.0}\n')

    def killed_half_way(temporary):
        temporary.write_text('{"step_time_s": 2.')  # the first half of the new file...
        raise KeyboardInterrupt  # ...and the run is stopped (SIGINT) before the rest

    with pytest.raises(KeyboardInterrupt):
        write_atomically(path, killed_half_way)
    assert path.read_text() == '{"step_time_s": 1.0}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_the_temporary_file_keeps_the_suffix_writers_choose_a_format_by(tmp_path):
    temporary = temporary_path(tmp_path / "trace.parquet")
    assert temporary.parent == tmp_path and temporary.suffix == ".parquet" and temporary.name.startswith(".trace.")


def test_sim_run_leaves_only_its_outputs(tmp_path, capsys):
    assert main(["run", str(TINY), "-o", str(tmp_path), "--no-plot", "--chrome", "--format", "csv"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scenario.resolved.yaml", "summary.json", "trace.csv",
                                                           "trace.json"]
    json.loads((tmp_path / "summary.json").read_text(), parse_constant=lambda name: pytest.fail(name))


def test_a_directory_where_the_file_goes_is_reported_against_that_path(tmp_path):
    (tmp_path / "summary.json").mkdir()
    with pytest.raises(IsADirectoryError) as error:
        write_text_atomically(tmp_path / "summary.json", "{}\n")
    assert error.value.filename == str(tmp_path / "summary.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # the temporary file removed
