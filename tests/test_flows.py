"""Link contention: max-min fair sharing, by hand and through the engine."""

import pytest

from sim.engine.event import simulate
from sim.hardware.links import LinkSpec
from sim.network.flows import FlowNetwork, max_min_rates
from sim.network.models import AnalyticNetwork, ContentionNetwork
from sim.network.topology import build
from sim.workload.ir import TaskGraph

LINE = LinkSpec(bandwidth=1e9, latency=0.0)  # 1 GB/s, no latency, no efficiency loss: times read as bytes/1e9


def send(g, src, dst, nbytes, deps=()):
    return g.add(rank=src, stage=0, stream="pp", kind="pp", name="send", microbatch=0, layer=-1, deps=list(deps),
                 op="send", nbytes=nbytes, group=(src, dst))


def test_three_flows_with_different_bottlenecks_get_the_hand_computed_rates():
    # Links: A (10), B (4). Flow 1 crosses A, flow 2 crosses A and B, flow 3 crosses B twice (two hops).
    # Filling: B saturates when 2 + 1... r2 + 2 r3 = 4 with r2 = r3 = r -> r = 4/3; flow 1 then takes A's rest.
    rates = max_min_rates({1: ((0, 1),), 2: ((0, 1), (1, 1)), 3: ((1, 2),)}, {1: 1e9, 2: 1e9, 3: 1e9}, [10.0, 4.0])
    assert rates[2] == pytest.approx(4 / 3) and rates[3] == pytest.approx(4 / 3)
    assert rates[1] == pytest.approx(10 - 4 / 3)


def test_a_capped_flow_leaves_its_share_to_the_others():
    rates = max_min_rates({1: ((0, 1),), 2: ((0, 1),), 3: ((0, 1),)}, {1: 1.0, 2: 1e9, 3: 1e9}, [10.0])
    assert rates == pytest.approx({1: 1.0, 2: 4.5, 3: 4.5})


def test_rates_are_recomputed_when_flows_come_and_go():
    flows = FlowNetwork([1.0])
    assert flows.add(0, ((0, 1),), 10.0, 1e9, now=0.0) == {0: 10.0}
    # At t=4 a 2-byte flow joins: both run at 0.5, so it ends at 8; the first has 6 - 2 = 4 left, alone: 12.
    assert flows.add(1, ((0, 1),), 2.0, 1e9, now=4.0) == pytest.approx({0: 16.0, 1: 8.0})
    assert flows.remove(1, now=8.0) == pytest.approx({0: 12.0})
    flows.remove(0, now=12.0)
    flows.close(12.0)
    usage = flows.links[0]
    assert usage.bytes == pytest.approx(12.0) and usage.busy_s == pytest.approx(12.0)
    assert usage.saturated_s == pytest.approx(12.0) and usage.peak_load == pytest.approx(1.0)


def test_two_flows_on_one_link_each_take_twice_as_long():
    topo = build(2, 2, LINE, LINE, nics_per_node=1)  # both GPUs of a node share one NIC
    g = TaskGraph()
    send(g, 0, 2, 1e9)
    send(g, 1, 3, 1e9)
    result = simulate(g, ContentionNetwork(topo, "ring"))
    assert result.end == pytest.approx([2.0, 2.0])
    alone = TaskGraph()
    send(alone, 0, 2, 1e9)
    assert simulate(alone, ContentionNetwork(topo, "ring")).end == pytest.approx([1.0])


def test_flows_on_disjoint_links_do_not_slow_each_other():
    topo = build(2, 2, LINE, LINE)  # one NIC per GPU, one rail each
    g = TaskGraph()
    send(g, 0, 2, 1e9)
    send(g, 1, 3, 1e9)
    assert simulate(g, ContentionNetwork(topo, "ring")).end == pytest.approx([1.0, 1.0])


def test_uncontended_transfers_take_the_analytic_time():
    node = build(2, 8, LinkSpec(bandwidth=400e9, latency=1e-6, base_latency=10e-6, efficiency=0.8,
                                efficiency_curve=[[2**20, 0.3], [2**28, 1.0]]),
                 LinkSpec(bandwidth=50e9, latency=5e-6, base_latency=10e-6, efficiency=0.9),
                 nvls=LinkSpec(bandwidth=450e9, latency=2e-6, efficiency=0.6))
    for algorithm in ("ring", "tree", "hierarchical", "nvls", "auto"):
        analytic, contention = AnalyticNetwork(node, algorithm), ContentionNetwork(node, algorithm)
        for op, group in (("all_reduce", tuple(range(8))), ("all_reduce", tuple(range(16))),
                          ("all_gather", tuple(range(16))), ("reduce_scatter", (0, 8)),
                          ("all_to_all", tuple(range(8))), ("broadcast", (0, 1, 2, 3))):
            for size in (1e5, 3e7, 1e9):
                g = TaskGraph()
                for rank in group:
                    g.add(rank=rank, stage=0, stream="dp", kind="dp", name=op, microbatch=0, layer=0, deps=[],
                          op=op, nbytes=size, group=group)
                end = max(simulate(g, contention).end)
                assert end == pytest.approx(analytic.collective_time(op, size, group), rel=1e-9), (algorithm, op, size)


def _usage(flows):
    return {link: (u.bytes, u.busy_s, u.saturated_s, u.peak_load) for link, u in sorted(flows.links.items())}


def test_lone_bookings_settled_later_give_the_same_floats_as_booking_each_time():
    # Three transfers: two share link 1, one crosses link 2 twice (two channels), one saturates link 0. Booked in
    # an irregular order, then a flow comes onto link 2 and the booking that crosses it goes on after it.
    capacities = [3.0, 7.0, 11.0, 13.0]
    rows = [((0, 1), (1, 2)), ((1, 1), (2, 1), (2, 1)), ((3, 3),)]
    sizes, rates = [0.1, 0.7, 1.3], [3.0, 0.9, 1.1]
    order = [0, 1, 1, 2, 0, 1, 2, 2, 0, 1] * 7

    transfers = list(zip(rows, sizes, rates, strict=True))
    eager = FlowNetwork(capacities)
    bookings = [eager.alone_bookings(loads, nbytes, rate) for loads, nbytes, rate in transfers]
    late = FlowNetwork(capacities)
    numbers = [late.register_lone(late.alone_rows(loads, nbytes, rate)) for loads, nbytes, rate in transfers]
    for network, book in ((eager, lambda b: eager.book(bookings[b])), (late, lambda b: late.book_lone(numbers[b]))):
        for b in order:
            book(b)
        network.add(0, ((2, 1),), 5.0, 2.0, now=1.0)
        for b in order[:9]:
            book(b)
        network.remove(0, now=3.5)
        book(1)
        network.close(4.0)
    assert _usage(late) == _usage(eager)  # bit for bit, not approximately
    assert late.links[0].saturated_s == late.links[0].busy_s > 0  # the rate-3 transfer fills link 0
    assert late.lone_booked == []


def test_a_flow_alone_on_links_that_cannot_bind_runs_at_its_cap():
    flows = FlowNetwork([10.0, 10.0])
    assert flows.add(0, ((0, 1), (1, 2)), 6.0, 4.0, now=0.5) == {0: 0.5 + 6.0 / 4.0}
    assert flows.links[1].load == 8.0 and flows.demand == {0: 4.0, 1: 8.0}
    # A second flow makes link 1 bind (demand 12 > 10): both share it, 10 / (2 + 1) each.
    finish = flows.add(1, ((1, 1),), 3.0, 4.0, now=1.0)
    assert finish == pytest.approx({0: 1.0 + (6.0 - 2.0) / (10 / 3), 1: 1.0 + 3.0 / (10 / 3)})
