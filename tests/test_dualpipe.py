"""DualPipe and DualPipeV (sim.parallel.dualpipe) against DeepSeek's code and the DualPipe README's bubble table.

- The per-rank orders equal those DeepSeek's ``DualPipe.step`` / ``DualPipeV.step`` issue, recorded from their
  code by scripts/dualpipe_reference.py into tests/data/dualpipe_orders.json (no torch needed here).
- With fixed costs, dense layers (an overlapped F&B pair runs F then the full backward: F&B = F + B) and an
  input-gradient pass as long as the forward (the README figure's equal cells), every rank idles
  (PP/2-1)(F&B + B - 3W) inside the step, the README's DualPipe row (B the full backward, W its weight part),
  for DualPipe on PP ranks and DualPipeV on PP/2 ranks; beside it 1F1B's (PP-1)(F+B) and ZB1P's (PP-1)(F+B-2W)
  rows, from the 1f1b and zb-h1 schedules.
"""

import json

import pytest

from sim import runner
from sim.errors import ConfigError
from sim.parallel.schedules import SCHEDULES, in_flight_peak
from sim.plan import resolve
from sim.workload.build import build

from conftest import DATA, ROOT, pipeline_scenario

ORDERS = json.loads((DATA / "dualpipe_orders.json").read_text())["orders"]


def _tokens(actions, m, variant):
    """The reference file's tokens of one rank's actions: a unit of F, B, W is an overlapped pair "F&B", a unit
    of B, W a full backward "B", a B alone "b" (its W deferred)."""
    def name(action, full=False):
        offset = m // 2 if variant == "dualpipe" and action.chunk == 1 else 0
        letter = "b" if action.phase == "B" and not full else action.phase
        return f"{letter}{action.chunk}.{action.microbatch - offset}"

    units, unit = [], []
    for action in actions:
        unit.append(action)
        if not action.with_next:
            units.append(unit)
            unit = []
    assert not unit
    out = []
    for unit in units:
        phases = "".join(a.phase for a in unit)
        assert phases in ("F", "B", "W", "BW", "FBW"), phases
        if phases == "FBW":
            out.append(name(unit[0]) + "&" + name(unit[1], full=True))
        elif phases == "BW":
            assert unit[0].microbatch == unit[1].microbatch and unit[0].chunk == unit[1].chunk
            out.append(name(unit[0], full=True))
        else:
            out.append(name(unit[0]))
    return out


@pytest.mark.parametrize("key", sorted(ORDERS))
def test_orders_match_deepseek_code(key):
    variant, p, m = key.split()
    p, m = int(p), int(m)
    actions = SCHEDULES[variant].actions(p, m, 1 if variant == "dualpipe" else 2)
    assert [_tokens(rank, m, variant) for rank in actions] == ORDERS[key]


def test_every_pass_once_and_after_its_own_predecessors():
    """Each rank runs F, B and W of each of its (micro-batch, chunk) once, F before B before W."""
    for p, m in ((4, 8), (6, 14), (8, 16)):
        for rank in SCHEDULES["dualpipe"].actions(p, m, 1):
            seen = {}
            for i, a in enumerate(rank):
                seen.setdefault((a.microbatch, a.chunk), []).append((a.phase, i))
            assert len(seen) == m  # m/2 micro-batches of each direction, one chunk each
            assert all([ph for ph, _ in passes] == ["F", "B", "W"] for passes in seen.values())
            # direction 0 (chunk 0) carries micro-batches 0..m/2-1, direction 1 the others
            assert all((mb >= m // 2) == (chunk == 1) for mb, chunk in seen)


def _idle(result):
    """Per rank: the step's compute span minus that rank's compute time."""
    trace = result.trace
    compute = trace[trace["stream"] == "compute"]
    span = compute["end_s"].max() - compute["start_s"].min()
    busy = (compute["end_s"] - compute["start_s"]).groupby(compute["rank"]).sum()
    return [span - b for b in busy]


@pytest.mark.parametrize("pp", [4, 6, 8, 10])
@pytest.mark.parametrize("w", [0.25, 0.5, 1.0])
def test_dualpipe_bubble_is_the_readme_formula(pp, w):
    f = b_input = 1.0  # seconds per chunk pass (one layer per stage)
    b = b_input + w  # the README's B: a full backward chunk
    f_and_b = f + b  # dense: the pair runs F, then the full backward
    for m in (2 * pp, 2 * pp + 4):
        result = runner.run(pipeline_scenario(pp, m, "dualpipe", forward=f"{f} s", backward=f"{b_input} s",
                                              weight_grad=f"{w} s"))
        assert _idle(result) == pytest.approx([(pp / 2 - 1) * (f_and_b + b - 3 * w)] * pp, abs=1e-9)
        # the step: every rank's m chunk passes, plus the bubble
        assert result.summary.step_time_s == pytest.approx(m * (f + b) + (pp / 2 - 1) * (f_and_b + b - 3 * w))


@pytest.mark.parametrize("ranks", [2, 3, 4, 5])
def test_dualpipev_bubble_is_the_readme_formula(ranks):
    pp = 2 * ranks  # stages: the README counts DualPipeV's PP stages on PP/2 devices
    f, w = 1.0, 0.5
    b = f + w
    result = runner.run(pipeline_scenario(ranks, 2 * ranks + 1, "dualpipev", forward=f"{f} s", backward=f"{f} s",
                                          weight_grad=f"{w} s", layers_per_stage=2, vpp=2))
    assert _idle(result) == pytest.approx([(pp / 2 - 1) * (f + b + b - 3 * w)] * ranks, abs=1e-9)


@pytest.mark.parametrize("pp", [4, 8])
def test_1f1b_and_zb1p_rows_of_the_table(pp):
    """The README's comparison rows with the same F, B (full backward) and W: 1F1B (PP-1)(F+B); ZB1P (PP-1)(F+B-2W),
    which is ZB-H1's (p-1)(T_F+T_B-T_W) with T_B the input-gradient part."""
    f, b_input, w = 1.0, 1.0, 0.5
    b = b_input + w
    m = 2 * pp
    kw = dict(forward=f"{f} s", backward=f"{b_input} s", weight_grad=f"{w} s")
    one_f_one_b = runner.run(pipeline_scenario(pp, m, "1f1b", **kw))
    zb1p = runner.run(pipeline_scenario(pp, m, "zb-h1", **kw))
    assert max(_idle(one_f_one_b)) == pytest.approx((pp - 1) * (f + b))
    assert max(_idle(zb1p)) == pytest.approx((pp - 1) * (f + b - 2 * w))
    dual = runner.run(pipeline_scenario(pp, m, "dualpipe", **kw))
    assert max(_idle(dual)) == pytest.approx((pp / 2 - 1) * (f + b + b - 3 * w))
    assert max(_idle(dual)) < max(_idle(zb1p)) < max(_idle(one_f_one_b))


def test_a_unit_receives_first_and_sends_last():
    """An overlapped pair waits for both inputs before its forward starts, and both its sends leave after the
    unit's last task (dualpipe.py: recv, _commit_and_wait_comm, compute, send)."""
    plan = resolve(pipeline_scenario(4, 8, "dualpipe", forward="1 s", backward="1 s", weight_grad="0.5 s"))
    graph = build(plan)
    tasks = graph.tasks
    rank1 = [t for t in tasks if t.stage == 1]
    compute = [t for t in rank1 if t.stream == "compute"]
    # rank 1's first pair: forward of micro-batch 6 (direction 1) with the full backward of micro-batch 0, two
    # blocks per pass (attention, MLP)
    first = next(i for i, t in enumerate(compute) if t.kind == "forward" and t.microbatch == 6)
    unit = compute[first:first + 6]
    assert [(t.kind, t.microbatch) for t in unit] == [("forward", 6)] * 2 + [("backward", 0)] * 2 + [("weight", 0)] * 2
    def received(task):
        return {(tasks[d].name, tasks[d].microbatch) for d in task.deps if tasks[d].stage != 1}

    assert received(unit[0]) == {("send_forward", 6), ("send_backward", 0)}
    assert not any(received(t) for t in unit[1:])
    sends = [t for t in rank1 if t.stream == "pp" and unit[-1].id in t.deps]
    assert [(t.name, t.microbatch) for t in sends] == [("send_forward", 6), ("send_backward", 0)]


def test_two_copies_of_the_parameters():
    """Each rank holds two stages' layers (one per copy), and both end ranks an embedding and a head."""
    dual = resolve(pipeline_scenario(4, 8, "dualpipe"))
    one = resolve(pipeline_scenario(4, 8, "1f1b"))
    assert [dual.stage_layers(s) for s in range(4)] == [2 * one.stage_layers(s) for s in range(4)]
    assert dual.stage_chunks == ((0, 3), (1, 2), (2, 1), (3, 0))
    # the end ranks: both ends of one copy, less 1F1B's last-stage copy of tied word embeddings (here the head
    # sits beside an embedding and reuses its weights)
    tied = one.model.vocab_size * one.model.hidden_size if one.tied_copy(3) else 0
    assert dual.stage_params(0) == dual.stage_params(3) == pytest.approx(
        one.stage_params(0) + one.stage_params(3) - tied)
    assert dual.stage_params(1) == pytest.approx(2 * one.stage_params(1))
    memory = runner.run(pipeline_scenario(4, 8, "dualpipe")).summary.memory_breakdown_bytes
    base = runner.run(pipeline_scenario(4, 8, "1f1b")).summary.memory_breakdown_bytes
    assert memory["1"]["weights"] == pytest.approx(2 * base["1"]["weights"])


@pytest.mark.parametrize("pp", [4, 6, 8])
def test_activations_in_flight(pp):
    """Stage activations held at the peak (a chunk's forward until its weight pass), in units of one stage's
    micro-batch: the README's PP+1 on every rank, for DualPipe on PP ranks and DualPipeV on PP/2 ranks (PP
    stages); the memory model holds that many chunks' stash."""
    for m in (2 * pp, 4 * pp):
        dual = [in_flight_peak(rank, splits_backward=True) for rank in SCHEDULES["dualpipe"].actions(pp, m, 1)]
        v = [in_flight_peak(rank, splits_backward=True) for rank in SCHEDULES["dualpipev"].actions(pp // 2, m, 2)]
        assert dual == [pp + 1] * pp and v == [pp + 1] * (pp // 2)
    plan = resolve(pipeline_scenario(pp, 2 * pp, "dualpipe"))
    assert [plan.schedule.in_flight(pp, 2 * pp, 1, s) for s in range(pp)] == [pp + 1] * pp


@pytest.mark.parametrize("overrides, message", [
    (dict(p=3, m=6, vpp=1), "dualpipe needs an even pp (not 3): half the ranks send each way"),
    (dict(p=4, m=6, vpp=1), "dualpipe needs an even micro-batch count >= 2*pp = 8 (not 6)"),
    (dict(p=4, m=9, vpp=1), "dualpipe needs an even micro-batch count >= 2*pp = 8 (not 9)"),
    (dict(p=2, m=8, vpp=2), "dualpipe holds two copies of one stage per rank: set parallel.vpp = 1 (not 2)"),
])
def test_dualpipe_rules_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        pipeline_scenario(overrides["p"], overrides["m"], "dualpipe", vpp=overrides["vpp"], layers_per_stage=2)
    assert str(err.value) == f"schedule: {message}"


def test_dualpipev_rules_are_one_line():
    with pytest.raises(ConfigError) as err:
        pipeline_scenario(3, 5, "dualpipev", vpp=2, layers_per_stage=2)
    assert str(err.value) == "schedule: dualpipev needs micro-batches >= 2*pp = 6 (not 5)"
    with pytest.raises(ConfigError) as err:
        pipeline_scenario(3, 6, "dualpipev")
    assert str(err.value) == "schedule: dualpipev runs two model chunks per stage in a V: set parallel.vpp = 2 (not 1)"


def test_same_seed_same_trace():
    sc = pipeline_scenario(4, 8, "dualpipe", weight_grad="0.5 s")
    first, second = runner.run(sc).trace, runner.run(sc).trace
    assert first.equals(second)


def test_the_two_copies_sum_their_gradients():
    """Rank i and rank p-1-i (same TP and DP index) all-reduce their whole gradient buffers before the optimizer,
    after the data-parallel reduction (optimizer_step.copy_gradient_reduce); no such collective in other schedules."""
    from sim.spec.scenario import load_scenario
    from sim.workload.optimizer_step import copy_gradient_reduce

    sc = load_scenario(ROOT / "scenarios" / "tiny.yaml", ["schedule=dualpipe", "ranks=all", "parallel.tp=1",
                                                         "parallel.dp=2"])
    plan = resolve(sc)
    graph = build(plan)
    reduces = [t for t in graph.tasks if t.name == "copy_grad_all_reduce"]
    grid = plan.grid
    assert len(reduces) == plan.num_gpus
    for task in reduces:
        here = grid.coord(task.rank)
        partner = grid.rank(here.tp, here.dp, plan.pp - 1 - here.pp)
        assert task.group == tuple(sorted((task.rank, partner)))
        assert task.nbytes == plan.stage_params(here.pp) * plan.grad_bytes_per_param
        dp_reduce = {d for d in task.deps if graph.tasks[d].name.startswith("grad_bucket")}
        assert dp_reduce  # after the DP all-reduce of its buckets
        optimizer = next(t for t in graph.tasks if t.rank == task.rank and t.name == "optimizer")
        before, todo = set(), list(optimizer.deps)  # everything the optimizer step waits for
        while todo:
            d = todo.pop()
            if d not in before:
                before.add(d)
                todo.extend(graph.tasks[d].deps)
        assert task.id in before
    one = resolve(load_scenario(ROOT / "scenarios" / "tiny.yaml"))
    assert copy_gradient_reduce(one, 0) is None
    assert not any(t.name == "copy_grad_all_reduce" for t in build(one).tasks)


@pytest.mark.parametrize("schedule, vpp", [("dualpipe", 1), ("dualpipev", 2)])
def test_estimate_replays_the_units(schedule, vpp):
    """The estimate's stage-level replay issues DualPipe's units as the emitters do: with fixed costs and an ideal
    network its pipeline time is the simulated step."""
    from sim import api

    for p, m in ((4, 8), (6, 16)):
        sc = pipeline_scenario(p, m, schedule, forward="1 s", backward="1.5 s", weight_grad="0.5 s",
                               layers_per_stage=vpp, vpp=vpp)
        assert api.estimate(sc).step_time_s == pytest.approx(runner.run(sc).summary.step_time_s, rel=1e-12)


def test_chart_frames_the_pairs(tmp_path):
    """analysis.dualpipe_chart: one block per pass; each framed unit (an F&B pair) is the F and the full backward
    back to back (dense), F + B + W seconds, and there are as many as the code issues pairs."""
    from analysis.dualpipe_chart import dualpipe_scenario, pass_blocks, write_dualpipe_chart

    f, b_input, w = 1.0, 1.0, 0.5
    result = runner.run(dualpipe_scenario(4, 10, forward=f, input_grad=b_input, weight_grad=w))
    blocks = pass_blocks(result)
    assert len(blocks) == 4 * 10 * 3  # every rank: F, B, W of its 10 (micro-batch, chunk) pairs
    durations = {"F": f, "B": b_input, "W": w}
    assert (blocks["end_s"] - blocks["start_s"]).tolist() == pytest.approx(blocks["phase"].map(durations).tolist())
    pairs = [unit for _, unit in blocks.groupby(["rank", "unit"]) if "F" in set(unit["phase"]) and len(unit) > 1]
    expected = sum(token.count("&") for rank in ORDERS["dualpipe 4 10"] for token in rank)
    assert len(pairs) == expected > 0
    for unit in pairs:
        assert list(unit["phase"]) == ["F", "B", "W"]
        assert unit["end_s"].max() - unit["start_s"].min() == pytest.approx(f + b_input + w)
    out = write_dualpipe_chart(tmp_path / "dualpipe.png", [("DualPipe", result, None)])
    assert out.stat().st_size > 10_000


@pytest.mark.parametrize("network", ["analytic", "contention"])
def test_slice_equals_all(network):
    """The copies' all-reduce is one collective its two simulated members meet in, in slice mode too (each would
    otherwise move the bytes on its own and, under contention, load the links twice): slice == all."""
    from sim.spec.scenario import load_scenario

    base = ["schedule=dualpipe", f"network={network}"]
    runs = [runner.run(load_scenario(ROOT / "scenarios" / "tiny.yaml", base + extra)).summary.step_time_s
            for extra in ([], ["ranks=all"])]
    assert runs[0] == pytest.approx(runs[1], rel=1e-6)  # the flow solver sums the folded TP flows in another order


# ------------------------------------------------------------------ MoE: a pair's dispatch/combine overlapped
def _moe_dualpipe(ranks="slice", **parallel):
    from analysis.dualpipe_chart import moe_dualpipe_scenario

    return moe_dualpipe_scenario(ranks, **parallel)


def _exposed_ep(trace, rank):
    """Seconds the ``ep`` stream of ``rank`` runs while its compute stream does not (the streams' own tasks never
    overlap each other, so a sweep over the two interval lists is exact)."""
    mine = trace[trace["rank"] == rank]
    compute = mine[mine["stream"] == "compute"][["start_s", "end_s"]].to_numpy()
    exposed = 0.0
    for start, end in mine[mine["stream"] == "ep"][["start_s", "end_s"]].to_numpy():
        covered = sum(max(0.0, min(end, c_end) - max(start, c_start)) for c_start, c_end in compute)
        exposed += end - start - covered
    return exposed


def _back_to_back(monkeypatch):
    from sim.workload import build as emitter

    monkeypatch.setattr(emitter, "interleave_pair", lambda *args: None)


@pytest.mark.parametrize("parallel", [{}, {"tp": 2, "sequence_parallel": True, "ep": 2}])
def test_moe_pairs_hide_dispatch_and_combine(monkeypatch, parallel):
    """An F&B pair of MoE layers interleaves its passes: each one's all-to-alls run under the other's compute, so
    every rank's exposed ep time and the step are shorter than with the pair's passes back to back; the ep bytes
    are the same."""
    sc = _moe_dualpipe(**parallel)
    paired = runner.run(sc)
    _back_to_back(monkeypatch)
    serial = runner.run(sc)
    for rank in sorted(paired.trace["rank"].unique()):
        hidden, plain = _exposed_ep(paired.trace, rank), _exposed_ep(serial.trace, rank)
        total = float((serial.trace[(serial.trace["rank"] == rank) & (serial.trace["stream"] == "ep")]
                       .eval("end_s - start_s")).sum())
        assert plain == pytest.approx(total, rel=1e-9)  # back to back nothing overlaps an all-to-all
        assert hidden < 0.8 * plain
    assert paired.summary.step_time_s < serial.summary.step_time_s
    ep = [run.trace[run.trace["stream"] == "ep"]["bytes"].sum() for run in (paired, serial)]
    assert ep[0] == ep[1] > 0


def test_moe_pair_alternates_blocks_and_keeps_each_pass_in_order():
    """Inside a pair, the compute stream alternates the F and the B micro-batch at the MoE split points (F first,
    as the code issues them), and each pass's tasks keep their own order on every stream."""
    plan = resolve(_moe_dualpipe())
    graph = build(plan)
    tasks = graph.tasks
    pairs = 0
    for stage, actions in enumerate(plan.schedule.actions(plan.pp, plan.microbatches, plan.vpp)):
        rank = plan.grid.rank(0, 0, stage)
        order = graph.streams[(rank, "compute")]
        for i, action in enumerate(actions[:-1]):
            if not (action.phase == "F" and action.with_next and actions[i + 1].phase == "B"):
                continue
            f_mb, b_mb = action.microbatch, actions[i + 1].microbatch
            seq = [(tasks[t].kind, tasks[t].microbatch) for t in order if tasks[t].kind in ("forward", "backward")
                   and (tasks[t].kind, tasks[t].microbatch) in (("forward", f_mb), ("backward", b_mb))]
            runs = [seq[0]] + [b for a, b in zip(seq[:-1], seq[1:], strict=True) if a != b]
            # 1 layer per stage: F = attention+router | experts | unpermute(+head), B mirrored
            assert runs[:4] == [("forward", f_mb), ("backward", b_mb)] * 2
            assert len(runs) >= 5
            for stream in ("compute", "ep"):
                ids = [t for t in graph.streams[(rank, stream)]
                       if (tasks[t].microbatch, tasks[t].kind) in ((f_mb, "forward"), (b_mb, "backward"),
                                                                   (f_mb, "ep"), (b_mb, "ep"))]
                for mb in (f_mb, b_mb):
                    own = [t for t in ids if tasks[t].microbatch == mb]
                    assert own == sorted(own)
            pairs += 1
    assert pairs > 0


def test_dense_pairs_and_slice_equal_all_for_moe(monkeypatch):
    """A dense model's pairs are not touched (the same trace with the interleaving switched off), and a MoE
    DualPipe step is the same in slice and all modes (every EP member reorders its pairs alike)."""
    moe = [runner.run(_moe_dualpipe(ranks)).summary.step_time_s
           for ranks in ("slice", "all")]
    assert moe[0] == pytest.approx(moe[1], rel=1e-9)
    dense = pipeline_scenario(4, 8, "dualpipe", weight_grad="0.5 s")
    before = runner.run(dense).trace
    _back_to_back(monkeypatch)
    assert runner.run(dense).trace.equals(before)


def test_moe_chart(tmp_path):
    """analysis.dualpipe_chart.write_dualpipe_moe_chart draws the MoE step (docs/images/gantt-dualpipe-moe.png)."""
    from analysis.dualpipe_chart import write_dualpipe_moe_chart

    out = write_dualpipe_moe_chart(tmp_path / "moe.png")
    assert out.stat().st_size > 50_000


def test_interleave_pair_alternates_the_passes_at_their_moe_exchanges():
    """sim.workload.pair_interleave on a hand-built F&B pair of one MoE layer each: F = router | dispatch, experts |
    combine, unpermute; B = its first block | exchange, then a compute task that also waits for F's last task. Cut
    before every compute task that waits for an ep exchange, the blocks alternate F, B, F, B, F; B's edge to F's
    unpermute (now later) moves to the last F compute task before it (the experts); the unit's last task is F's
    unpermute. A pair without exchanges keeps its order and leaves the tail alone."""
    from sim.workload.ir import EP_STREAM, TaskGraph
    from sim.workload.pair_interleave import interleave_pair

    graph = TaskGraph()
    tasks = [("compute", []), (EP_STREAM, [0]), ("compute", [1]), (EP_STREAM, [2]), ("compute", [3]),  # F: 0..4
             ("compute", []), (EP_STREAM, [5]), ("compute", [6, 4])]  # B: 5..7
    for stream, deps in tasks:
        graph.add(0, 0, stream, "ep" if stream == EP_STREAM else "forward", "t", 0, 0, deps, duration=1.0)
    assert interleave_pair(graph, 0, 0, 5, 8) == 4
    assert graph.streams[(0, "compute")] == [0, 5, 2, 7, 4]
    assert graph.streams[(0, EP_STREAM)] == [1, 6, 3]
    assert tuple(graph.tasks[7].deps) == (6, 2)

    dense = TaskGraph()
    for deps in ([], [0], [], [2, 1]):
        dense.add(0, 0, "compute", "forward", "t", 0, 0, deps, duration=1.0)
    assert interleave_pair(dense, 0, 0, 2, 4) is None
    assert dense.streams[(0, "compute")] == [0, 1, 2, 3]
