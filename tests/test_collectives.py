"""Ring collectives in closed form, and the nccl-tests algbw/busbw conventions."""

import pytest

from sim.collectives import busbw, p2p_time, ring_time
from sim.hardware import LinkSpec
from sim.network import AnalyticNetwork, IdealNetwork
from sim.topology import build

ALPHA, B, S = 5e-6, 100e9, 1e9


@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_ring_closed_forms(n):
    assert ring_time("all_reduce", S, n, ALPHA, B) == pytest.approx(2 * (n - 1) * ALPHA + 2 * (n - 1) / n * S / B)
    for op in ("all_gather", "reduce_scatter"):
        assert ring_time(op, S, n, ALPHA, B) == pytest.approx((n - 1) * ALPHA + (n - 1) / n * S / B)
    # An all-reduce moves what a reduce-scatter plus an all-gather move (sequence parallelism's identity).
    assert ring_time("all_reduce", S, n, ALPHA, B) == pytest.approx(
        ring_time("reduce_scatter", S, n, ALPHA, B) + ring_time("all_gather", S, n, ALPHA, B))


def test_a_group_of_one_costs_nothing():
    assert ring_time("all_reduce", S, 1, ALPHA, B) == 0.0


def test_p2p():
    assert p2p_time(S, ALPHA, B) == ALPHA + S / B


def test_busbw_recovers_the_bandwidth_of_a_latency_free_ring():
    n = 8
    assert busbw("all_reduce", S, ring_time("all_reduce", S, n, 0.0, B), n) == pytest.approx(B)
    assert busbw("all_gather", S, ring_time("all_gather", S, n, 0.0, B), n) == pytest.approx(B)


def test_unknown_collective():
    with pytest.raises(ValueError, match="unknown collective"):
        ring_time("all_to_all_v", S, 4, ALPHA, B)


def test_analytic_network_picks_the_tier_a_group_crosses():
    intra = LinkSpec(bandwidth=400e9, latency=1e-6, efficiency=0.5)
    inter = LinkSpec(bandwidth=50e9, latency=5e-6, efficiency=1.0)
    net = AnalyticNetwork(build(2, 4, intra, inter))
    inside, across = (0, 1, 2, 3), (0, 4)
    assert net.collective_time("all_reduce", S, inside) == pytest.approx(6e-6 + 1.5 * S / 200e9)
    assert net.collective_time("all_reduce", S, across) == pytest.approx(2 * 5e-6 + S / 50e9)
    assert net.p2p_time(S, 0, 1) == pytest.approx(1e-6 + S / 200e9)
    assert net.p2p_time(S, 3, 4) == pytest.approx(5e-6 + S / 50e9)
    assert IdealNetwork().collective_time("all_reduce", S, across) == 0.0


def test_topology_routes_through_nvswitch_inside_and_nics_across():
    topo = build(2, 2, LinkSpec(bandwidth=1e9, latency=0), LinkSpec(bandwidth=1e9, latency=0))
    assert topo.route(0, 1) == ("gpu0", "nvswitch0", "gpu1")
    assert topo.route(0, 2) == ("gpu0", "nic0", "fabric", "nic2", "gpu2")


def test_a_group_with_several_gpus_per_node_uses_several_rails():
    """Rings across nodes run one per rail: k members per node get k NIC shares, up to NVLink."""
    intra = LinkSpec(bandwidth=400e9, latency=0.0, efficiency=1.0)
    inter = LinkSpec(bandwidth=25e9, latency=0.0, efficiency=1.0)
    topo = build(2, 8, intra, inter)
    assert topo.tier((0, 8)).bandwidth == 25e9
    assert topo.tier((0, 1, 8, 9)).bandwidth == 50e9
    assert topo.tier(tuple(range(16))).bandwidth == 200e9
    fast_nics = build(2, 8, intra, LinkSpec(bandwidth=100e9, latency=0.0, efficiency=1.0))
    assert fast_nics.tier(tuple(range(16))).bandwidth == 400e9  # capped by NVLink
