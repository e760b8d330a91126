"""moe.a2a_overlap: Megatron-Core's EP A2A overlap (--overlap-moe-expert-parallel-comm --delay-wgrad-compute, the
combined 1F1B; docs/mechanisms/a2a_overlap.md): its schedule, the rules it needs, a steady pair's span in closed
form on the trace (exposed A2A = max(0, exchanges - the other pass's compute under them)), and the estimate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from sim import runner
from sim.api import estimate
from sim.cli import main
from sim.errors import SimError
from sim.explore.pair_replay import Block, pair_span
from sim.interop.emit import emit
from sim.parallel.schedules import A2A_OVERLAP, SCHEDULES, combined_pairs, interleaved
from sim.plan import resolve
from sim.spec.scenario import Scenario, load_scenario, scenario_from_dict

from conftest import SCENARIOS, small_moe_model

QWEN3_OVERLAP = SCENARIOS / "validation" / "moe" / "mz-qwen3-235b-h100-256-deepep-ep32-overlap.yaml"


@pytest.mark.parametrize(("p", "m", "v"), [(1, 4, 1), (4, 8, 2), (8, 16, 4), (4, 4, 2)])
def test_the_combined_1f1b_order(p: int, m: int, v: int) -> None:
    """The interleaved order with one more warm-up forward per stage (all forwards when m = p); every later
    forward issued with the backward after it (``with_next``); the same passes as the interleaved schedule."""
    plain, combined = interleaved(p, m, v), A2A_OVERLAP["interleaved"].actions(p, m, v)
    for s in range(p):
        strip = [(a.phase, a.microbatch, a.chunk) for a in combined[s]]
        assert sorted(strip) == sorted((a.phase, a.microbatch, a.chunk) for a in plain[s])
        warmup = next(i for i, a in enumerate(plain[s]) if a.phase == "B") - (0 if m == p else 1)
        assert next(i for i, a in enumerate(combined[s]) if a.phase == "B") == min(warmup + 1, m * v) + (
            0 if m == p else 1)
        pairs = [i for i, a in enumerate(combined[s]) if a.with_next]
        assert all(combined[s][i].phase == "F" and combined[s][i + 1].phase == "B" for i in pairs)
        assert len(pairs) == max(m * v - min(warmup + 1, m * v), 0)
    if p == 1:  # no pipelining: F0, (F i+1, B i) ..., B last (combined_1f1b_schedule_for_no_pipelining)
        assert [(a.phase, a.microbatch, a.with_next) for a in combined[0]] == (
            [("F", 0, False)] + [x for i in range(m - 1) for x in (("F", i + 1, True), ("B", i, False))]
            + [("B", m - 1, False)])


def _doc(a2a: bool, bandwidth: str, **changes: Any) -> dict[str, Any]:
    """One MoE layer, no pipeline, ep 8 over one node, the flex dispatcher with its NVLink bandwidth set (so an
    exchange is exactly bytes / bandwidth), no SMs held by it (``deepep_sms`` 0, tested on its own below) and no
    host bound (``host_sync`` false, tests/test_moe_host_sync.py),
    8 micro-batches of 4096 tokens."""
    doc: dict[str, Any] = {
        "name": "a2a", "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
        "model": small_moe_model("moe-one", num_layers=1, hidden_size=2048, heads=16, ffn_hidden_size=4096,
                                 max_seq_len=4096),
        "training": {"global_batch": 64, "micro_batch": 1, "seq_len": 4096, "flash_attention": True},
        "parallel": {"tp": 1, "pp": 1, "ep": 8, "zero": 1},
        "moe": {"token_dispatcher": "flex", "deepep_nvlink_bandwidth": bandwidth, "a2a_overlap": a2a,
                "deepep_sms": 0, "host_sync": False},
        "schedule": "1f1b",
    }
    for section, values in changes.items():
        doc[section] = {**doc.get(section, {}), **values} if isinstance(values, dict) else values
    return doc


def _small(a2a: bool, bandwidth: str, **changes: Any) -> Scenario:
    return scenario_from_dict(_doc(a2a, bandwidth, **changes))


def _pair(trace: pd.DataFrame, j: int) -> tuple[float, dict[str, float], dict[str, float]]:
    """The steady pair (F of micro-batch j, B of j-1): its span from F's first compute task to B's last, and the
    compute seconds of each pass's blocks by task name."""
    compute = trace[trace["stream"] == "compute"]
    fwd = compute[(compute["microbatch"] == j) & (compute["kind"] == "forward")]
    bwd = compute[(compute["microbatch"] == j - 1) & compute["kind"].isin(["backward", "recompute"])]
    span = bwd["end_s"].max() - fwd["start_s"].min()

    def by_name(frame: pd.DataFrame) -> dict[str, float]:
        return (frame["end_s"] - frame["start_s"]).groupby(frame["name"]).sum().to_dict()

    return span, by_name(fwd), by_name(bwd)


def test_a_compute_bound_pair_hides_all_four_exchanges() -> None:
    """Exchanges much shorter than the blocks beside them: the pair takes F's and B's compute, nothing more
    (exposed A2A = max(0, a2a - overlapping compute) = 0), where each pass alone also waits for its two."""
    run = runner.run(_small(True, "2000 GB/s"))
    a = run.plan.deepep_seconds[0]
    span, f, b = _pair(run.trace, 4)
    assert span == pytest.approx(sum(f.values()) + sum(b.values()), rel=1e-9)
    alone = runner.run(_small(False, "2000 GB/s"))
    assert alone.summary.step_time_s - run.summary.step_time_s == pytest.approx(
        (alone.plan.microbatches - 1) * 4 * a, rel=0.02)


def test_an_exchange_bound_pair_exposes_the_a2a_less_the_compute_under_it() -> None:
    """Exchanges much longer than any block: the compute stream runs F's attention+router (f0), B's unpermute
    gradient (b0) beside F's dispatch, F's experts (f1) and B's experts (b1) beside the next exchanges, F's
    unpermute (f2) after F's combine, B's router+attention (b2) after B's dispatch gradient; the ep stream runs
    the four exchanges back to back. Span = f0 + 4a + b2, i.e. exposed A2A = 4a - (b0 + f1 + b1 + f2)."""
    run = runner.run(_small(True, "5 GB/s"))
    a_dispatch, a_combine = run.plan.deepep_seconds
    span, f, b = _pair(run.trace, 4)
    f0 = f["attention"] + f["moe_router"] + f.get("embedding", 0.0)
    b2 = b["moe_router"] + b["attention"] + b.get("embedding", 0.0) + b.get("attention_recompute", 0.0)
    exchanges = 2 * a_dispatch + 2 * a_combine
    assert span == pytest.approx(f0 + exchanges + b2, rel=1e-9)
    overlapped = sum(f.values()) + sum(b.values()) - f0 - b2
    assert span - (sum(f.values()) + sum(b.values())) == pytest.approx(max(0.0, exchanges - overlapped), rel=1e-9)


def test_deepeps_sms_slow_the_compute_under_the_exchanges() -> None:
    """DeepEP holds n = 20 of the H100's S = 132 SMs while it runs. In a compute-bound pair every exchange runs
    under compute, and a compute task overlapped by H SM-seconds of it takes d + H/S at the fixed point
    (sim.engine.sm_contention): the pair is its base compute plus (n/S) x its four exchanges."""
    base = runner.run(_small(True, "2000 GB/s"))
    held = runner.run(_small(True, "2000 GB/s", moe={"deepep_sms": 20}))
    assert held.plan.deepep_sms == 20 and base.plan.deepep_sms == 0
    a_dispatch, a_combine = held.plan.deepep_seconds
    span, _, _ = _pair(held.trace, 4)
    base_span, f, b = _pair(base.trace, 4)
    assert base_span == pytest.approx(sum(f.values()) + sum(b.values()), rel=1e-9)
    assert span == pytest.approx(base_span + 20 / 132 * 2 * (a_dispatch + a_combine), rel=1e-4)


@pytest.mark.parametrize("bandwidth", ["2000 GB/s", "100 GB/s", "5 GB/s"])
@pytest.mark.parametrize("sms", [0, 20])
def test_the_estimate_prices_the_pairs_as_the_simulation_does(bandwidth: str, sms: int) -> None:
    """What the overlap saves, estimated (the stage-level replay of the combined order, each pair less what its
    interleaving hides, DeepEP's SMs slowing the compute under its exchanges: sim.explore.pair_replay) =
    simulated; the whole step within 3% (the estimate's data-parallel tail of this one-layer model is 1.6 ms
    short with or without the overlap)."""
    steps = {}
    for a2a in (False, True):
        scenario = _small(a2a, bandwidth, moe={"deepep_sms": sms})
        steps[a2a] = estimate(scenario).step_time_s, runner.run(scenario).summary.step_time_s
        assert steps[a2a][0] == pytest.approx(steps[a2a][1], rel=0.03)
    # to 0.1%, or to a few microseconds: the SM stretch settles each task to 1 us (sim.engine.sm_contention)
    assert steps[False][0] - steps[True][0] == pytest.approx(steps[False][1] - steps[True][1], rel=1e-3, abs=5e-6)


@pytest.mark.parametrize(("change", "message"), [
    ({"parallel": {"ep": 1}}, r"moe\.a2a_overlap: needs expert parallelism"),
    ({"moe": {"token_dispatcher": "allgather"}}, r"moe\.a2a_overlap: needs the alltoall or flex token dispatcher"),
    ({"training": {"recompute": "full"}}, r"training\.recompute: full recomputation"),
    ({"training": {"recompute": "selective", "recompute_modules": ["moe"]}},
     r"training\.recompute_modules: module moe"),
    ({"training": {"dtype": "fp32"}}, r"training\.dtype: moe\.a2a_overlap needs a bf16"),
    # Megatron-Core's MoE README: "Requirements for EP A2A Overlap: ... CUDA_DEVICE_MAX_CONNECTIONS > 1"
    ({"parallel": {"cuda_device_max_connections": 1}},
     r"^parallel\.cuda_device_max_connections: moe\.a2a_overlap needs more than 1 hardware queue"),
    ({"schedule": "gpipe", "parallel": {"pp": 2, "ep": 4}, "model": {"num_layers": 2}},
     r"schedule: moe\.a2a_overlap with pp = 2"),
    # transformer_config.py: "virtual_pipeline_model_parallel_size must be specified when
    # pipeline_model_parallel_size > 1", and arguments.py turns a virtual size of 1 into None
    ({"schedule": "interleaved", "parallel": {"pp": 2, "ep": 4, "vpp": 1}, "model": {"num_layers": 2}},
     r"^parallel\.vpp: moe\.a2a_overlap with pp = 2 needs virtual pipeline stages \(vpp >= 2, not 1"),
])
def test_megatrons_conditions_each_refused_in_one_line(change: dict[str, Any], message: str) -> None:
    with pytest.raises(SimError, match=message):
        _small(True, "100 GB/s", **change)


def test_sim_check_and_emit_refuse_a2a_overlap_without_virtual_stages(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """pp > 1 at vpp 1 is a layout Megatron-Core refuses under --overlap-moe-expert-parallel-comm (its combined 1F1B
    runs only without pipelining or interleaved): `sim check` says so in one line naming parallel.vpp, and
    `sim search --emit megatron` no longer writes the script Megatron would refuse (the scenario does not load)."""
    doc = _doc(True, "100 GB/s", schedule="interleaved", parallel={"pp": 2, "ep": 4, "vpp": 1},
               model={"num_layers": 2}, moe={"deepep_sms": 24})
    path = tmp_path / "a2a.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["check", str(path)]) != 0
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: parallel.vpp: moe.a2a_overlap with pp = 2 needs virtual pipeline stages")
    assert "\n" not in error
    with pytest.raises(SimError, match=r"^parallel\.vpp: moe\.a2a_overlap with pp = 2"):
        emit(load_scenario(path), "megatron")
    # vpp 2: Megatron's interleaved combined 1F1B, emitted with its virtual stages
    doc["parallel"]["vpp"], doc["model"]["num_layers"] = 2, 4
    path.write_text(yaml.safe_dump(doc))
    text = emit(load_scenario(path), "megatron").text
    assert "--num-virtual-stages-per-pipeline-rank 2" in text and "--overlap-moe-expert-parallel-comm" in text


def test_the_plan_picks_the_combined_schedule_only_for_a_moe_model_with_the_knob() -> None:
    assert resolve(_small(True, "100 GB/s")).schedule is A2A_OVERLAP["1f1b"]
    assert resolve(_small(False, "100 GB/s")).schedule is SCHEDULES["1f1b"]
    plan = resolve(load_scenario(QWEN3_OVERLAP))
    assert plan.a2a_overlap and plan.schedule is A2A_OVERLAP["interleaved"]


def test_a_pair_span_with_sms_held_by_the_exchanges() -> None:
    """pair_span with ``held`` = n/S: F's first block (2 s) issues a 1 s exchange, which runs 2-3 s under B's block
    (4 s of work): that block does 0.75 s of work in that second and ends at 3 + 3.25 = 6.25 s; F's last block
    (3 s) then ends at 9.25 = F + B + 0.25 x the exchange. An exchange under no compute costs nothing more."""
    f = [Block(2.0, 1.0, 0.0), Block(3.0, None, 0.0)]
    b = [Block(4.0, None, 0.0)]
    assert pair_span(f, b, held=0.25) == pytest.approx(2 + 4 + 3 + 0.25 * 1.0, rel=1e-12)
    assert pair_span(f, b) == 9.0
    alone_exchange = [Block(1.0, 5.0, 0.0), Block(1.0, None, 0.0)]
    assert pair_span(alone_exchange, [], held=0.25) == pair_span(alone_exchange, []) == 7.0


@pytest.mark.parametrize(("p", "v"), [(1, 1), (4, 2), (8, 4), (32, 3)])
def test_the_steady_state_pairs_the_estimate_weights_by(p: int, v: int) -> None:
    """combined_pairs: one period of p x v pairs, each (F chunk, B chunk) as often as in the schedule's steady
    state: counted from the order itself over its first p x v pairs (m = 4 p micro-batches)."""
    m = 4 * p
    orders = A2A_OVERLAP["interleaved"].actions(p, m, v)
    for s in range(p):
        pairs = [(f.chunk, b.chunk) for f, b in zip(orders[s], orders[s][1:], strict=False) if f.with_next]
        period = pairs[:p * v]
        mix = combined_pairs(p, v, s)
        assert sum(n for _, _, n in mix) == p * v
        assert {(a, b): n for a, b, n in mix} == {pair: period.count(pair) for pair in set(period)}


def test_a_pairs_forward_send_leaves_beside_the_backwards_last_block() -> None:
    """Megatron's combined 1F1B issues the forward's send (post_forward) on the communication stream once the
    forward's own last node is done, beside the backward's pre-dispatch block (TransformerModelChunkSchedulePlan.run,
    "so the p2p comm could be overlapped with the pre_dispatch backward"); the backward's send follows the pair. On
    the trace of an interleaved pipeline (pp 2, vpp 2, one MoE layer per chunk): every forward's send starts when
    that forward's last compute task ends, paired ones too (the backward's router and attention run after it), and
    no backward's send leaves before its pair's forward's."""
    scenario = _small(True, "100 GB/s", schedule="interleaved", parallel={"pp": 2, "vpp": 2, "ep": 4},
                      model={"num_layers": 4}, training={"global_batch": 32})
    trace = runner.run(scenario).trace
    rank = trace[trace["stage"] == 0]["rank"].min()
    tasks = trace[trace["rank"] == rank]
    compute = tasks[tasks["stream"] == "compute"].sort_values("start_s")
    paired = 0
    for _, send in tasks[tasks["name"] == "send_forward"].iterrows():
        forward = compute[(compute["microbatch"] == send["microbatch"]) & (compute["kind"] == "forward")
                          & (compute["end_s"] <= send["start_s"] + 1e-12)]
        assert send["start_s"] == pytest.approx(forward["end_s"].max(), abs=1e-12)
        after = compute[compute["start_s"] >= send["start_s"] - 1e-12]
        paired += bool(len(after)) and after.iloc[0]["kind"] == "backward"  # the pair's backward still running
    assert paired >= 4


def test_mixtral_with_the_overlap_estimated_within_5_percent_and_faster_in_both() -> None:
    """Mixtral 8x7B's bundled layout (pp 4, vpp 8, ep 8 in a node: 0.22 ms exchanges beside 5 ms expert GEMMs)
    with moe.a2a_overlap: little to hide, and the combined order couples each pair's forward and backward. With the
    forward's send after the whole pair the simulation was 1.8% slower than without the overlap while the estimate
    said 1.0% faster (-4.1% apart); with Megatron's early forward send both say faster."""
    steps = {}
    for a2a in (False, True):
        scenario = load_scenario(SCENARIOS / "mixtral-8x7b_h100-64.yaml", [f"moe.a2a_overlap={str(a2a).lower()}"])
        steps[a2a] = estimate(scenario).step_time_s, runner.run(scenario).summary.step_time_s
        assert steps[a2a][0] == pytest.approx(steps[a2a][1], rel=0.05)
    assert steps[True][0] < steps[False][0] and steps[True][1] < steps[False][1]


def test_a_host_bound_pairs_forward_send_waits_for_the_host_to_issue_the_pair() -> None:
    """At f3e6c5 (the Qwen3 overlap row's code; schedule_chunk_1f1b in models/gpt/fine_grained_schedule.py) the
    host calls post_forward (the forward's send on the communication stream) after the layer loop and after
    ``layer_pre_backward()``, i.e. once it has issued the backward's last attention node too: the send leaves after
    the forward's last node on the device and after the host has issued the whole pair. With the host sync on and
    a slow host (every pass host-bound) each paired forward's send starts no earlier than the end of the host's
    issue of its pair's backward (``moe_host_issue`` of the backward's micro-batch and layer)."""
    scenario = _small(True, "100 GB/s", schedule="interleaved", parallel={"pp": 2, "vpp": 2, "ep": 4},
                      model={"num_layers": 4}, training={"global_batch": 32},
                      moe={"host_sync": True}, costs={"model": "roofline", "eager_op_overhead": "100 us"})
    run = runner.run(scenario)
    rank = run.trace[run.trace["stage"] == 0]["rank"].min()
    tasks = run.trace[run.trace["rank"] == rank]
    host = tasks[tasks["name"] == "moe_host_issue"]
    sends = tasks[tasks["name"] == "send_forward"]
    actions = A2A_OVERLAP["interleaved"].actions(2, run.plan.microbatches, 2)[0]
    checked = 0
    for f, b in zip(actions, actions[1:], strict=False):
        if not f.with_next:
            continue
        f_layer, b_layer = f.chunk * 2, b.chunk * 2  # stage 0's chunk c is global chunk 2c: one layer each
        # a (micro-batch, layer) has two host issues, its forward's and later its backward's
        f_host = host[(host["microbatch"] == f.microbatch) & (host["layer"] == f_layer)]["end_s"].min()
        b_host = host[(host["microbatch"] == b.microbatch) & (host["layer"] == b_layer)]["end_s"].max()
        send = sends[(sends["microbatch"] == f.microbatch) & (sends["start_s"] >= f_host - 1e-12)]["start_s"].min()
        assert b_host > f_host  # the host issues the pair's backward after its forward: host-bound
        assert send >= b_host - 1e-12
        checked += 1
    assert checked >= 4
