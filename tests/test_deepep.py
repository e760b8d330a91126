"""The flex (DeepEP) token dispatcher (issue 23, docs/mechanisms/deepep.md): what DeepEP's normal kernels send per
rank against the alltoall dispatcher's NCCL all-to-all for uniform routing, in closed form, and the seconds both
replays give its tasks."""

from __future__ import annotations

import itertools
from math import comb

import pytest

from sim import runner
from sim.errors import SimError
from sim.network import deepep
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload import step

from conftest import SCENARIOS

QWEN3_EP32 = SCENARIOS / "validation" / "moe" / "mz-qwen3-235b-h100-256-deepep-ep32.yaml"
GB = 1e9


def _plan(*overrides: str):
    return resolve(load_scenario(QWEN3_EP32, overrides=["moe.token_dispatcher=flex", *overrides]))


@pytest.mark.parametrize(("experts", "groups", "topk"), [(8, 4, 2), (12, 3, 4), (16, 8, 3), (6, 2, 1)])
def test_distinct_groups_is_the_mean_over_every_routing(experts: int, groups: int, topk: int) -> None:
    """Every top-k set equally likely (uniform routing): the mean number of groups a token reaches, enumerated."""
    per = experts // groups
    counts = [len({e // per for e in chosen}) for chosen in itertools.combinations(range(experts), topk)]
    assert deepep.distinct_groups(groups, experts, topk) == pytest.approx(sum(counts) / len(counts), rel=1e-12)


def test_bytes_per_rank_against_the_alltoall_dispatcher() -> None:
    """Qwen3-235B (128 experts, top-8, h 4096, bf16) at tp 2, ep 32 over 4 nodes: a rank routes b*s/tp = 2048
    tokens. alltoall sends every (token, expert) pair: 2048 x 8 x 4096 x 2 B. DeepEP sends a token once per
    destination node over RDMA: 2048 x 4 (1 - C(96,8)/C(128,8)) x 4096 x 2 B (3.63 of 8 copies), and once per
    destination rank over NVLink: 2048 x 32 (1 - C(124,8)/C(128,8)) x 4096 x 2 B."""
    plan = _plan()
    assert plan.deepep_shape == (4, 8)
    row = 4096 * 2
    assert plan.dispatch_bytes == 2048 * 8 * row
    nodes = 4 * (1 - comb(96, 8) / comb(128, 8))
    ranks = 32 * (1 - comb(124, 8) / comb(128, 8))
    rdma, nvlink = plan.deepep_bytes
    assert rdma == pytest.approx(2048 * nodes * row, rel=1e-12)
    assert nvlink == pytest.approx(2048 * ranks * row, rel=1e-12)
    assert nodes == pytest.approx(3.6290, abs=1e-4) and ranks == pytest.approx(7.3594, abs=1e-4)
    assert rdma / plan.dispatch_bytes == pytest.approx(nodes / 8, rel=1e-12)


def test_seconds_at_the_readme_bandwidths_and_the_knobs() -> None:
    """Across 4 nodes the RDMA part bounds it: bytes / 58 GB/s (dispatch) and / 57 GB/s (combine), the README's
    EP 32 row on a 50 GB/s NIC, as DGX H100's; the NVLink part (bytes / (0.765 x 450 GB/s)) is shorter. The knobs
    replace either bandwidth; the ideal network makes them free."""
    plan = _plan()
    rdma, nvlink = plan.deepep_bytes
    dispatch, combine = plan.deepep_seconds
    assert dispatch == pytest.approx(rdma / (58 * GB), rel=1e-12)
    assert combine == pytest.approx(rdma / (57 * GB), rel=1e-12)
    assert nvlink / (153 / 200 * 450 * GB) < dispatch
    assert _plan("moe.deepep_rdma_bandwidth=29 GB/s").deepep_seconds[0] == pytest.approx(2 * dispatch, rel=1e-12)
    slow_nvlink = _plan("moe.deepep_nvlink_bandwidth=10 GB/s").deepep_seconds[0]
    assert slow_nvlink == pytest.approx(nvlink / (10 * GB), rel=1e-12)
    assert _plan("network.model=ideal").deepep_seconds == (0.0, 0.0)


def test_inside_one_node_nvlink_bounds_it() -> None:
    """ep 8 inside a node (tp 4, ep 8): no RDMA; a token once per destination rank over NVLink at 153 / 200 of
    the 450 GB/s line rate (dispatch), with 16 experts per rank: 8 (1 - C(112,8)/C(128,8)) ranks per token."""
    plan = _plan("parallel.tp=4", "parallel.dp=8", "parallel.ep=8")
    assert plan.deepep_shape == (1, 8)
    rdma, nvlink = plan.deepep_bytes
    ranks = 8 * (1 - comb(112, 8) / comb(128, 8))
    assert rdma == 0.0
    assert nvlink == pytest.approx(1024 * ranks * 4096 * 2, rel=1e-12)
    assert plan.deepep_seconds[0] == pytest.approx(nvlink / (153 / 200 * 450 * GB), rel=1e-12)


def test_routing_skew_scales_the_time() -> None:
    assert _plan("moe.imbalance=1.5").deepep_seconds[0] == pytest.approx(1.5 * _plan().deepep_seconds[0], rel=1e-12)


def test_the_exchanges_and_the_trace_carry_those_seconds() -> None:
    """One fused exchange each way (no etp collectives); the trace's ep tasks last exactly the closed form, and the
    estimate prices the same exchanges."""
    plan = _plan("training.global_batch=256")
    dispatch, combine = step.dispatch_exchanges(plan), step.combine_exchanges(plan)
    assert [ex.seconds for ex in dispatch + combine] == list(plan.deepep_seconds)
    trace = runner.run(plan.scenario).trace
    ep = trace[trace["stream"] == "ep"]
    assert len(ep) > 0
    seconds = (ep["end_s"] - ep["start_s"]).round(12)
    expected = {round(s, 12) for s in plan.deepep_seconds}
    assert set(seconds) == expected


def test_flex_with_expert_tensor_parallelism_is_refused_in_one_line() -> None:
    with pytest.raises(SimError, match=r"moe\.token_dispatcher: flex \(DeepEP\) with parallel\.etp = 2"):
        load_scenario(QWEN3_EP32, overrides=["moe.token_dispatcher=flex", "parallel.etp=2", "parallel.ep=16"])


def test_sim_import_maps_the_flex_dispatcher_and_the_a2a_overlap() -> None:
    """Megatron flags -> scenario: --moe-token-dispatcher-type flex (the deepep backend, Megatron-Core's default)
    and --overlap-moe-expert-parallel-comm --delay-wgrad-compute; another flex backend is refused in one line."""
    from sim.interop.draft import Options
    from sim.interop.megatron import import_megatron

    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --vocab-size 1000 --bf16 "
            "--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 4 --moe-token-dispatcher-type flex ")
    s = import_megatron((base + "--overlap-moe-expert-parallel-comm --delay-wgrad-compute").split(),
                        Options(gpu="H100-SXM", gpus=8)).scenario()
    assert (s.moe.token_dispatcher, s.moe.a2a_overlap, s.parallel.ep) == ("flex", True, 4)
    with pytest.raises(SimError) as error:
        import_megatron((base + "--moe-flex-dispatcher-backend hybridep").split(), Options(gpu="H100-SXM", gpus=8))
    assert "'hybridep' is not modelled (deepep)" in str(error.value) and "\n" not in str(error.value)
