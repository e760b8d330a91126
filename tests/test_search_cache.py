"""The screen's shared caches (sim.explore.estimate.Estimator: keys from the search layout, stage times per stage
shape, per-shape tails and memory parts, compiled and memoised stage-level replays) and its skipped tails change
nothing: every layout's estimate is the float a fresh Estimator gives it alone, keyed by the scenario itself and
working out every stage's tail, so the ranking is the same; and the screen reports its progress."""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd
import pytest

from sim.explore import search, search_processes
from sim.explore.estimate import Estimator
from sim.explore.stage_replay import Pass, StageTimes, pass_dependencies, resolve_passes, stage_level_replay
from sim.parallel.schedules import SCHEDULES
from sim.plan import resolve
from sim.spec.degrees import degrees
from sim.spec.scenario import load_scenario
from sim.workload import footprint

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ["status", "est_step_time_s", "est_mfu", "est_peak_memory_bytes", "bound_step_time_s", "microbatches"]


def _alone(base, space: list[search.Layout]) -> pd.DataFrame:
    """Each layout's row from a new Estimator that works out every stage's tail, given the candidate scenario
    alone (no layout keys): nothing one layout priced is reused for another, and no tail is skipped."""
    rows = []
    for layout in space:
        row: dict = dict(vars(layout))
        try:
            scenario = search.candidate(base, layout)
        except ValueError as error:
            rows.append(row | {"status": f"invalid: {error}"})
            continue
        estimator = Estimator(base)
        estimator.skip_tails = False
        est = estimator.estimate(scenario)
        rows.append(row | {"status": "ok" if est.fits_in_memory else "oom", "est_step_time_s": est.step_time_s,
                           "est_mfu": est.mfu, "est_peak_memory_bytes": est.peak_memory_bytes,
                           "bound_step_time_s": est.bound_s, "microbatches": degrees(scenario).microbatches})
    return pd.DataFrame(rows)


def _same(shared: pd.DataFrame, alone: pd.DataFrame, count: int) -> None:
    """Both tables hold the same rows, bit for bit (NaN where the other is NaN), in the same order of the fitting
    layouts by estimate."""
    key = list(search.LAYOUT_FIELDS)
    merged = shared.merge(alone, on=key, suffixes=("", "_alone"), validate="one_to_one")
    assert len(merged) == count
    assert (merged["status"] == merged["status_alone"]).all()
    for column in COLUMNS[1:]:  # bit for bit, NaN (invalid layouts) where the other is NaN
        a, b = merged[column], merged[f"{column}_alone"]
        assert ((a == b) | (a.isna() & b.isna())).all(), column
    priced = shared[shared["status"] == "ok"]
    assert len(priced) > 5
    ranked = alone[alone["status"] == "ok"].sort_values("est_step_time_s", kind="stable")
    assert priced[key].to_numpy().tolist() == ranked[key].to_numpy().tolist()


@pytest.mark.parametrize(("scenario", "stride"), [
    ("pipeline-4x8.yaml", 9),  # every schedule on 4 stages, zero-bubble orders replayed (m < 2p)
    ("gpt3-175b_a100-1024.yaml", 29),  # 984 layouts: tp 1-8, pp 1-32, all ZeRO stages (FSDP + PP) and schedules
    ("llama2-7b_h100-32_spine.yaml", 23),  # the contention network's static shares
    ("mixtral-8x7b_h100-64.yaml", 151),  # MoE: expert tails, ep x etp (690 layouts)
])
def test_the_shared_screen_gives_each_layout_the_estimate_it_gets_alone(scenario: str, stride: int) -> None:
    base = load_scenario(ROOT / "scenarios" / scenario)
    space = list(search.layouts(base))[::stride]
    _same(search.screen(base, space), _alone(base, space), len(space))


@pytest.mark.parametrize(("scenario", "overrides", "stride"), [
    # FP8 with the weight cache: a layer's cast kernels are 1/m per micro-batch (step.fp8_casts), so its
    # pieces' prices depend on the micro-batch count, which layouts with the same micro-batch size, tp and SP
    # but another dp do not share (current scaling and split accumulation on top)
    ("llama2-7b_h100-16_fsdp.yaml", ["training.dtype=fp8"], 17),
    ("llama2-7b_h100-16_fsdp.yaml", ["training.dtype=fp8", "training.fp8_recipe=current",
                                     "costs.fp8_split_accumulation=1.15"], 17),
    ("llama2-7b_h100-16_fsdp.yaml", ["fsdp.version=2", "fsdp.reshard_after_forward=false"], 17),
    # (activation offload refuses pp > 1, as Megatron-Core does: a finer stride keeps > 5 layouts priced)
    ("llama2-7b_h100-16_fsdp.yaml", ["training.cpu_offloading_num_layers=2", "fsdp=null"], 7),
    ("llama2-7b_h100-16_fsdp.yaml", ["training.sequence.packing=true", "training.sequence.lengths=uniform",
                                     "training.sequence.split_across_pack=false"], 17),
    ("llama2-7b_h100-16_fsdp.yaml", ["training.seq_len=16384", "model.max_seq_len=16384", "fsdp=null"], 11),
    ("llama3-8b_h100-1_lora.yaml", ["cluster.gpus_per_node=8", "training.global_batch=64"], 7),
    # Megatron's combined 1F1B (moe.a2a_overlap) on interleaved layouts of several vpp per (pp, micro-batches):
    # the replayed order is the vpp's own; with the host sync's pair floor on top
    ("mixtral-8x7b_h100-64.yaml", ["moe.a2a_overlap=true", "moe.host_sync=true"], 37),
])
def test_the_shared_screen_equals_a_fresh_estimator_under_the_new_knobs(scenario: str, overrides: list[str],
                                                                         stride: int) -> None:
    """Bases that set FP8 (delayed and current scaling, split accumulation), FSDP2 without resharding, activation
    offload, packing without splitting documents, context parallelism (16K tokens), LoRA and MoE's A2A overlap
    with the host sync: the screen's shared caches still give every layout the estimate a fresh Estimator gives
    it alone."""
    base = load_scenario(ROOT / "scenarios" / scenario, overrides)
    space = list(search.layouts(base))[::stride]
    _same(search.screen(base, space), _alone(base, space), len(space))


def test_skipping_tails_changes_no_layout_and_skips_most_of_a_deep_pipelines_tails(monkeypatch) -> None:
    """The screen skips the tails of stages that cannot set the step (an even pipeline's middle stages): the same
    table as with every tail worked out, on a thirteenth of the 175B space (pp up to 32), with most tails skipped."""
    base = load_scenario(ROOT / "scenarios" / "gpt3-175b_a100-1024.yaml")
    space = list(search.layouts(base))[::13]
    worked: list[int] = []  # the pipeline depth of each stage whose tail is worked out
    tail = Estimator._tail
    monkeypatch.setattr(Estimator, "_tail", lambda self, plan, *args: worked.append(plan.pp) or tail(self, plan, *args))
    skipping = search.screen(base, space)
    with_skips = len(worked)
    worked.clear()
    monkeypatch.setattr(Estimator, "skip_tails", False)
    every = search.screen(base, space)
    priced = every[~every["status"].str.startswith("invalid")]
    assert len(worked) == priced["pp"].sum()  # without skipping, every stage's tail of every priced layout
    assert with_skips < len(worked) / 2
    pd.testing.assert_frame_equal(skipping, every, check_exact=True)


def test_the_screen_reports_its_progress_and_ends_at_the_total() -> None:
    base = load_scenario(ROOT / "scenarios" / "pipeline-4x8.yaml")
    space = list(search.layouts(base))
    seen: list[tuple[int, int]] = []
    search.screen(base, space, on_progress=lambda done, total: seen.append((done, total)))
    every = search.SCREEN_PROGRESS_EVERY
    assert seen == [(n, len(space)) for n in range(every, len(space), every)] + [(len(space), len(space))]


def _sweep_replay(chunks: int, passes: list[list[Pass]], stages: list[StageTimes],
                  c: float) -> tuple[float, list[float]]:
    """The stage-level replay as it was before it was compiled into units: sweep the stages, each issuing its
    next unit once its inputs are done, until none can (the reference the compiled replay must equal)."""
    p = len(passes)
    done: dict[tuple[str, int, int], float] = {}
    position, free, last_b = [0] * p, [0.0] * p, [0.0] * p
    progress = True
    while progress:
        progress = False
        for s, order in enumerate(passes):
            times = {"F": stages[s].forward / chunks, "B": stages[s].backward / chunks,
                     "W": stages[s].weight / chunks}
            while position[s] < len(order):
                end = position[s]
                while order[end][4]:
                    end += 1
                unit = order[position[s]:end + 1]
                inside = {key for _, key, _, _, _ in unit}
                needs = [(dep, crosses) for _, _, dep, crosses, _ in unit if dep is not None and dep not in inside]
                if any(dep not in done for dep, _ in needs):
                    break
                ready = max([free[s]] + [done[dep] + (c if crosses else 0.0) for dep, crosses in needs])
                free[s] = ready + sum(times[phase] for phase, _, _, _, _ in unit)
                if {"F", "B"} <= {phase for phase, _, _, _, _ in unit}:
                    free[s] -= stages[s].pair_overlap / chunks
                for phase, key, _, _, _ in unit:
                    done[key] = free[s]
                    if phase != "F":  # the last B or W: the stage's gradients final
                        last_b[s] = free[s]
                position[s] = end + 1
                progress = True
    return max(free), last_b


@pytest.mark.parametrize(("name", "p", "m", "v"), [
    ("zb-h1", 4, 6, 1), ("zb-h2", 8, 12, 1), ("zb-v", 4, 6, 2), ("interleaved", 4, 8, 3), ("1f1b", 8, 3, 1),
    ("dualpipe", 4, 8, 2), ("dualpipev", 4, 8, 2),
])
def test_the_compiled_stage_replay_gives_the_sweeps_floats(name: str, p: int, m: int, v: int) -> None:
    schedule = SCHEDULES[name]
    orders = schedule.actions(p, m, v)
    last = p - 1 if schedule.layout == "dual" else None
    chunks, units = pass_dependencies(orders, schedule.layout, last)
    rng = random.Random(f"{name}{p}{m}")
    for _ in range(5):  # uneven stages with awkward floats, an F&B pair overlap, and a p2p time
        stages = [StageTimes(rng.uniform(0.1, 1.0), rng.uniform(0.2, 2.0), rng.uniform(0.0, 0.7), 0.01, 3,
                             rng.uniform(0.0, 0.05)) for _ in range(p)]
        c = rng.uniform(0.0, 0.1)
        assert stage_level_replay(chunks, units, stages, c) == _sweep_replay(
            chunks, resolve_passes(orders, schedule.layout, last), stages, c)


def test_the_screen_in_two_processes_gives_every_row_of_the_screen_in_one() -> None:
    """``screen(jobs=2)``: two forked processes, each over its (pp, tp) groups, give the table one process
    gives, bit for bit and in the same order, and the progress still ends at the total."""
    base = load_scenario(ROOT / "scenarios" / "gpt3-175b_a100-1024.yaml")
    space = list(search.layouts(base))[::7]  # 4,074 layouts, above SCREEN_PARALLEL_MIN
    assert len(space) >= search.SCREEN_PARALLEL_MIN
    seen: list[tuple[int, int]] = []
    both = search.screen(base, space, jobs=2, on_progress=lambda done, total: seen.append((done, total)))
    pd.testing.assert_frame_equal(both, search.screen(base, space), check_exact=True)
    assert seen[-1] == (len(space), len(space))
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)  # it only goes forward
    shares = search_processes._partition(space, 2)
    assert sorted(i for share in shares for i in share) == list(range(len(space)))
    groups = [{search_processes._group(space[i]) for i in share} for share in shares]
    assert not groups[0] & groups[1]  # no (pp, tp), nor one pp's zero-bubble layouts, priced in both processes
    assert max(map(len, shares)) <= 0.6 * len(space)
    three = search_processes._partition(space, 3)  # more than two shares: largest groups first, to the least loaded
    assert len(three) == 3 and sorted(i for share in three for i in share) == list(range(len(space)))


@pytest.mark.parametrize("scenario", sorted(path.name for path in (ROOT / "scenarios").glob("*.yaml")))
def test_the_screens_memory_total_is_the_bounds(scenario: str) -> None:
    """``footprint.parts_total`` (the screen's sum of a stage's bound from its resident parts' sum) is
    ``with_parts(...)["total"]``, the bound ``sim check`` prints, bit for bit, on every stage of every bundled
    scenario (QLoRA's frozen storage, MoE experts, offload, FSDP's gathered buffers among them)."""
    plan = resolve(load_scenario(ROOT / "scenarios" / scenario))
    for stage in range(plan.pp):
        resident = footprint.states_and_buffers(plan, stage)[0]
        activations = footprint.stage_activations(plan, stage)[0]
        gathered, unreduced = footprint.sharded_buffers(plan, stage)
        total = footprint.with_parts(plan, resident, activations, gathered, unreduced)["total"]
        assert footprint.parts_total(plan, sum(resident.values()), activations, gathered, unreduced) == total
        assert total == footprint.stage_memory(plan, stage)["total"]
