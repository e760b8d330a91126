"""Context parallelism (issue 24 part A): the grid's tp-cp-dp-pp order, the rules' one-line errors, the closed forms of
sim.parallel.context (ring send volume, causal blocks per chunk, Ulysses all-to-all volume), the ring's overlap in
the simulated task graph, activation memory per GPU, and the estimate against the simulation. Closed forms are
written out here from the shapes, not read back from the code under test."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from sim import runner
from sim.errors import ConfigError
from sim.explore import search
from sim.explore.estimate import estimate
from sim.model.flash_tiles import FLASH_TILE, causal_fraction
from sim.parallel.context import exchanges, executed_share, rank_chunks, ring_makespan, ring_steps, step_shares
from sim.parallel.grid import RankGrid
from sim.plan import resolve
from sim.spec.scenario import load_scenario, scenario_from_dict
from sim.workload.blocks import blocks
from sim.workload.build import build
from sim.workload.footprint import memory_plan

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
CP128K = SCENARIOS / "llama3.1-405b_h100-16384_cp16-128k.yaml"

# Llama 3 8B (32 heads, 8 KV heads of 128) on four DGX H100 nodes.
BASE: dict[str, Any] = {
    "name": "cp-small",
    "cluster": {"gpu": "H100-SXM", "nodes": 4, "gpus_per_node": 8},
    "model": "llama3-8b",
    "training": {"global_batch": 16, "micro_batch": 1, "seq_len": 16384, "flash_attention": True},
    "parallel": {"tp": 2, "pp": 2, "cp": 2, "sequence_parallel": True, "zero": 1},
    "schedule": "1f1b", "costs": "roofline", "network": "analytic",
}


def scenario(**changes: Any) -> Any:
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *path, key = dotted.split("__")
        node = data
        for part in path:
            node = node[part]
        node[key] = value
    return scenario_from_dict(data)


# ------------------------------------------------------------------------------------------------ the grid
def test_grid_follows_megatron_order_tp_cp_dp_pp():
    """Megatron-Core's RankGenerator with order tp-cp-ep-dp-pp: for tp = cp = dp = pp = 2 its CP groups are
    [0, 2], [1, 3], [4, 6], ...; its data-parallel groups with context parallelism [0, 2, 4, 6], [1, 3, 5, 7], ...;
    its pipeline groups [0, 8], ..."""
    grid = RankGrid(tp=2, pp=2, dp=2, gpus_per_node=8, cp=2)
    assert grid.world_size == 16
    assert grid.rank(1, 1, 1, 1) == 1 + 2 * (1 + 2 * (1 + 2 * 1))
    assert all(grid.rank(c.tp, c.dp, c.pp, c.cp) == r for r in range(16) for c in [grid.coord(r)])
    assert grid.cp_group(0) == (0, 2) and grid.cp_group(5) == (5, 7) and grid.cp_group(9) == (9, 11)
    assert grid.dp_group(0) == (0, 2, 4, 6) and grid.dp_group(11) == (9, 11, 13, 15)
    assert grid.pp_group(6) == (6, 14) and grid.tp_group(6) == (6, 7)
    # cp = 1 is the tp-dp-pp grid it was
    plain = RankGrid(tp=2, pp=2, dp=2, gpus_per_node=8)
    assert [plain.rank(t, d, p) for p in range(2) for d in range(2) for t in range(2)] == list(range(8))


def test_experts_fold_over_tp_cp_dp():
    """Megatron-Core's expert RankGenerator (tp-ep-dp-pp over expert_dp = world / (etp x ep x pp)): the experts of
    a stage fold over its tp x cp x dp ranks."""
    grid = RankGrid(tp=2, pp=2, dp=2, gpus_per_node=8, ep=4, etp=1, cp=2)
    assert grid.edp == 2
    assert grid.ep_group(0) == (0, 1, 2, 3) and grid.ep_group(12) == (12, 13, 14, 15)
    assert grid.edp_group(1) == (1, 5)


def test_gradients_reduce_over_dp_times_cp():
    plan = resolve(scenario())  # 32 GPUs: tp 2 x cp 2 x pp 2 -> dp 4
    assert (plan.dp, plan.cp, plan.global_batch, plan.microbatches) == (4, 2, 16, 4)
    graph = build(plan)
    groups = {task.group for task in graph.tasks if task.kind == "dp" and len(task.group) > 1}
    assert groups and all(len(g) == plan.dp * plan.cp for g in groups if g != tuple(range(32)))
    assert plan.optimizer_shards == 8  # the distributed optimizer shards over dp x cp


# ------------------------------------------------------------------------------------------------ the rules
@pytest.mark.parametrize("changes, message", [
    ({"training__seq_len": 16382}, "parallel.cp: seq_len 16382 is not a multiple of 2*cp = 4"),
    ({"training__flash_attention": False}, "parallel.cp: context parallelism runs Transformer Engine's"),
    ({"parallel__cp_comm_type": "a2a", "parallel__tp": 8, "parallel__pp": 1},
     "parallel.cp_comm_type: a2a scatters heads over tp*cp = 16 ranks"),
    ({"parallel__dp": 3}, "parallel: tp*cp*pp*dp = 24 but the cluster has 32 GPUs"),
    ({"parallel__cp": 3}, "parallel: tp*cp*pp = 12 does not divide the cluster's 32 GPUs"),
])
def test_bad_cp_layouts_get_one_line(changes, message):
    with pytest.raises(ConfigError) as error:
        scenario(**changes)
    text = str(error.value)
    assert message in text and "\n" not in text


# --------------------------------------------------------------------------------------- closed forms
def test_load_balanced_chunks():
    cp = 4
    held = [rank_chunks(r, cp) for r in range(cp)]
    assert held == [(0, 7), (1, 6), (2, 5), (3, 4)]
    # every rank holds causal work of chunk indices summing to 2cp - 1 (a light chunk paired with a heavy one)
    assert {a + b for a, b in held} == {2 * cp - 1}


@pytest.mark.parametrize("cp", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("seq_len", [8192, 32768, 131072])
def test_causal_blocks_per_chunk_sum_to_the_unsplit_kernel(cp, seq_len):
    """Over the cp ranks, each computing its (s/cp) x s block of scores, the causal tiles executed are exactly the
    unsplit kernel's: half of the full matrix plus the diagonal tiles, n(n+1)/2 of n^2 with n = s / tile."""
    n = seq_len // FLASH_TILE
    assert executed_share(seq_len, cp, "p2p") == pytest.approx(causal_fraction(seq_len), rel=1e-12)
    assert executed_share(seq_len, cp, "p2p") == pytest.approx(0.5 + 1 / (2 * n), rel=1e-12)
    assert executed_share(seq_len, cp, "all_gather") == executed_share(seq_len, cp, "p2p")
    assert executed_share(seq_len, cp, "a2a") == causal_fraction(seq_len)
    assert executed_share(seq_len, cp, "p2p", causal=False) == 1.0
    # each step: 2 chunk blocks (step 0: one whole and two diagonal), of the rank's 4cp
    shares = step_shares(seq_len, cp)
    m = seq_len // (2 * cp) // FLASH_TILE
    assert shares[0] == pytest.approx((1 + 2 * (m + 1) / (2 * m)) / (4 * cp), rel=1e-12)
    assert all(share == pytest.approx(2 / (4 * cp)) for share in shares[1:])
    assert len(ring_steps(cp)) == cp


def test_cp_flash_kernel_is_the_unsplit_one_divided_by_cp():
    """Megatron's full-matrix FLOPs (MFU) and the executed FLOPs of one rank's flash kernel are 1/cp of the
    unsplit layer's; every other kernel of the layer runs on s/cp tokens."""
    one, four = resolve(scenario(parallel__cp=1, parallel__dp=8)), resolve(scenario(parallel__cp=4, parallel__dp=2))
    flash = {cp: next(op for op in blocks(plan).block["attention"].ops if op.name == "flash_attention")
             for cp, plan in ((1, one), (4, four))}
    assert flash[4].flops * 4 == pytest.approx(flash[1].flops, rel=1e-12)
    assert flash[4].flops * flash[4].executed * 4 == pytest.approx(flash[1].flops * flash[1].executed, rel=1e-12)
    mlp = {cp: sum(op.flops for op in blocks(plan).block["mlp"].ops) for cp, plan in ((1, one), (4, four))}
    assert mlp[4] * 4 == pytest.approx(mlp[1], rel=1e-12)
    assert four.tp_bytes * 4 == one.tp_bytes and four.p2p_bytes * 4 == one.p2p_bytes


def test_ring_send_volume():
    """One ring send carries K and V of the rank's tokens: 2 x b x s/cp x (kv heads / tp x head dim) x 2 bytes.
    Forward: cp-1 sends; backward: K, V at step 0, K, V and dK, dV at steps 1..cp-2, dK, dV at step cp-1:
    2(cp-1) KV volumes in all."""
    b, s, cp, tp, kv_heads, head, elem = 1, 131072, 8, 8, 8, 128, 2
    local, kv_width, q_width = s // cp, kv_heads * head / tp, 128 * head / tp
    kv = 2 * b * local * kv_width * elem
    forward = exchanges("p2p", cp, "forward", b, local, q_width, kv_width, elem)
    backward = exchanges("p2p", cp, "backward", b, local, q_width, kv_width, elem)
    assert [x.op for x in forward] == ["send"] * (cp - 1) and all(x.nbytes == kv for x in forward)
    assert [x.step for x in forward] == list(range(cp - 1))
    assert len(backward) == cp and sum(x.nbytes for x in backward) == 2 * (cp - 1) * kv
    assert kv == 2 * 16384 * 128 * 2  # 8 MiB
    gather = exchanges("all_gather", cp, "backward", b, local, q_width, kv_width, elem)
    assert [(x.op, x.nbytes) for x in gather] == [("all_gather", cp * kv), ("reduce_scatter", cp * kv)]


def test_ulysses_all_to_all_volume():
    """DeepSpeed Ulysses (TE AttnFuncWithCPAndQKVOA2A): each rank sends its s/cp tokens' q, k, v (all its heads)
    before attention and its output after it; the backward sends the output gradient, then dq, dk, dv."""
    b, s, cp, tp, heads, kv_heads, head, elem = 2, 32768, 4, 2, 32, 8, 128, 2
    local = s // cp
    q_width, kv_width = heads * head / tp, kv_heads * head / tp
    qkv = b * local * (heads + 2 * kv_heads) * head / tp * elem
    out = b * local * heads * head / tp * elem
    forward = exchanges("a2a", cp, "forward", b, local, q_width, kv_width, elem)
    backward = exchanges("a2a", cp, "backward", b, local, q_width, kv_width, elem)
    assert [(x.op, x.nbytes, x.where) for x in forward] == [("all_to_all", qkv, "before"), ("all_to_all", out, "after")]
    assert [(x.op, x.nbytes, x.where) for x in backward] == [("all_to_all", out, "before"),
                                                             ("all_to_all", qkv, "after")]
    assert exchanges("a2a", 1, "forward", b, s, q_width, kv_width, elem) == ()


@pytest.mark.parametrize("block, send", [(2.0, 3.0), (3.0, 2.0), (1.0, 1.0)])
def test_ring_makespan_exposes_a_send_only_where_it_outlasts_its_block(block, send):
    cp = 4
    forward = ring_makespan([block] * cp, [send] * (cp - 1))
    assert forward == pytest.approx(block + (cp - 1) * max(block, send))
    assert forward - cp * block == pytest.approx((cp - 1) * max(0.0, send - block))
    backward = ring_makespan([block] * cp, [send] * cp, backward=True)
    assert backward == pytest.approx(cp * max(block, send))


# ------------------------------------------------------------------------------------- the task graph
def _ring(trace, kind: str, cp: int) -> tuple[list[float], list[float], float]:
    """(block durations, send durations, span from the first block's start to the ring's end) of layer 0's first
    micro-batch on rank 0 in ``kind`` (forward or backward; the forward's cp-1 sends come first in the graph)."""
    rows = trace[(trace["rank"] == 0) & (trace["layer"] == 0) & (trace["microbatch"] == 0)].sort_values("task")
    cores = rows[(rows["name"] == "attention_core") & (rows["kind"] == kind)]
    sends = rows[rows["stream"] == "cp"]
    sends = sends.head(cp - 1) if kind == "forward" else sends.tail(cp)
    first, end = cores["start_s"].min(), cores["end_s"].max()
    if kind == "backward":
        end = max(end, sends["end_s"].max())
    return list(cores["end_s"] - cores["start_s"]), list(sends["end_s"] - sends["start_s"]), end - first


@pytest.mark.parametrize("tp, exposed", [(8, True), (1, False)])
def test_simulated_ring_is_the_closed_form(tp, exposed):
    """tp 8 puts the CP ring across nodes (InfiniBand) with 4 heads per rank: each send outlasts its block, and
    the ring is exposed; tp 1 keeps it on NVLink with 32 heads: the sends hide under the blocks."""
    s = scenario(parallel__tp=tp, parallel__pp=1, parallel__cp=4, training__seq_len=8192, parallel__zero=0,
                 parallel__sequence_parallel=tp > 1, training__global_batch=4 * 32 // (4 * tp))
    result = runner.run(s)
    for kind in ("forward", "backward"):
        blocks_, sends, span = _ring(result.trace, kind, 4)
        assert len(blocks_) == 4 and len(sends) == (3 if kind == "forward" else 4)
        assert span == pytest.approx(ring_makespan(blocks_, sends, backward=kind == "backward"), rel=1e-9)
        assert (span > sum(blocks_) * (1 + 1e-6)) == exposed
    assert (result.summary.exposed_comm_s["cp"] > 0) == exposed


def test_stamped_graph_is_the_graph_emitted_layer_by_layer():
    for comm in ("p2p", "all_gather", "a2a"):
        plan = resolve(scenario(parallel__cp_comm_type=comm, training__recompute="full"))
        stamped, emitted = build(plan), build(plan, stamp=False)
        fields = [(t.stream, t.kind, t.name, t.duration, t.op, t.nbytes, t.group, tuple(t.deps)) for t in stamped.tasks]
        assert fields == [(t.stream, t.kind, t.name, t.duration, t.op, t.nbytes, t.group, tuple(t.deps))
                          for t in emitted.tasks]


def test_every_rank_simulated_gives_the_slice():
    s = scenario()
    slice_time = runner.run(s).summary.step_time_s
    every = runner.run(s.model_copy(update={"ranks": "all"})).summary.step_time_s
    assert every == pytest.approx(slice_time, rel=1e-6)


# ------------------------------------------------------------------------------------------------ memory
def test_activation_bytes_per_gpu_fall_by_cp():
    """Each CP rank keeps the activations of s/cp tokens: cp 4 keeps a quarter of cp 1's, per layer and per stage
    (the same sequence and micro-batch; model states are the same per rank, sharded over dp x cp under ZeRO)."""
    one, four = resolve(scenario(parallel__cp=1, parallel__dp=8)), resolve(scenario(parallel__cp=4, parallel__dp=2))
    assert four.activation_bytes() * 4 == pytest.approx(one.activation_bytes(), rel=1e-12)
    rows = {cp: memory_plan(plan) for cp, plan in ((1, one), (4, four))}
    # beside them, the ring's KV buffers while a layer's attention runs (tests/test_cp_kv_buffers.py): 4 blocks
    kv = four.micro_batch * four.local_seq_len * 2 * four.model.kv_dim / four.tp * four.elem_bytes
    for a, b in zip(rows[1], rows[4], strict=True):
        assert (b["activations"] - 4 * kv) * 4 == pytest.approx(a["activations"], rel=1e-9)
        assert b["weights"] == a["weights"] and b["optimizer"] == pytest.approx(a["optimizer"], rel=1e-12)


# ---------------------------------------------------------------------------------------------- estimate
@pytest.mark.parametrize("comm", ["p2p", "all_gather", "a2a"])
@pytest.mark.parametrize("tp", [1, 8])
def test_estimate_within_5_percent_of_the_simulation(comm, tp):
    s = scenario(parallel__tp=tp, parallel__pp=1 if tp == 8 else 2, parallel__cp_comm_type=comm,
                 parallel__sequence_parallel=tp > 1, training__seq_len=32768,
                 **({"parallel__cp": 2} if comm != "a2a" or tp == 1 else {"parallel__cp": 1}))
    simulated = runner.run(s).summary.step_time_s
    assert estimate(s).step_time_s == pytest.approx(simulated, rel=0.05)


def test_bundled_128k_scenario():
    s = load_scenario(CP128K)
    plan = resolve(s)
    assert (plan.tp, plan.cp, plan.pp, plan.dp, plan.local_seq_len) == (8, 16, 16, 8, 8192)
    simulated = runner.run(s).summary
    assert estimate(s).step_time_s == pytest.approx(simulated.step_time_s, rel=0.05)
    assert simulated.exposed_comm_s["cp"] > 0
    assert all(row["fits"] for row in memory_plan(plan))


# ------------------------------------------------------------------------------------------------ search
def test_search_enumerates_cp_and_its_comm_types():
    """cp over the divisors of the GPUs left by tp x pp that leave each rank >= CP_MIN_LOCAL_TOKENS tokens (16K
    tokens: cp 2 and 4, not 8), each with p2p, all_gather and a2a; every one a layout ``sim run`` accepts."""
    base = scenario()
    only = search.parse_only(["tp=2", "pp=2", "zero=1", "recompute=none", "schedule=1f1b", "micro_batch=1",
                              "sequence_parallel=true"])
    table = search.screen(base, list(search.layouts(base, only=only)))
    assert set(zip(table["cp"], table["cp_comm_type"], strict=True)) == {
        (1, "p2p"), *((cp, comm) for cp in (2, 4) for comm in search.CP_COMM_TYPES)}
    assert (table["status"] == "ok").all()
    assert set(table["dp"]) == {8, 4, 2}
    first = table.iloc[0]
    simulated = runner.run(search.candidate(base, search.layout_of(first))).summary.step_time_s
    assert first["est_step_time_s"] == pytest.approx(simulated, rel=0.05)
    narrowed = search.layouts(base, only=search.parse_only(["cp=8", "tp=2", "pp=2", "zero=1", "recompute=none",
                                                            "schedule=1f1b", "micro_batch=1"]))
    assert {layout.cp for layout in narrowed} == {8}  # --only cp overrides the token floor
