"""parallel.cuda_device_max_connections (CUDA_DEVICE_MAX_CONNECTIONS): with one hardware queue Megatron's linear
backward launches its asynchronous TP collectives before the GEMMs they hide under; with more, each runs after the
GEMM it was issued before (megatron/core/tensor_parallel/layers.py; docs/mechanisms/a2a_overlap.md)."""

from __future__ import annotations

import pytest

from sim import runner
from sim.explore.estimate import estimate
from sim.plan import resolve
from sim.spec.scenario import load_scenario

from conftest import SCENARIOS, make_scenario

GPT = {"name": "g", "num_layers": 4, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 4096,
       "max_seq_len": 2048}


def _tp2(connections: int | None, sp: bool = True):
    return make_scenario(cluster={"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 2}, model=GPT,
                         training={"global_batch": 4, "micro_batch": 1, "seq_len": 2048, "recompute": "none"},
                         parallel={"tp": 2, "pp": 1, "dp": 1, "sequence_parallel": sp,
                                   "cuda_device_max_connections": connections})


def test_the_default_is_megatrons_one_queue_and_32_under_the_ep_a2a_overlap() -> None:
    assert resolve(_tp2(None)).cuda_device_max_connections == 1
    path = SCENARIOS / "validation" / "moe" / "mz-qwen3-235b-h100-256-deepep-ep32-overlap.yaml"
    assert resolve(load_scenario(path)).cuda_device_max_connections == 32
    assert resolve(load_scenario(path, ["moe.a2a_overlap=false"])).cuda_device_max_connections == 1


def test_more_queues_run_each_backward_block_serially_with_sps_second_gather() -> None:
    """With 32 queues a block's backward is input-gradient GEMM -> all-gather -> weight-gradient GEMM ->
    reduce-scatter, each starting when the one before ends; with 1 the second all-gather and the reduce-scatter run
    beside the GEMMs. Same collectives either way (the second gather is issued in both), so the step grows by
    exactly the collective time the GEMMs hid."""
    one, many = runner.run(_tp2(1)), runner.run(_tp2(32))
    ops = [result.trace[(result.trace["rank"] == 0) & (result.trace["stream"] == "tp")]["op"].value_counts()
           for result in (one, many)]
    assert ops[0].equals(ops[1])
    assert 2 * ops[0]["all_gather"] == 3 * ops[0]["reduce_scatter"]  # SP: a block's F gathers once, its B twice
    compute = many.trace[(many.trace["rank"] == 0) & (many.trace["stream"] == "compute")]
    tp = many.trace[(many.trace["rank"] == 0) & (many.trace["stream"] == "tp")]
    # nothing runs beside a backward GEMM: every TP collective of the backward lies outside every compute task
    backward = compute[compute["kind"] == "backward"]
    for _, c in tp[tp["start_s"] >= backward["start_s"].min()].iterrows():
        inside = backward[(backward["start_s"] < c["end_s"] - 1e-12) & (backward["end_s"] > c["start_s"] + 1e-12)]
        assert inside.empty, c
    hidden = many.summary.exposed_comm_s["tp"] - one.summary.exposed_comm_s["tp"]
    assert hidden > 0
    assert many.summary.step_time_s - one.summary.step_time_s == pytest.approx(hidden, rel=1e-6)


def test_without_sequence_parallelism_only_the_all_reduce_moves() -> None:
    one, many = runner.run(_tp2(1, sp=False)), runner.run(_tp2(32, sp=False))
    counts = [result.trace[(result.trace["rank"] == 0) & (result.trace["stream"] == "tp")]["op"].value_counts()
              for result in (one, many)]
    assert counts[0].equals(counts[1]) and set(counts[0].index) == {"all_reduce"}
    hidden = many.summary.exposed_comm_s["tp"] - one.summary.exposed_comm_s["tp"]
    assert hidden > 0
    assert many.summary.step_time_s - one.summary.step_time_s == pytest.approx(hidden, rel=1e-6)


@pytest.mark.parametrize("connections", [1, 32])
@pytest.mark.parametrize("sp", [True, False])
def test_the_estimate_prices_the_backward_as_the_simulation_runs_it(connections: int, sp: bool) -> None:
    scenario = _tp2(connections, sp)
    assert estimate(scenario).step_time_s == pytest.approx(runner.run(scenario).summary.step_time_s, rel=0.01)


def test_the_overlap_rows_estimate_and_simulation_move_together() -> None:
    """The Qwen3 ep 32 overlap row (tp 2 + SP, 32 queues by default): its attention backward's exposed gathers and
    reduce-scatters add the same to the estimate as to the simulation (a merged F&B pair, priced by the estimate's
    pair replay): to 1% without the combined 1F1B's schedule-node host time (costs.a2a_overlap_node_overhead 0).
    With it (41 us per node call) the pairs are host-bound and the two are 1.2% apart (simulation 16.09 s, estimate
    15.90 s, 2026-11-26: the nodes moved the simulation 0.31 s and the estimate 0.14 s, not yet explained;
    tests/test_combined_1f1b_host.py holds both to the closed form where every pass is host-bound)."""
    path = SCENARIOS / "validation" / "moe" / "mz-qwen3-235b-h100-256-deepep-ep32-overlap.yaml"
    for nodes, rel in (("0 us", 0.01), ("41 us", 0.015)):
        scenario = load_scenario(path, [f"costs.a2a_overlap_node_overhead={nodes}"])
        assert estimate(scenario).step_time_s == pytest.approx(runner.run(scenario).summary.step_time_s, rel=rel)


def _chunked(connections: int, method: str):
    return make_scenario(cluster={"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 2}, model=GPT,
                         training={"global_batch": 4, "micro_batch": 1, "seq_len": 2048, "recompute": "none"},
                         parallel={"tp": 2, "pp": 1, "dp": 1, "sequence_parallel": True, "tp_comm_overlap": True,
                                   "tp_comm_overlap_method": method, "cuda_device_max_connections": connections})


@pytest.mark.parametrize("method", ["userbuffers", "async_tp"])
def test_chunked_tp_overlap_does_not_depend_on_the_queues(method: str) -> None:
    """TE's userbuffers order their own launches: with more than one queue on Hopper (CUDA >= 12.3) the comm kernel
    waits on ``_comm_launch_event`` so that it is scheduled before the GEMM (TransformerEngine comm_gemm_overlap.cpp,
    "using Fast Dependent Launch when CUDA_DEVICE_MAX_CONNECTIONS>1"; tests/pytorch/distributed/
    test_comm_gemm_overlap.py runs the bulk overlaps at 8); AsyncTP's fused ops pull with copy engines. Neither
    rests on Megatron's one-queue launch order, so 32 queues run the same tasks as 1: the same collectives, the same
    step time, in the simulation and the estimate."""
    one, many = runner.run(_chunked(1, method)), runner.run(_chunked(32, method))
    ops = [result.trace[(result.trace["rank"] == 0) & (result.trace["stream"] == "tp")]["op"].value_counts()
           for result in (one, many)]
    assert ops[0].equals(ops[1])
    assert many.summary.step_time_s == one.summary.step_time_s
    assert estimate(_chunked(32, method)).step_time_s == estimate(_chunked(1, method)).step_time_s


@pytest.mark.parametrize("gpu", ["B200", "GB200"])
def test_blackwell_needs_no_single_queue(gpu: str) -> None:
    """Megatron-LM asserts CUDA_DEVICE_MAX_CONNECTIONS=1 for TP only before compute capability 10 ("requirement
    no longer exists since the Blackwell architecture", megatron/training/arguments.py), and TE's userbuffers order
    their launches only on Hopper, "which uses persistent CTA execution" (comm_gemm_overlap.cpp): on Blackwell the
    collectives issued before the GEMMs get SMs beside them at any number of queues, so 32 runs the step of 1."""
    one, many = (runner.run(make_scenario(cluster={"gpu": gpu, "nodes": 1, "gpus_per_node": 2}, model=GPT,
                                          training={"global_batch": 4, "micro_batch": 1, "seq_len": 2048,
                                                    "recompute": "none"},
                                          parallel={"tp": 2, "pp": 1, "dp": 1, "sequence_parallel": True,
                                                    "cuda_device_max_connections": connections}))
                 for connections in (1, 32))
    assert many.summary.step_time_s == one.summary.step_time_s
    assert many.summary.exposed_comm_s["tp"] == one.summary.exposed_comm_s["tp"]
