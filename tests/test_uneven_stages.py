"""Pipeline stages with other layer counts at the ends (Megatron-LM's --decoder-first/last-pipeline-num-layers;
Qi et al. 2024 give the embedding and head stages one layer fewer)."""

from __future__ import annotations

import pytest

from sim import runner
from sim.cli import commands as cli
from sim.explore.estimate import estimate
from sim.model.transformer import embedding_params, layer_params
from sim.parallel.grid import chunk_sizes
from sim.plan import resolve
from sim.spec.scenario import load_scenario

from conftest import SCENARIOS

QI_1P5B = SCENARIOS / "validation" / "qi2024-1.5b-1f1b-m24.yaml"


@pytest.mark.parametrize("args, sizes", [
    ((22, 8, 1, 2, 2), [2, 3, 3, 3, 3, 3, 3, 2]),
    ((62, 32, 1, 1, 1), [1] + [2] * 30 + [1]),
    ((10, 2, 1, 4, None), [4, 6]),
    ((24, 4, 1, None, 3), [7, 7, 7, 3]),
    ((96, 8, 2, None, None), [6] * 16),
])
def test_chunk_sizes(args, sizes) -> None:
    assert list(chunk_sizes(*args)) == sizes
    assert sum(sizes) == args[0]


@pytest.fixture(scope="module")
def run():
    return runner.run(load_scenario(QI_1P5B))


def test_each_stage_runs_its_own_layers_once_per_micro_batch(run) -> None:
    scenario, trace = run.scenario, run.trace
    forward = trace[(trace["kind"] == "forward") & (trace["layer"] >= 0)]
    per_stage = forward.groupby("stage")["layer"].agg(lambda layers: sorted(set(layers)))
    starts = resolve(scenario).chunk_starts
    assert [list(per_stage[s]) for s in range(8)] == [list(range(starts[s], starts[s + 1])) for s in range(8)]
    assert [resolve(scenario).stage_layers(s) for s in range(8)] == [2, 3, 3, 3, 3, 3, 3, 2]
    counts = forward.groupby(["stage", "layer"]).size()
    assert (counts == 2 * resolve(scenario).microbatches).all()  # attention and MLP blocks of every micro-batch


def test_stage_params_count_their_layers() -> None:
    scenario = load_scenario(QI_1P5B)
    model = scenario.model
    assert resolve(scenario).stage_params(0) == \
        2 * layer_params(model).total + embedding_params(model)
    assert resolve(scenario).stage_params(3) == 3 * layer_params(model).total


def test_estimate_and_memory_plan_agree_with_the_simulation(run) -> None:
    est = estimate(run.scenario)
    assert est.step_time_s == pytest.approx(run.summary.step_time_s, rel=0.05)
    assert est.bound_s <= run.summary.step_time_s
    assert est.peak_memory_bytes == pytest.approx(run.summary.peak_memory_bytes.max, rel=0.05)


@pytest.mark.parametrize("overrides, message", [
    (["parallel.first_stage_layers=3"], "parallel.first_stage_layers/last_stage_layers: the other 6 stage(s) "
                                        "cannot split the remaining 17 of model.num_layers = 22 evenly"),
    (["parallel.first_stage_layers=null", "parallel.last_stage_layers=4"],
     "parallel.last_stage_layers: the other 7 stage(s) cannot split the remaining 18 of model.num_layers = 22"),
    (["schedule=interleaved", "parallel.vpp=2"], "parallel.first_stage_layers/last_stage_layers: needs pp >= 2 "
                                                 "and vpp = 1"),
    (["parallel.first_stage_layers=null", "parallel.last_stage_layers=null"],
     "parallel.pp: 8 does not divide model.num_layers = 22"),
])
def test_bad_stage_layers_are_one_line_errors(overrides, message, capsys) -> None:
    assert cli.main(["check", str(QI_1P5B), *[a for o in overrides for a in ("--set", o)]]) == 2
    assert message in capsys.readouterr().err
