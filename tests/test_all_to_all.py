"""All-to-all on the network models (issue 23): NCCL's grouped send/recv to every peer, NVLink inside a domain
and each GPU's NIC across, with a routing skew; the fitted NVLink all-to-all tier against OpenXLA's H100 rows;
the H800 preset.

Closed forms (sim.network.collectives.all_to_all_terms), S bytes per rank over n ranks, ``local`` of them in a
rank's NVLink domain: base + (local-1) a_nvl + (n-local) a_net + skew * max((local-1)/n S / B_nvl,
(n-local)/n S / B_net).
"""

import math
from pathlib import Path

import pandas as pd
import pytest

from sim.calibrate import reference
from sim.engine.event import simulate
from sim.hardware.gpus import GPU_PRESETS
from sim.hardware.links import LinkSpec
from sim.hardware.nodes import DEFAULT_NODE_FOR_GPU, NODE_PRESETS
from sim.network.collectives import all_to_all_time, busbw
from sim.network.flows import FlowNetwork
from sim.network.models import AnalyticNetwork, ContentionNetwork, IdealNetwork, TransferPhase, transfer_time
from sim.network.topology import Topology, build
from sim.spec.cluster import ClusterSpec
from sim.workload.ir import TaskGraph

DATA = Path(__file__).parent / "data"
GB = 1e9
# Flat links (no curve), so every number below is the closed form by hand.
NVLINK = LinkSpec(bandwidth=400e9, latency=1e-6, base_latency=10e-6, efficiency=0.8)  # 320 GB/s
IB = LinkSpec(bandwidth=50e9, latency=5e-6, base_latency=12e-6, efficiency=0.9)  # 45 GB/s per NIC


def _nodes(nodes: int, gpus: int, **kwargs: object) -> Topology:
    return build(nodes, gpus, NVLINK, IB, **kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ closed forms


def test_one_node_is_the_pairwise_closed_form():
    net = AnalyticNetwork(_nodes(1, 8))
    for size in (1e4, 1e6, 1e9):
        expected = 10e-6 + 7 * 1e-6 + 7 / 8 * size / 320e9
        assert net.collective_time("all_to_all", size, tuple(range(8))) == pytest.approx(expected, rel=1e-12)


def test_two_nodes_take_the_slower_tier_and_one_latency_per_peer():
    net = AnalyticNetwork(_nodes(2, 8))
    size = 1e9
    nvlink, nic = 7 / 16 * size / 320e9, 8 / 16 * size / 45e9  # 1.367 ms over NVLink, 11.11 ms over the NIC
    latency = 12e-6 + 7 * 1e-6 + 8 * 5e-6  # the larger base, 7 NVLink peers, 8 network peers
    assert net.collective_time("all_to_all", size, tuple(range(16))) == pytest.approx(latency + nic, rel=1e-12)
    assert nic > nvlink
    # Small messages: the 8 network peers' latency dominates.
    assert net.collective_time("all_to_all", 1e3, tuple(range(16))) == pytest.approx(
        latency + 8 / 16 * 1e3 / 45e9, rel=1e-12)


def test_one_gpu_per_node_uses_only_the_nic():
    net = AnalyticNetwork(_nodes(4, 1))
    size = 2e8
    expected = 12e-6 + 3 * 5e-6 + 3 / 4 * size / 45e9
    assert net.collective_time("all_to_all", size, (0, 1, 2, 3)) == pytest.approx(expected, rel=1e-12)


def test_nics_shared_by_two_gpus_halve_the_network_share():
    # 8 GPUs and 4 NICs a node: each GPU gets half a NIC in the analytic model (symmetric traffic).
    net = AnalyticNetwork(_nodes(2, 8, nics_per_node=4))
    size = 1e9
    expected = 12e-6 + 7e-6 + 40e-6 + 8 / 16 * size / 22.5e9
    assert net.collective_time("all_to_all", size, tuple(range(16))) == pytest.approx(expected, rel=1e-12)


def test_skew_multiplies_the_bandwidth_term_of_the_hottest_receiver():
    one, two = AnalyticNetwork(_nodes(1, 8)), AnalyticNetwork(_nodes(2, 8))
    size = 1e9
    for skew in (1.0, 1.5, 4.0):
        assert one.collective_time("all_to_all", size, tuple(range(8)), skew) == pytest.approx(
            10e-6 + 7e-6 + skew * 7 / 8 * size / 320e9, rel=1e-12)
        assert two.collective_time("all_to_all", size, tuple(range(16)), skew=skew) == pytest.approx(
            12e-6 + 7e-6 + 40e-6 + skew * 8 / 16 * size / 45e9, rel=1e-12)
    assert transfer_time(two, "all_to_all", size, tuple(range(16)), 2.0) == two.collective_time(
        "all_to_all", size, tuple(range(16)), 2.0)
    # The closed form itself, one rank shape at a time.
    assert all_to_all_time(size, 16, 8, 1e-6, 320e9, 5e-6, 45e9, skew=3.0) == pytest.approx(
        7e-6 + 40e-6 + 3.0 * 8 / 16 * size / 45e9, rel=1e-12)


def test_busbw_is_the_nccl_tests_convention():
    # busbw = S / t * (n-1)/n; a large all-to-all in one node approaches the link's effective bandwidth.
    net = AnalyticNetwork(_nodes(1, 8))
    size = 1e12
    seconds = net.collective_time("all_to_all", size, tuple(range(8)))
    assert busbw("all_to_all", size, seconds, 8) == pytest.approx(size / seconds * 7 / 8)
    moved = 7 / 8 * size
    assert busbw("all_to_all", size, seconds, 8) == pytest.approx(moved / (17e-6 + moved / 320e9), rel=1e-12)
    assert busbw("all_to_all", size, seconds, 8) == pytest.approx(320e9, rel=1e-5)


@pytest.mark.parametrize("skew, op, message", [
    (0.5, "all_to_all", r"skew: max/mean bytes per rank must be in \[1, 8\]"),
    (9.0, "all_to_all", r"skew: .* in \[1, 8\] for a group of 8, got 9.0"),
    (2.0, "all_reduce", "skew: only an all_to_all has a routing skew, not all_reduce"),
])
def test_bad_skew_is_one_line_naming_the_field(skew, op, message):
    topo = _nodes(1, 8)
    for net in (AnalyticNetwork(topo), ContentionNetwork(topo), IdealNetwork()):
        with pytest.raises(ValueError, match=message):
            net.collective_time(op, 1e6, tuple(range(8)), skew)
    with pytest.raises(ValueError, match=message):
        ContentionNetwork(topo).transfer(op, 1e6, tuple(range(8)), skew)


# ------------------------------------------------------------------------------------ the contention model


def _finish(network: ContentionNetwork, phases: tuple[TransferPhase, ...]) -> float:
    """The end of a transfer's phases moved as max-min flows, each phase's flows starting after its latency."""
    now = 0.0
    for phase in phases:
        now += phase.latency
        flows = FlowNetwork(network.capacities)
        finish: dict[int, float] = {}
        for key, channel in enumerate(phase.channels):
            finish.update(flows.add(key, channel.loads, channel.nbytes, channel.rate_cap, now))
        while finish:
            key = min(finish, key=finish.__getitem__)
            now = finish.pop(key)
            finish.update({k: t for k, t in flows.remove(key, now).items() if k in finish})
    return now


CASES = [((1, 8), tuple(range(8))), ((2, 8), tuple(range(16))), ((4, 1), (0, 1, 2, 3)),
         ((2, 4), (0, 1, 4, 5))]


@pytest.mark.parametrize("shape, group", CASES)
def test_uncontended_contention_takes_the_analytic_time(shape, group):
    topo = _nodes(*shape)
    analytic, contention = AnalyticNetwork(topo), ContentionNetwork(topo)
    for size in (1e5, 3e7, 1e9):
        # Through the event engine (no skew on a task) ...
        g = TaskGraph()
        for rank in group:
            g.add(rank=rank, stage=0, stream="dp", kind="dp", name="a2a", microbatch=0, layer=0, deps=[],
                  op="all_to_all", nbytes=size, group=group)
        end = max(simulate(g, contention).end)
        assert end == pytest.approx(analytic.collective_time("all_to_all", size, group), rel=1e-9)
        # ... and the phases directly, skewed: the hottest receiver's flows end last, at the analytic time.
        for skew in (1.0, 2.0, 3.5):
            phases = contention.transfer("all_to_all", size, group, skew)
            assert len(phases[0].channels) <= 3 * len(group)  # per sender: its NVLink peers, the others, the hot one
            assert _finish(contention, phases) == pytest.approx(
                analytic.collective_time("all_to_all", size, group, skew), rel=1e-9), (shape, size, skew)


def test_the_presets_agree_uncontended_through_pxn():
    # dgx-h100 with its fitted all-to-all tier: 2 nodes, every peer on another rail reached by PXN over NVLink.
    node = NODE_PRESETS["dgx-h100"]
    topo = build(2, 8, node.intra_node, node.inter_node, pcie=node.pcie, all_to_all=node.all_to_all)
    analytic, contention = AnalyticNetwork(topo), ContentionNetwork(topo)
    for size in (1e6, 1e8, 2e9):
        for skew in (1.0, 2.0):
            assert _finish(contention, contention.transfer("all_to_all", size, tuple(range(16)), skew)) == \
                pytest.approx(analytic.collective_time("all_to_all", size, tuple(range(16)), skew), rel=1e-9)


def test_two_all_to_alls_sharing_a_nic_each_take_twice_the_bandwidth_term():
    # 2 nodes x 2 GPUs and one NIC a node: groups (0, 2) and (1, 3) both cross node 0's and node 1's only NIC.
    topo = _nodes(2, 2, nics_per_node=1)
    net = ContentionNetwork(topo)
    size = 1e9
    g = TaskGraph()
    for group in ((0, 2), (1, 3)):
        for rank in group:
            g.add(rank=rank, stage=0, stream="dp", kind="dp", name="a2a", microbatch=0, layer=0, deps=[],
                  op="all_to_all", nbytes=size, group=group)
    latency = 12e-6 + 5e-6
    alone = latency + 1 / 2 * size / 45e9
    assert net.collective_time("all_to_all", size, (0, 2)) == pytest.approx(alone, rel=1e-12)
    assert max(simulate(g, net).end) == pytest.approx(latency + 2 * (1 / 2 * size / 45e9), rel=1e-9)


# ---------------------------------------------------------------------- the fitted tier vs OpenXLA's H100 rows


def _h100_rows() -> pd.DataFrame:
    rows = pd.read_csv(DATA / "xla_h100_all_to_all.csv")
    node = NODE_PRESETS["dgx-h100"]
    net = AnalyticNetwork(build(1, 8, node.intra_node, node.inter_node, all_to_all=node.all_to_all))
    predicted = [net.collective_time("all_to_all", float(r.tensor_size_bytes), tuple(range(r.group_size)))
                 for r in rows.itertuples()]
    return rows.assign(error=[p / (r.median_time_us * 1e-6) - 1
                                     for p, r in zip(predicted, rows.itertuples(), strict=True)])


def test_the_copied_rows_are_the_shipped_reference_rows():
    rows = pd.read_csv(DATA / "xla_h100_all_to_all.csv")
    shipped = reference.xla_collectives(reference.ALL_TO_ALL_OPS)
    shipped = shipped[shipped["platform"] == "sm_90"]
    assert len(rows) == len(shipped) == 66
    copied = sorted(zip(rows.group_size, rows.tensor_size_bytes, rows.median_time_us * 1e-6, strict=True))
    assert copied == pytest.approx(sorted(zip(shipped.n, shipped.bytes, shipped.seconds, strict=True)))


def test_h100_all_to_all_errors_against_openxla():
    """Signed time error (predicted / measured - 1) over OpenXLA's sm_90 all-to-all table (66 rows, groups of 2, 4
    and 8 in one node), as docs/mechanisms/all_to_all.md reports them."""
    rows = _h100_rows()
    large = rows[rows.tensor_size_bytes >= 2**24]
    assert len(large) == 24
    assert large.error.abs().mean() == pytest.approx(0.080, abs=0.005)
    assert large.error.abs().max() == pytest.approx(0.267, abs=0.005)
    assert large.error.mean() == pytest.approx(-0.055, abs=0.005)  # a little optimistic
    eight = large[large.group_size == 8]
    assert eight.error.abs().mean() == pytest.approx(0.041, abs=0.005)
    assert eight.error.abs().median() < 0.01  # the tier was fitted on these
    assert rows.error.abs().mean() == pytest.approx(0.216, abs=0.005)  # small messages: 15-135 us of noise
    assert rows.error.mean() == pytest.approx(-0.094, abs=0.005)


@pytest.mark.parametrize("platform, node_name, nodes, expected", [
    # (mean |error|, bias) over all rows, then over rows >= 16 MiB; docs/mechanisms/all_to_all.md
    ("sm_100_B200", "dgx-b200", 1, (0.171, -0.127, 0.063, 0.000)),
    ("sm_100_GB200", "gb200-nvl72", 18, (0.287, 0.010, 0.102, -0.075)),
])
def test_blackwell_all_to_all_errors_against_openxla(platform, node_name, nodes, expected):
    """The B200 (groups of 2, 4, 8) and GB200 NVL72 (groups of 4..72 in the 72-GPU domain) all-to-all rows shipped
    in sim/data/reference, against the fitted tiers."""
    node = NODE_PRESETS[node_name]
    net = AnalyticNetwork(build(nodes, node.gpus_per_node, node.intra_node, node.inter_node,
                                nvlink_domain=node.nvlink_domain, all_to_all=node.all_to_all))
    rows = reference.xla_collectives(reference.ALL_TO_ALL_OPS)
    rows = rows[rows["platform"] == platform]
    error = pd.Series([net.collective_time("all_to_all", r.bytes, tuple(range(r.n))) / r.seconds - 1
                       for r in rows.itertuples()], index=rows.index)
    large = error[rows["bytes"] >= 2**24]
    measured = (error.abs().mean(), error.mean(), large.abs().mean(), large.mean())
    assert measured == pytest.approx(expected, abs=0.005)


def test_the_fitted_tier_beats_the_ring_curve_on_all_to_all():
    node = NODE_PRESETS["dgx-h100"]
    rows = pd.read_csv(DATA / "xla_h100_all_to_all.csv")
    rows = rows[rows.tensor_size_bytes >= 2**24]
    ring = AnalyticNetwork(build(1, 8, node.intra_node, node.inter_node))  # no all-to-all tier: the ring's
    fitted = AnalyticNetwork(build(1, 8, node.intra_node, node.inter_node, all_to_all=node.all_to_all))

    def mean_abs(net: AnalyticNetwork) -> float:
        return sum(abs(net.collective_time("all_to_all", float(r.tensor_size_bytes), tuple(range(r.group_size)))
                       / (r.median_time_us * 1e-6) - 1) for r in rows.itertuples()) / len(rows)

    assert mean_abs(fitted) < mean_abs(ring) - 0.03  # 8.0% against 12.3%


def test_nvlink_links_carry_what_either_fitted_algorithm_reaches():
    for name, node in NODE_PRESETS.items():
        if node.all_to_all is None:
            continue
        topo = build(1, node.gpus_per_node, node.intra_node, node.inter_node, all_to_all=node.all_to_all)
        nvlink = max(link.capacity for link in topo.links if link.tier == "nvlink")
        a2a = node.all_to_all.bandwidth * node.all_to_all.efficiency * max(
            [1.0] + [f for _, f in node.all_to_all.group_efficiency])
        ring = node.intra_node.bandwidth * node.intra_node.efficiency * max(
            [1.0] + [f for _, f in node.intra_node.group_efficiency])
        assert nvlink == pytest.approx(max(a2a, ring), rel=1e-12), name


# ------------------------------------------------------------------------------------------------ H800


def test_h800_preset_is_h100_compute_with_a_narrower_nvlink():
    h800, h100 = GPU_PRESETS["H800-SXM"], GPU_PRESETS["H100-SXM"]
    assert h800.peak_flops == h100.peak_flops and h800.peak("bf16") == 989e12 and h800.peak("fp8") == 1979e12
    assert h800.hbm_capacity == 80 * 2**30 and h800.hbm_bandwidth == 3.35e12 and h800.sms == 132
    assert DEFAULT_NODE_FOR_GPU["H800-SXM"] == "hgx-h800"
    node = NODE_PRESETS["hgx-h800"]
    assert node.intra_node.bandwidth == 8 * 25 * GB == 200 * GB  # 8 NVLink4 links, 400 GB/s bidirectional
    assert node.all_to_all is not None and node.all_to_all.bandwidth == 200 * GB
    assert node.inter_node.bandwidth == 400e9 / 8  # one 400 Gb/s CX7 per GPU
    assert (node.gpus_per_node, node.nics_per_node, node.nvlink_domain) == (8, 8, 8)
    # DeepEP's README: "~160 GB/s NVLink maximum bandwidth" on H800; the preset's ring plateau reaches 157.
    assert node.intra_node.effective_bandwidth == pytest.approx(160 * GB, rel=0.03)
    assert node.inter_node.effective_bandwidth == pytest.approx(47 * GB, rel=1e-9)


def test_h800_all_to_all_inside_a_node_is_the_h100_one_at_200_of_450_gb_s():
    h800, h100 = NODE_PRESETS["hgx-h800"], NODE_PRESETS["dgx-h100"]
    nets = [AnalyticNetwork(build(1, 8, n.intra_node, n.inter_node, all_to_all=n.all_to_all)) for n in (h800, h100)]
    size, group = 2**30, tuple(range(8))
    latency = h100.all_to_all.base_latency + 7 * h100.all_to_all.latency  # type: ignore[union-attr]
    slow, fast = (net.collective_time("all_to_all", size, group) - latency for net in nets)
    assert slow / fast == pytest.approx(450 / 200, rel=1e-12)
    # Across nodes both are bound by the same 50 GB/s NIC per GPU.
    two = [AnalyticNetwork(build(2, 8, n.intra_node, n.inter_node, all_to_all=n.all_to_all)) for n in (h800, h100)]
    assert two[0].collective_time("all_to_all", size, tuple(range(16))) == pytest.approx(
        two[1].collective_time("all_to_all", size, tuple(range(16))), rel=1e-12)


def test_a_cluster_of_h800_gets_the_h800_node_and_the_tier_follows_an_nvlink_override():
    cluster = ClusterSpec.model_validate({"gpu": "h800-sxm", "nodes": 2})
    assert cluster.node == "hgx-h800" and cluster.intra_node.bandwidth == 200 * GB
    assert cluster.all_to_all is not None and cluster.all_to_all.bandwidth == 200 * GB
    faster = ClusterSpec.model_validate({"gpu": "H800-SXM", "nodes": 2, "intra_node": {"bandwidth": 300 * GB}})
    assert faster.all_to_all is not None and faster.all_to_all.bandwidth == 300 * GB
    assert ClusterSpec.model_validate({"gpu": "A100-80GB-SXM", "nodes": 1}).all_to_all is None
    assert math.isclose(cluster.all_to_all.efficiency, NODE_PRESETS["dgx-h100"].all_to_all.efficiency)  # type: ignore[union-attr]
