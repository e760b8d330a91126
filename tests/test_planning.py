"""Planning figures (sim.output.planning): steps, time-to-train, GPU-hours, GPU energy and cost of a token budget,
in closed form and from a run's trace."""

from __future__ import annotations

import math

import pytest
import yaml

import sim
from sim.errors import ConfigError
from sim.output.planning import planning
from sim.spec.scenario import resolved_yaml, scenario_from_dict
from sim.units import parse_count

from conftest import SCENARIOS

TINY = SCENARIOS / "tiny.yaml"


def test_closed_form():
    # 15T tokens at 4M tokens a step on 1024 GPUs of 700 W busy 80% of a 10 s step, at 2 per GPU-hour
    plan = planning(step_time_s=10.0, num_gpus=1024, tokens_per_step=4 * 2**20, compute_utilization=0.8,
                    board_power_w=700.0, train_tokens=15e12, price_per_gpu_hour=2.0)
    steps = math.ceil(15e12 / 2**22)
    assert plan.train_steps == steps == 3_576_279
    assert plan.time_to_train_s == steps * 10.0
    assert plan.gpu_hours == pytest.approx(1024 * steps * 10 / 3600)
    assert plan.power_w == pytest.approx(700 * 1024 * 0.8)
    assert plan.energy_kwh == pytest.approx(700 * 1024 * 0.8 * steps * 10 / 3.6e6)
    assert plan.cost == pytest.approx(2.0 * plan.gpu_hours)
    bare = planning(10.0, 8, 1e6, 0.5, None, None, 3.0)
    assert (bare.power_w, bare.train_steps, bare.gpu_hours, bare.energy_kwh, bare.cost) == (None,) * 5


def test_counts_take_suffixes():
    assert (parse_count("15T"), parse_count("300B"), parse_count("2.5M"), parse_count(1e9)) == (15e12, 3e11, 2.5e6,
                                                                                                 1e9)


def test_a_run_reports_the_budget_from_its_trace():
    result = sim.run(TINY, ["training.train_tokens=1B", "cluster.price_per_gpu_hour=2.5"])
    summary, trace, plan = result.summary, result.trace, result.summary.planning
    tokens_per_step = result.plan.global_batch * result.plan.seq_len
    assert plan.train_steps == math.ceil(1e9 / tokens_per_step)
    assert plan.time_to_train_s == pytest.approx(plan.train_steps * summary.step_time_s)
    assert plan.gpu_hours == pytest.approx(summary.num_gpus * plan.time_to_train_s / 3600)
    assert plan.cost == pytest.approx(2.5 * plan.gpu_hours)
    # utilisation: each simulated rank's compute stream busy time (its tasks never overlap) over the step
    compute = trace[trace["stream"] == "compute"]
    busy = ((compute["end_s"] - compute["start_s"]).groupby(compute["rank"]).sum() / summary.step_time_s).mean()
    assert plan.compute_utilization == pytest.approx(busy)
    assert 0 < busy < 1
    board = result.scenario.cluster.gpu.board_power
    assert board == 400  # tiny.yaml: A100 SXM, 400 W
    assert plan.energy_kwh == pytest.approx(board * summary.num_gpus * busy * plan.time_to_train_s / 3.6e6)
    # the resolved scenario writes the budget back as it reads it
    resolved = yaml.safe_load(resolved_yaml(result.scenario))
    assert resolved["training"]["train_tokens"] == "1B"
    assert scenario_from_dict(resolved).training.train_tokens == 1e9


def test_without_a_budget_the_budget_figures_are_null():
    plan = sim.run(TINY).summary.planning
    assert plan.power_w is not None and plan.energy_per_step_j is not None
    assert (plan.train_tokens, plan.train_steps, plan.time_to_train_s, plan.gpu_hours, plan.energy_kwh,
            plan.cost) == (None,) * 6


def test_a_bad_budget_is_one_line_naming_the_field():
    data = yaml.safe_load(TINY.read_text())
    data["training"]["train_tokens"] = "15X"
    with pytest.raises(ConfigError, match=r"^training\.train_tokens: .*unknown suffix 'X'") as error:
        scenario_from_dict(data)
    assert "\n" not in str(error.value)
