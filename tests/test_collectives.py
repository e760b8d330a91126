"""Ring collectives in closed form, and the nccl-tests algbw/busbw conventions."""

import pytest

from sim.hardware.links import LinkSpec
from sim.hardware.nodes import FabricSpec
from sim.network.collectives import busbw, nvls_time, p2p_time, ring_latency, ring_time, tree_time
from sim.network.models import AnalyticNetwork, IdealNetwork
from sim.network.topology import build

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
    # across nodes a ring pays NCCL's per-protocol hop latencies, not the link's (Simple wins at 1 GB)
    assert net.collective_time("all_reduce", S, across) == pytest.approx(2 * 14e-6 + S / 50e9)
    assert net.p2p_time(S, 0, 1) == pytest.approx(1e-6 + S / 200e9)
    assert net.p2p_time(S, 3, 4) == pytest.approx(5e-6 + S / 50e9)
    assert IdealNetwork().collective_time("all_reduce", S, across) == 0.0


def test_topology_routes_through_nvswitch_inside_and_pxn_rails_across():
    topo = build(2, 2, LinkSpec(bandwidth=1e9, latency=0), LinkSpec(bandwidth=1e9, latency=0))
    assert topo.route_names(0, 1) == ["gpu0", "nvswitch0", "gpu1"]
    assert topo.route_names(0, 2) == ["gpu0", "nic0.0", "leaf0.0", "nic1.0", "gpu2"]
    # PXN: GPU 0 reaches GPU 3 (rail 1) through its node's rail-1 GPU, never crossing rails in the fabric.
    assert topo.route_names(0, 3) == ["gpu0", "nvswitch0", "gpu1", "nic0.1", "leaf0.1", "nic1.1", "gpu3"]


def test_fat_tree_routes_cross_the_spine_between_leaf_groups():
    link = LinkSpec(bandwidth=1e9, latency=0)
    topo = build(4, 1, link, link, fabric=FabricSpec(nodes_per_leaf=2, oversubscription=4))
    assert topo.route_names(0, 1) == ["gpu0", "nic0.0", "leaf0.0", "nic1.0", "gpu1"]
    assert topo.route_names(1, 2) == ["gpu1", "nic1.0", "leaf0.0", "spine", "leaf1.0", "nic2.0", "gpu2"]
    uplink = topo.links[topo.link_index[("leaf0.0", "spine")]]
    assert uplink.capacity == 2 * 1e9 / 4  # two nodes' NICs below it, 4:1


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


# ------------------------------------------------------------------------------------- algorithms
INTRA = LinkSpec(bandwidth=400e9, latency=1e-6)
INTER = LinkSpec(bandwidth=50e9, latency=5e-6)


def net(algorithm, nvls=None):
    return AnalyticNetwork(build(2, 8, INTRA, INTER, nvls=nvls), algorithm)


def test_hierarchical_is_its_three_phases():
    group = tuple(range(16))
    rs, ag = ring_time("reduce_scatter", S, 8, 1e-6, 400e9), ring_time("all_gather", S, 8, 1e-6, 400e9)
    across = ring_time("all_reduce", S / 8, 2, 5e-6, 50e9)  # each local rank on its own rail
    assert net("hierarchical").collective_time("all_reduce", S, group) == pytest.approx(rs + across + ag)
    assert net("hierarchical").collective_time("reduce_scatter", S, group) == pytest.approx(
        rs + ring_time("reduce_scatter", S / 8, 2, 5e-6, 50e9))
    assert net("hierarchical").collective_time("all_gather", S, group) == pytest.approx(
        ring_time("all_gather", S / 8, 2, 5e-6, 50e9) + ag)


def test_tree_nvls_and_multi_node_ring_closed_forms():
    inside = tuple(range(8))
    assert net("tree").collective_time("all_reduce", S, inside) == pytest.approx(2 * 3 * 1e-6 + 2 * S / 400e9)
    assert tree_time(S, 3e-6, 400e9) == 2 * 3e-6 + 2 * S / 400e9
    nvls = LinkSpec(bandwidth=300e9, latency=2e-6)
    assert net("nvls", nvls).collective_time("all_reduce", S, inside) == pytest.approx(2 * 2e-6 + S / 300e9)
    assert nvls_time(S, 2e-6, 300e9) == 2 * 2e-6 + S / 300e9
    # A 16-rank ring over 2 nodes: 2(n-1) = 30 steps, 2(nodes-1) = 2 of them cross InfiniBand (NCCL's tuning).
    assert ring_latency("all_reduce", 16, 2, 1e-6, 5e-6) == pytest.approx(28e-6 + 10e-6)
    everything = tuple(range(16))  # 8 rails: 8 x 50 GB/s per node, under NVLink's 400
    # the ring across nodes: 28 NVLink steps and 2 network steps at NCCL's Simple latencies (3.4, 14 us)
    assert net("ring").collective_time("all_reduce", S, everything) == pytest.approx(
        28 * 3.4e-6 + 2 * 14e-6 + 2 * 15 / 16 * S / 400e9)


def test_auto_takes_the_fastest_and_fixed_algorithms_fall_back_to_ring():
    auto = net("auto", LinkSpec(bandwidth=300e9, latency=2e-6))
    for op, group, size in (("all_reduce", tuple(range(8)), S), ("all_reduce", tuple(range(16)), 1e4),
                            ("all_gather", tuple(range(16)), S)):
        options = auto.options(op, size, group)
        assert auto.collective_time(op, size, group) == min(options.values())
    assert auto.algorithm_for("all_reduce", S, tuple(range(8))) == "nvls"  # 1 GB: S/300 beats 1.75 S/400
    assert auto.algorithm_for("all_reduce", 1e3, tuple(range(0, 16, 8))) in ("ring", "tree")
    assert net("tree").algorithm_for("all_gather", S, tuple(range(8))) == "ring"  # no tree all-gather
    assert net("nvls").algorithm_for("all_reduce", S, tuple(range(8))) == "ring"  # no NVSwitch reduction


def test_all_to_all_and_broadcast_closed_forms():
    for n in (2, 8):
        assert ring_time("all_to_all", S, n, ALPHA, B) == pytest.approx((n - 1) * ALPHA + (n - 1) / n * S / B)
        assert ring_time("broadcast", S, n, ALPHA, B) == pytest.approx((n - 1) * ALPHA + S / B)


def test_efficiency_curve_interpolates_in_log2_and_clamps():
    link = LinkSpec(bandwidth=100e9, latency=0, efficiency=0.8, efficiency_curve=[[2**20, 0.5], [2**24, 1.0]])
    assert link.bandwidth_at(2**10) == pytest.approx(40e9)  # clamped to the first knot
    assert link.bandwidth_at(2**22) == pytest.approx(80e9 * 0.75)  # half way in log2
    assert link.bandwidth_at(2**30) == pytest.approx(80e9)
    with pytest.raises(ValueError, match="efficiency_curve"):
        LinkSpec(bandwidth=1, latency=0, efficiency_curve=[[2**24, 0.5], [2**20, 1.0]])


def test_group_size_factor_scales_the_nvlink_bandwidth_of_small_groups():
    intra = LinkSpec(bandwidth=400e9, latency=1e-6, group_efficiency=[[2, 0.5], [8, 1.0]])
    network = AnalyticNetwork(build(1, 8, intra, INTER), "ring")
    assert network.collective_time("all_reduce", S, (0, 1)) == pytest.approx(2 * 1e-6 + S / (0.5 * 400e9))
    assert network.collective_time("all_gather", S, (0, 1, 2, 3)) == pytest.approx(3e-6 + 0.75 * S / (0.5 * 400e9))
    assert network.collective_time("all_gather", S, tuple(range(8))) == pytest.approx(7e-6 + 7 / 8 * S / 400e9)
    with pytest.raises(ValueError, match="group_efficiency"):
        LinkSpec(bandwidth=1, latency=0, group_efficiency=[[1, 0.5]])


def test_nccl_protocols_on_a_ring_across_nodes():
    """NCCL tuning.cc: LL128 wins where the ring's latency matters, Simple where bandwidth does, LL on tiny
    messages; the ring's latency grows with its length (1,535 steps at 1,536 ranks on 192 nodes)."""
    from sim.network.collectives import RING_PROTOCOLS, multinode_ring_time
    bw = 192e9
    assert multinode_ring_time("all_gather", 1e3, 16, 2, bw)[1] == "LL"
    assert multinode_ring_time("all_gather", 4e9, 16, 2, bw)[1] == "Simple"
    seconds, protocol = multinode_ring_time("all_gather", 1.2e9, 1536, 192, bw)
    assert protocol == "LL128"
    ll128 = RING_PROTOCOLS["LL128"]
    assert seconds == pytest.approx(1344 * 1.9e-6 + 191 * 4.0e-6 + 1535 / 1536 * 1.2e9 / (bw * 0.92))
    assert ll128.nvlink == 1.9e-6 and ll128.net == 4.0e-6
    small = [multinode_ring_time("all_gather", 1e6, n, n // 8, bw)[0] for n in (384, 768, 1536)]
    assert small[0] < small[1] < small[2] and small[2] / small[0] == pytest.approx(4, rel=0.05)
    assert multinode_ring_time("all_gather", 1e6, 16, 2, bw, "Simple")[1] == "Simple"


def test_nccl_sms_is_off_by_default():
    """docs/mechanisms/collectives_at_scale.md: the A100 profile's end-to-end factor already holds NCCL's SM use."""
    from sim.spec.scenario import NetworkSpec
    assert NetworkSpec().nccl_sms == 0 and NetworkSpec().protocol == "auto"
