"""The closed-form estimate (sim.explore.estimate) against the event simulation: within 5% on every bundled scenario
and on layouts of every schedule and ZeRO stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim import runner
from sim.explore.estimate import Estimator, estimate
from sim.explore.stage_replay import StageTimes, after_last_weight, pass_dependencies, stage_level_replay
from sim.parallel.schedules import SCHEDULES
from sim.plan import resolve
from sim.spec.scenario import load_scenario

SCENARIOS = sorted((Path(__file__).resolve().parent.parent / "scenarios").glob("*.yaml"))
GPT3 = Path(__file__).resolve().parent.parent / "scenarios" / "gpt3-175b_a100-1024.yaml"


@pytest.mark.xdist_group("bundled-runs")
@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_estimate_within_5_percent_of_the_simulation(path: Path, bundled_run) -> None:
    scenario = load_scenario(path)
    simulated = bundled_run(path.name).summary  # runner.run(scenario), shared with test_trace_invariants
    est = estimate(scenario)
    assert est.step_time_s == pytest.approx(simulated.step_time_s, rel=0.05)
    assert est.bound_s <= simulated.step_time_s
    assert est.peak_memory_bytes == pytest.approx(simulated.peak_memory_bytes.max, rel=0.05)  # sim check's plan


@pytest.mark.parametrize("layout", [
    ["schedule=gpipe"], ["schedule=interleaved", "parallel.vpp=3"], ["schedule=zb-h1"], ["schedule=zb-h2"],
    ["schedule=zb-v", "parallel.vpp=2"], ["parallel.zero=1", "schedule=interleaved", "parallel.vpp=4"],
    ["parallel.pp=16", "parallel.tp=4"], ["training.recompute=full", "parallel.pp=4"],
    ["parallel.zero=3", "parallel.pp=1", "training.micro_batch=2"],
    ["parallel.zero=2", "parallel.pp=1", "training.global_batch=1536"],  # 12 micro-batches: reduce-scatter bound
    # FSDP + PP interleaved, 4 micro-batches: the later chunks' once-per-step gathers not done when reached (was -8%)
    ["parallel.zero=3", "fsdp.sharding=FULL_SHARD", "parallel.pp=2", "schedule=interleaved", "parallel.vpp=6"],
    # ZeRO-1's per-bucket gathers dispatched as the compute reaches them: each stage's hold delays the next (was -18%)
    ["parallel.zero=1", "parallel.overlap_param_gather=true"],
    # zero-bubble under TE's chunked TP overlap and under CP: the B pass without the weight gradients (was -18%)
    ["schedule=zb-h1", "parallel.tp_comm_overlap=true"],
    ["schedule=zb-v", "parallel.vpp=2", "parallel.tp_comm_overlap=true"],
    ["schedule=zb-h1", "training.flash_attention=true", "parallel.cp=2", "parallel.tp_comm_overlap=true"],
], ids=lambda o: ",".join(o))
def test_estimate_within_5_percent_across_layouts(layout: list[str]) -> None:
    scenario = load_scenario(GPT3, ["training.global_batch=256", "parallel.dp=null", *layout])
    simulated = runner.run(scenario).summary.step_time_s
    assert Estimator(scenario).estimate(scenario).step_time_s == pytest.approx(simulated, rel=0.05)


SPINE = Path(__file__).resolve().parent.parent / "scenarios" / "llama2-7b_h100-32_spine.yaml"


@pytest.mark.parametrize("layout", [
    # Llama-2 7B, tp 8 over 4 nodes, dp free (16 sequences: 4 micro-batches at pp 1, 2 at pp 2), the DP all-reduce
    # through a 4:1 oversubscribed spine (about 0.2 s, mostly exposed). Under a split backward a layer's gradients
    # are final after the last micro-batch's W pass, not its B pass, so the buckets start inside W: the estimate
    # that started them inside B was optimistic by the B pass (signed error before -> after the fix)
    ["parallel.pp=2", "schedule=zb-h1"],  # -2.9% -> +0.0%
    ["parallel.pp=2", "schedule=zb-h1", "training.recompute=selective"],  # -3.0% -> +0.0%
    ["parallel.pp=2", "schedule=zb-h1", "training.recompute=full"],  # -4.8% -> +0.0%
    ["parallel.pp=2", "schedule=zb-h2", "training.recompute=full"],  # -4.8% -> +0.1%
    ["parallel.pp=1", "schedule=zb-h1", "training.recompute=full"],  # -8.1% -> -0.0%
    # 2 micro-batches at pp 2 (m < 2p: the stage-level replay), whose stage ends are now the last W's: -14.0% -> -0.4%
    ["parallel.tp=2", "parallel.pp=2", "schedule=zb-h1", "training.recompute=full"],
    # two chunks a stage: chunk 1's last W runs before chunk 0's last B and W (stage_replay.after_last_weight), so its
    # buckets start earlier (-0.4% and -1.7% before; +2.8% and +2.3% with every chunk's W taken as the stage's last)
    ["parallel.pp=2", "schedule=zb-v", "parallel.vpp=2"],  # +1.0%
    ["parallel.pp=2", "schedule=dualpipev", "parallel.vpp=2"],  # -0.2%
    ["parallel.pp=2", "schedule=1f1b"],  # the unsplit backward, unchanged: +0.2%
], ids=lambda o: ",".join(o))
def test_estimate_holds_the_dp_tail_after_the_weight_gradient_pass(layout: list[str]) -> None:
    scenario = load_scenario(SPINE, ["parallel.dp=null", *layout])
    simulated = runner.run(scenario).summary.step_time_s
    # 2%, tighter than the 5% the screen is held to elsewhere: the first three cases were off by 3-5%
    assert Estimator(scenario).estimate(scenario).step_time_s == pytest.approx(simulated, rel=0.02)


def _flags(grad: bool, param: bool | None = None) -> list[str]:
    flags = [f"parallel.overlap_grad_reduce={str(grad).lower()}"]
    return flags + ([f"parallel.overlap_param_gather={str(param).lower()}"] if param is not None else [])


@pytest.mark.parametrize("layout", [
    # Llama-2 7B, tp 8, dp free: dp 4 across the 4:1 spine at pp 1 (4 micro-batches), dp 2 under one leaf at pp 2
    # (8 micro-batches); each of the 8 TP ranks' DP groups runs its collectives at once, through the same leaf
    # uplinks (the flow network: Estimator._dp_collective). Signed error before -> after (main at fa2927c).
    ["parallel.zero=0", "parallel.pp=1", *_flags(True)],  # -0.1%
    ["parallel.zero=0", "parallel.pp=1", *_flags(False)],  # +0.0%
    ["parallel.zero=0", "parallel.pp=2", *_flags(True)],  # +0.2%
    ["parallel.zero=0", "parallel.pp=2", *_flags(False)],  # +0.2%
    # ZeRO-1/2: the weight all-gather after the step priced for one DP group alone, half the spine's time
    ["parallel.zero=1", "parallel.pp=1", *_flags(True, False)],  # -6.5% -> -0.2%
    ["parallel.zero=1", "parallel.pp=1", *_flags(True, True)],  # -0.3%
    ["parallel.zero=1", "parallel.pp=1", *_flags(False, False)],  # -5.8% -> -0.0%
    ["parallel.zero=1", "parallel.pp=1", *_flags(False, True)],  # -0.1%
    ["parallel.zero=1", "parallel.pp=2", *_flags(True, False)],  # +0.2%
    ["parallel.zero=1", "parallel.pp=2", *_flags(True, True)],  # +0.2%
    ["parallel.zero=1", "parallel.pp=2", *_flags(False, False)],  # +0.2%
    ["parallel.zero=1", "parallel.pp=2", *_flags(False, True)],  # +0.2%
    ["parallel.zero=2", "parallel.pp=1", *_flags(True, False)],  # -7.5% -> -0.2%
    ["parallel.zero=2", "parallel.pp=1", *_flags(True, True)],  # -0.3%
    ["parallel.zero=2", "parallel.pp=1", *_flags(False, False)],  # -4.1% -> +0.5%
    ["parallel.zero=2", "parallel.pp=1", *_flags(False, True)],  # +0.5%
    # ZeRO-3 / FSDP: the units' gathers and reduce-scatters priced for one group alone, the embedding and head
    # units left out, a blocking reduce-scatter counted twice, the last buckets again after the backward
    ["parallel.zero=3", "parallel.pp=1", *_flags(True)],  # -47.0% -> +0.7%
    ["parallel.zero=3", "parallel.pp=1", *_flags(False)],  # -14.8% -> -0.1%
    ["parallel.zero=3", "deepspeed.stage3_prefetch_bucket_size=50000000"],  # DeepSpeed's buckets: -42.8% -> -0.1%
    ["parallel.zero=3", "fsdp.prefetch=false"],  # -37.2% -> +0.4%
    ["parallel.zero=3", "fsdp.unit_layers=4"],  # -46.6% -> +0.7%
    ["fsdp.sharding=SHARD_GRAD_OP", "parallel.pp=1", *_flags(True)],  # -30.5% -> +0.1%
    ["fsdp.sharding=SHARD_GRAD_OP", "parallel.pp=1", *_flags(False)],  # -15.9% -> -0.2%
    ["fsdp.sharding=SHARD_GRAD_OP", "cluster.fabric.oversubscription=1"],  # gathers under the forward: -3.8% -> -1.7%
    ["fsdp.sharding=HYBRID_SHARD", "parallel.pp=1", *_flags(True)],  # replicas' all-reduce: -32.0% -> -0.4%
    ["fsdp.sharding=HYBRID_SHARD", "parallel.pp=1", *_flags(False)],  # -27.9% -> +0.4%
    # FSDP + PP (ZeRO-2/3 at pp 2): without overlap_grad_reduce a stage's chunk reductions delay its last send
    ["fsdp.sharding=FULL_SHARD", "parallel.pp=2", *_flags(True)],  # +0.2%
    ["fsdp.sharding=FULL_SHARD", "parallel.pp=2", *_flags(False)],  # +16.2% -> +0.2%
    ["fsdp.sharding=SHARD_GRAD_OP", "parallel.pp=2", *_flags(True)],  # +0.2%
    ["fsdp.sharding=SHARD_GRAD_OP", "parallel.pp=2", *_flags(False)],  # +16.2% -> +0.2%
    ["fsdp.sharding=HYBRID_SHARD", "parallel.pp=2", *_flags(False)],  # +29.8% -> +0.2%
    # DualPipe's two model copies summed after the DP buckets: every DP replica's pairs of stages at once
    # (+1.6% -> -0.3%: stage 1's buckets in the order its chunks' last W passes end, Estimator._chunk_order)
    ["parallel.pp=2", "schedule=dualpipe", "training.global_batch=32"],  # -20.0% -> +1.6% -> -0.3%
], ids=lambda o: ",".join(o))
def test_estimate_holds_every_data_parallel_strategy_on_the_spine(layout: list[str]) -> None:
    """The estimate within 2% of the simulation for each ZeRO stage (0-3, FSDP's strategies), at pp 1 and 2,
    with and without overlap_grad_reduce / overlap_param_gather, where the DP collectives are slow (the spine)."""
    scenario = load_scenario(SPINE, ["parallel.dp=null", *layout])
    simulated = runner.run(scenario).summary.step_time_s
    assert Estimator(scenario).estimate(scenario).step_time_s == pytest.approx(simulated, rel=0.02)


def test_stage_level_replay_ends_a_split_stage_at_its_last_weight_pass() -> None:
    """ZB-H1 at p 2, m 2, F 1, B 2, W 1, no p2p time: stage 1 runs F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7] W0 [7,8]
    W1 [8,9]; stage 0 runs F0 F1 [0,2], B0 [4,6] (after stage 1's B0), W0 [6,7], B1 [7,9], W1 [9,10]. Its
    gradients are final at the last W (10 and 9), not the last B (9 and 7); 1F1B's stay at its last B."""
    def replay(name: str, weight: float) -> tuple[float, list[float]]:
        schedule = SCHEDULES[name]
        chunks, units = pass_dependencies(schedule.actions(2, 2, 1), schedule.layout, None)
        return stage_level_replay(chunks, units, [StageTimes(1.0, 2.0, weight, 0.1, 1)] * 2, 0.0)

    assert replay("zb-h1", 1.0) == (10.0, [10.0, 9.0])
    assert replay("1f1b", 0.0) == (9.0, [9.0, 7.0])  # F0 F1 [0,2], B0 [4,6], B1 [7,9]; stage 1's B1 [5,7]


@pytest.mark.parametrize("name, v", [("zb-h1", 1), ("zb-h2", 1), ("zb-v", 2), ("dualpipe", 1), ("dualpipev", 2)])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_the_passes_after_each_chunks_last_weight_pass_do_not_depend_on_m(name: str, v: int, p: int) -> None:
    """Estimator._after_last_weight builds a schedule's order at m = 2p only: its cool-down is the same for more
    micro-batches. ZB-H1/H2 end every stage on the W of its one chunk; ZB-V's stage 0 runs chunk 0's last p-1 B
    and p W after chunk 1's last W (its V turns there), its last stage chunk 0's last W after chunk 1's."""
    schedule = SCHEDULES[name]
    chunks = 2 if schedule.layout in ("v", "dual") else 1
    at_2p = after_last_weight(schedule.actions(p, 2 * p, v), chunks)
    for m in (2 * p + 2, 3 * p, 8 * p + 2):
        assert after_last_weight(schedule.actions(p, m, v), chunks) == at_2p
    if name.startswith("zb-h"):
        assert at_2p == (((0, 0, 0),),) * p
    if name == "zb-v":
        assert at_2p[0] == ((0, 0, 0), (0, p - 1, p)) and at_2p[-1] == ((0, 0, 0), (0, 0, 1))


@pytest.mark.parametrize("name, v", [("zb-v", 2), ("dualpipe", 1), ("dualpipev", 2)])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_the_tail_takes_a_stages_chunks_in_the_order_their_last_weight_passes_end(name: str, v: int, p: int) -> None:
    """Estimator._chunk_order: a stage's local chunks in the order of their last W in the schedule's order at the
    layout's own m (the emitter fills its buckets with the layers sorted by grad_ready), the chunk holding the
    embedding last (the tail puts the embedding's gradients after the last chunk's). DualPipe's later half of the
    stages finishes its local chunk 0 first, not the last local chunk as the other layouts do."""
    scenario = load_scenario(SPINE, ["parallel.dp=null", "parallel.tp=4", f"parallel.pp={p}", f"schedule={name}",
                                     f"parallel.vpp={v}", "training.global_batch=64"])
    plan = resolve(scenario)
    estimator = Estimator(scenario)
    for stage, order in enumerate(plan.schedule.actions(p, plan.microbatches, v)):
        last_weight = {action.chunk: at for at, action in enumerate(order) if action.phase == "W"}
        chunks = estimator._chunk_order(plan, stage)
        assert chunks == tuple(sorted(last_weight, key=last_weight.__getitem__))
        if plan.holds_embedding(stage):
            assert 0 in plan.chunk_layers(plan.stage_chunks[stage][chunks[-1]])
        assert chunks == ((0, 1) if name == "dualpipe" and stage >= p // 2 else (1, 0))


@pytest.mark.parametrize("schedule, closed_form_ms", [
    ("gpipe", (8 + 4 - 1) * (2 + 4)),  # (m + p - 1)(F + B), F = 2 layers x 1 ms, B = 2 layers x 2 ms
    ("1f1b", (8 + 4 - 1) * (2 + 4)),
    ("zb-h1", 8 * (2 + 2 + 2) + (4 - 1) * (2 + 2 - 2)),  # m(F+B+W) + (p-1)(F+B-W), Qi et al. Sec. 3.1
])
def test_estimate_is_the_closed_form_with_fixed_costs(schedule: str, closed_form_ms: int) -> None:
    path = Path(__file__).resolve().parent.parent / "scenarios" / "pipeline-4x8.yaml"
    scenario = load_scenario(path, [f"schedule={schedule}"])
    assert estimate(scenario).step_time_s == pytest.approx(closed_form_ms / 1e3, rel=1e-12)
    assert runner.run(scenario).summary.step_time_s == pytest.approx(closed_form_ms / 1e3, rel=1e-12)


MIXTRAL = Path(__file__).resolve().parent.parent / "scenarios" / "mixtral-8x7b_h100-64.yaml"
DEEPSEEK = Path(__file__).resolve().parent.parent / "scenarios" / "deepseek-v3_h800-2048.yaml"


@pytest.mark.parametrize("path, layout", [
    # pp 1, 8 micro-batches: each layer's expert weights (704 MB over edp 16) gather for longer than the layer's
    # forward, so micro-batch 0 runs at the expert chain's pace (was -4.0% without the expert chain)
    (MIXTRAL, ["parallel.tp=2", "parallel.pp=1", "parallel.vpp=1", "schedule=1f1b", "parallel.dp=null",
               "parallel.ep=4", "parallel.etp=1"]),
    # 1F1B at pp 16, ep 8 (edp 256): the first stage's expert gathers hold every later stage back (was -6.6%)
    (DEEPSEEK, ["schedule=1f1b", "parallel.ep=8"]),
], ids=["mixtral-tp2-pp1-ep4", "deepseek-v3-1f1b-ep8"])
def test_estimate_holds_the_expert_weight_gathers(path: Path, layout: list[str]) -> None:
    """ZeRO-1 with overlap_param_gather gathers a MoE model's expert weights per bucket over the expert-data-parallel
    group on their own stream (step.expert_param_gather_buckets); the first micro-batch's forward waits for them as
    for the dense buckets, and the estimate's gather delay walks both chains."""
    scenario = load_scenario(path, layout)
    simulated = runner.run(scenario).summary
    est = Estimator(scenario).estimate(scenario)
    assert est.step_time_s == pytest.approx(simulated.step_time_s, rel=0.05)
    # the delay is the step's exposed data-parallel time before the forward, here most of it
    assert est.exposed_dp_s > 0.5 * simulated.exposed_comm_s["dp"]


QWEN3_TP4 = (Path(__file__).resolve().parent.parent / "scenarios" / "validation" / "moe"
             / "mz-qwen3-235b-h100-256-deepep-tp4.yaml")


def test_estimate_prices_a_recomputed_moe_layer_as_one_host_bound_pass() -> None:
    """Full recomputation reruns a MoE layer's forward, its host sync and eager ops included, inside the backward
    (sim.workload.build's ``_layer_tasks``): the host issues both in one pass, which lasts max(device forward +
    backward, host forward + backward). At micro-batch 2 the forward is host-bound and the backward device-bound,
    so the sum of the two passes' own maxima (the estimate before) was 9.5% over the simulated pass and +5.4% on
    the step at global batch 2048 (+4.1% at 512; +4.4% with the Qwen3 rows as they ran, -1.2% now)."""
    scenario = load_scenario(QWEN3_TP4, ["parallel.vpp=12", "training.micro_batch=2", "training.recompute=full",
                                         "parallel.ep=4", "parallel.dp=8", "training.global_batch=512"])
    result = runner.run(scenario)
    estimator = Estimator(scenario)
    est = estimator.estimate(scenario)
    assert est.step_time_s == pytest.approx(result.summary.step_time_s, rel=0.05)
    (layer, _), = estimator._layers.values()
    assert layer.rebuilt_moe > 0 and layer.moe[0] > layer.rebuilt_moe  # the forward alone is host-bound
    # every layer of Qwen3-235B is a MoE layer: a middle stage's recomputed backward pass per (micro-batch, layer),
    # from SP's all-gather that its first compute task waits for to its last task
    trace = result.trace
    rank = trace[(trace["stage"] == 1) & (trace["layer"] >= 0)]["rank"].min()
    tasks = trace[(trace["rank"] == rank) & (trace["layer"] >= 0)]
    passes = tasks[(tasks["stream"] == "compute") & tasks["kind"].isin(["backward", "recompute"])]
    span = passes.groupby(["microbatch", "layer"]).agg(start=("start_s", "min"), end=("end_s", "max"))
    gathers = tasks[tasks["name"] == "all_gather"].groupby(["microbatch", "layer"])
    starts = []
    for (mb, layer_id), start in span["start"].items():
        gather = gathers.get_group((mb, layer_id))
        led = gather[(gather["end_s"] <= start + 1e-12) & (gather["end_s"] >= start - 1e-6)]  # the one it waited for
        starts.append(min(start, led["start_s"].min()) if len(led) else start)
    spans = span["end"] - starts
    led = spans[spans > span["end"] - span["start"]]  # the passes whose compute waited for their gather (the
    assert len(led) > 10  # others' ran under the previous pass: 0.2 ms less, as the estimate does not price it)
    assert layer.moe[1] + layer.rebuilt_moe == pytest.approx(led.median(), rel=0.01)
