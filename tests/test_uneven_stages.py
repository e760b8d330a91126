"""Pipeline stages with other layer counts at the ends (Megatron-LM's --decoder-first/last-pipeline-num-layers;
Qi et al. 2024 give the embedding and head stages one layer fewer), with interleaving too, and Megatron-Core's
account_for_embedding/loss_in_pipeline_split (Llama 3's pipeline: the first chunk the embedding alone)."""

from __future__ import annotations

import pytest

from sim import runner
from sim.cli import commands as cli
from sim.explore.estimate import estimate
from sim.model.params import embedding_params, layer_params
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
    # vpp > 1: each stage's layers split over its chunks, chunk a*pp + b on stage b (Megatron-Core's order)
    ((20, 4, 2, 4, 4), [2, 3, 3, 2] * 2),
    # Megatron-Core's account_for_embedding/loss_in_pipeline_split: (126 + 2) / (16 x 8) = 1 layer per chunk,
    # the first chunk the embedding alone, the last the loss alone (Llama 3 405B's pipeline)
    ((126, 16, 8, None, None, True, True), [0] + [1] * 126 + [0]),
    ((126, 16, 2, None, None, True, True), [3] + [4] * 30 + [3]),
    ((23, 4, 1, None, None, True, False), [5, 6, 6, 6]),
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
    (["schedule=interleaved", "parallel.vpp=2"], "parallel.first_stage_layers/last_stage_layers: a stage of 3 "
                                                 "layers does not split over vpp = 2 model chunks"),
    (["schedule=interleaved", "parallel.vpp=2", "parallel.first_stage_layers=3", "parallel.last_stage_layers=1"],
     "parallel.first_stage_layers: a stage of 3 layers does not split over vpp = 2"),
    (["schedule=zb-v", "parallel.vpp=2", "parallel.first_stage_layers=4", "parallel.last_stage_layers=6"],
     "parallel.first_stage_layers/last_stage_layers: uneven model chunks need the interleaved layout"),
    (["parallel.first_stage_layers=null", "parallel.last_stage_layers=null",
      "parallel.account_for_embedding_in_pipeline_split=true"],
     "parallel.account_for_embedding_in_pipeline_split: model.num_layers + 1 = 23 does not split evenly over "
     "pp*vpp = 8 model chunks"),
    (["parallel.account_for_loss_in_pipeline_split=true"],
     "parallel.first_stage_layers/last_stage_layers: not with parallel.account_for_embedding/loss_in_pipeline"),
    (["parallel.first_stage_layers=null", "parallel.last_stage_layers=null"],
     "parallel.pp: 8 does not divide model.num_layers = 22"),
])
def test_bad_stage_layers_are_one_line_errors(overrides, message, capsys) -> None:
    assert cli.main(["check", str(QI_1P5B), *[a for o in overrides for a in ("--set", o)]]) == 2
    assert message in capsys.readouterr().err


def test_interleaved_uneven_stages_run_each_stage_s_layers_in_its_chunks() -> None:
    """Interleaving with uneven stages needs every stage's layers divisible by vpp: 20 layers on 4 stages as 4,6,6,4
    with vpp 2, chunk a*4 + b on stage b holding that stage's layers / 2. The simulation runs each layer once per
    micro-batch on the stage the plan gives it, and the estimate stays within 5%."""
    scenario = load_scenario(QI_1P5B, ["model.num_layers=20", "parallel.pp=4", "parallel.dp=2", "parallel.vpp=2",
                                       "schedule=interleaved", "parallel.first_stage_layers=4",
                                       "parallel.last_stage_layers=4", "training.global_batch=48",
                                       "training.microbatches=null"])
    plan = resolve(scenario)
    assert [plan.stage_layers(s) for s in range(4)] == [4, 6, 6, 4]
    assert plan.stage_chunks[1] == (1, 5) and list(plan.chunk_layers(5)) == [12, 13, 14]
    result = runner.run(scenario)
    forward = result.trace[(result.trace["kind"] == "forward") & (result.trace["layer"] >= 0)]
    for stage in range(4):
        layers = sorted(set(forward[forward["stage"] == stage]["layer"]))
        assert layers == sorted(layer for g in plan.stage_chunks[stage] for layer in plan.chunk_layers(g))
    assert estimate(scenario).step_time_s == pytest.approx(result.summary.step_time_s, rel=0.05)


def test_llama3_405b_layout_first_chunk_embedding_alone() -> None:
    """The bundled 405B scenario (Llama 3 paper's text): 16 stages x 8 chunks of one layer, chunk 0 the embedding
    alone on stage 0 and chunk 127 the head alone on stage 15; stages 0 and 15 run 7 layers, the others 8."""
    scenario = load_scenario(SCENARIOS / "llama3.1-405b_h100-16384.yaml")
    plan = resolve(scenario)
    assert [plan.stage_layers(s) for s in range(16)] == [7] + [8] * 14 + [7]
    assert not plan.chunk_layers(0) and not plan.chunk_layers(127)
    assert plan.embedding_stage == 0 and plan.head_stage == 15 and plan.pipelined_fsdp
    model = scenario.model
    assert plan.stage_params(0) == 7 * layer_params(model).per_tp_rank(8) + embedding_params(model) / 8


def test_a_stage_of_the_embedding_alone_is_refused_in_one_line(capsys) -> None:
    """126 layers + the embedding's and the loss's slots over pp 128 (vpp 1): the first stage would hold the
    embedding alone and the last the loss alone. The simulator keeps a stage's head and embedding gradients with
    its layers, so such a layout is refused in one line (it crashed ``sim search`` on the 405B scenario's space,
    ``max() arg is an empty sequence``); with vpp 8 (the bundled layout) a chunk may be the embedding alone."""
    args = ["check", str(SCENARIOS / "llama3.1-405b_h100-16384.yaml"), "--set", "parallel.tp=1", "--set",
            "parallel.pp=128", "--set", "parallel.vpp=1", "--set", "schedule=1f1b"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "parallel.account_for_embedding_in_pipeline_split: model.num_layers + 2 = 128 over pp = 128 stages " \
           "leaves the embedding's or the loss's stage without a transformer layer" in err
    assert len(err.strip().splitlines()) == 1


def test_the_embedding_alone_in_chunk_0_keeps_its_gradients_and_gathers() -> None:
    """Model chunk 0 holding the embedding alone (one pipeline-split slot per chunk): Megatron's per-chunk gradient
    buffers (no --overlap-grad-reduce) and the distributed optimizer's weight-gather buckets still carry the
    embedding's bytes, with the stage's first chunk (they were dropped when keyed to layer 0, which sits on stage
    1 here)."""
    from sim.workload.grad_buckets import chunk_gradient_bytes, gradient_bytes
    from sim.workload.param_gather import param_gather_buckets
    scenario = load_scenario(SCENARIOS / "llama3.1-405b_h100-16384.yaml",
                             ["fsdp=null", "parallel.zero=1", "parallel.overlap_grad_reduce=false",
                              "parallel.overlap_param_gather=false"])
    plan = resolve(scenario)
    sizes = gradient_bytes(plan, 0)
    assert -1 in sizes and not plan.chunk_layers(0)
    chunks = chunk_gradient_bytes(plan, 0)
    assert chunks[0][0] == [-1]
    assert sum(nbytes for _, nbytes in chunks) == pytest.approx(sum(sizes.values()), rel=1e-12)
    gathered = load_scenario(SCENARIOS / "llama3.1-405b_h100-16384.yaml",
                             ["fsdp=null", "parallel.zero=1", "parallel.overlap_grad_reduce=true",
                              "parallel.overlap_param_gather=true"])
    plan = resolve(gathered)
    buckets = param_gather_buckets(plan, 0)
    per_grad_byte = plan.weight_bytes_per_param / plan.grad_bytes_per_param
    assert sum(b.nbytes for b in buckets) == pytest.approx(sum(gradient_bytes(plan, 0).values()) * per_grad_byte,
                                                           rel=1e-12)
