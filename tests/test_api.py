"""The Python API (``import sim``): its pinned names, that it gives what the command line gives, its errors, the
typed summary, and charts that draw on a given Axes without touching the user's Matplotlib backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import matplotlib
import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

import sim
from analysis.gantt import plot_gantt
from sim.cli.commands import main
from sim.explore.estimate import estimate as estimate_scenario
from sim.spec.scenario import load_scenario, resolved_yaml
from sim.workload.footprint import memory_plan

from conftest import ROOT, SCENARIOS

TINY = SCENARIOS / "tiny.yaml"
EVERY_OPTIONAL_FIELD = ["network.model=contention", "ranks=all", "network.nccl_sms=8"]


def test_all_is_pinned_and_every_name_resolves():
    assert sim.__all__ == [
        "Check", "ConfigError", "Estimate", "OutOfMemory", "Plan", "ResourceLimit", "RunResult", "Scenario",
        "ScheduleDeadlock", "SimError", "Summary", "check", "estimate", "load_scenario", "run",
    ]
    assert sim.__all__ == sorted(sim.__all__)
    assert all(getattr(sim, name) is not None for name in sim.__all__)
    assert issubclass(sim.ConfigError, sim.SimError) and sim.Scenario is type(load_scenario(TINY))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        sim.nope  # noqa: B018


def test_importing_sim_loads_neither_pandas_nor_simpy():
    code = "import sys, sim, sim.units; print(sorted(m for m in ('pandas', 'simpy', 'matplotlib') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == "[]"


def test_the_readme_one_liner_runs_from_the_repository_root():
    code = "import sim; r = sim.run('scenarios/tiny.yaml'); print(r.summary.step_time_s, len(r.trace))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    step, tasks = result.stdout.split()
    assert float(step) == sim.run(TINY).summary.step_time_s and int(tasks) == 374


def test_run_gives_the_summary_json_of_the_command_line(tmp_path):
    result = sim.run(str(TINY))
    assert main(["run", str(TINY), "-o", str(tmp_path), "--no-plot"]) == 0
    written = (tmp_path / "summary.json").read_text()
    assert json.loads(written)["step_time_s"] == result.summary.step_time_s == pytest.approx(0.0295429, rel=1e-6)
    assert written == json.dumps(result.summary.to_dict(), indent=2, sort_keys=True) + "\n"
    assert list(result.trace.columns)[:3] == ["task", "rank", "stage"] and len(result.trace) == 374


def test_set_as_a_mapping_or_as_strings_gives_the_same_scenario():
    mapping = {"parallel.tp": np.int64(1), "parallel.dp": 2, "training.recompute": "full",
               "network": "contention", "ranks": "all", "variation.slowdown": {1: 1.25}}
    strings = ["parallel.tp=1", "parallel.dp=2", "training.recompute=full", "network=contention", "ranks=all",
               "variation.slowdown={1: 1.25}"]
    expected = load_scenario(TINY, strings)  # what `sim run --set ...` loads
    assert sim.load_scenario(TINY, mapping) == sim.load_scenario(TINY, strings) == expected
    assert expected.parallel.tp == 1 and sim.Plan(expected).dp == 2 and expected.variation.slowdown == {1: 1.25}
    base = load_scenario(TINY)
    assert sim.load_scenario(base, mapping) == expected  # a Scenario is re-validated with the overrides
    assert sim.load_scenario(base) is base
    raw = {"name": "tiny", **{k: v for k, v in base.model_dump(mode="json").items() if k != "name"}}
    assert sim.load_scenario(raw, strings) == expected and raw["parallel"]["tp"] == 2  # the dict is not edited
    by_mapping, by_strings = sim.run(TINY, set={"parallel.tp": 1, "parallel.dp": 2}), \
        sim.run(TINY, set=["parallel.tp=1", "parallel.dp=2"])
    assert by_mapping.summary == by_strings.summary
    assert (by_mapping.summary.layout.tp, by_mapping.summary.layout.dp) == (1, 2)


def test_a_bad_field_raises_the_one_line_config_error_of_the_command_line(capsys):
    with pytest.raises(sim.ConfigError) as info:
        sim.run(TINY, set={"parallel.tpp": 2})
    message = str(info.value)
    assert "\n" not in message and "parallel.tpp" in message
    assert main(["check", str(TINY), "--set", "parallel.tpp=2"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"
    with pytest.raises(sim.ConfigError, match="scenario: file 'nope.yaml' not found"):
        sim.estimate("nope.yaml")
    with pytest.raises(sim.ConfigError, match="parallel: tp\\*pp\\*dp = 1 but the cluster has 4 GPUs"):
        sim.check(TINY, ["parallel.tp=1", "parallel.pp=1"])
    with pytest.raises(TypeError, match="scenario: expected a YAML path, a dict or a Scenario, got int"):
        sim.run(3)  # type: ignore[arg-type]


def test_summary_to_dict_round_trips_through_json():
    full = sim.run(TINY, EVERY_OPTIONAL_FIELD).summary
    data = full.to_dict()
    assert list(data)[-6:] == ["nccl_sm_stretch_s", "critical_rank", "critical_path_s", "collective_wait_s",
                               "busiest_links", "critical_link"]
    assert data["critical_link"] is None and data["busiest_links"][0]["tier"] == "nvlink"  # nothing saturated
    assert sim.Summary.from_dict(json.loads(json.dumps(data))) == full
    plain = sim.run(TINY).summary
    assert list(plain.to_dict()) == list(data)  # the same keys in every mode, optional ones null
    assert plain.critical_link is None and plain.to_dict()["busiest_links"] is None
    assert sim.Summary.from_dict(json.loads(json.dumps(plain.to_dict()))) == plain
    assert plain.peak_memory_bytes.max == max(plain.peak_memory_bytes.per_rank.values())


def test_estimate_and_check_give_what_the_modules_and_sim_check_give(capsys):
    overrides = {"training.global_batch": 16}
    scenario = load_scenario(TINY, ["training.global_batch=16"])
    assert sim.estimate(TINY, overrides) == estimate_scenario(scenario)
    checked = sim.check(TINY, overrides)
    assert checked.scenario == scenario and checked.resolved_yaml == resolved_yaml(scenario)
    assert checked.memory_plan == memory_plan(sim.Plan(scenario))
    assert [row["stage"] for row in checked.memory_plan] == [0, 1]
    assert checked.fits_in_memory
    assert main(["check", str(TINY), "--set", "training.global_batch=16"]) == 0
    printed = capsys.readouterr().out  # the terminal wraps long lines: compare without whitespace
    assert "".join(checked.resolved_yaml.split()) in "".join(printed.split())


def test_plot_gantt_draws_on_a_given_axes_and_keeps_the_backend():
    backend = matplotlib.get_backend()
    trace = sim.run(TINY).trace
    fig = Figure()
    ax = fig.subplots()
    assert plot_gantt(trace, ax=ax, ranks=[0], title="tiny") is ax
    assert ax.get_title(loc="left") == "tiny" and len(ax.get_yticklabels()) == trace[trace["rank"] == 0][
        "stream"].nunique()
    import matplotlib.pyplot as plt

    own = plot_gantt(trace)  # a new pyplot figure, as a notebook shows it
    assert isinstance(own, Axes) and own.get_xlim() == (0.0, trace["end_s"].max())
    plt.close(own.figure)
    assert matplotlib.get_backend() == backend


def test_importing_analysis_leaves_the_users_backend_alone():
    code = ("import importlib, pkgutil, matplotlib, analysis\n"
            "for module in pkgutil.iter_modules(analysis.__path__):\n"
            "    importlib.import_module('analysis.' + module.name)\n"
            "print(matplotlib.get_backend())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "MPLBACKEND": "template"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "template"

