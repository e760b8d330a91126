"""Lockstep copies solved as one (sim.network.mirror, FlowNetwork.images): the same rates, times and link usage, bit
for bit, as running every copy's flows; refused where the copies share a link or differ."""

from __future__ import annotations

import random
from dataclasses import astuple
from pathlib import Path

import pytest

from sim import runner
from sim.engine import event as engine
from sim.network import models as network
from sim.network.flows import FlowNetwork, MirrorBroken
from sim.network.mirror import Mirror
from sim.network.models import FlowChannel, TransferPhase
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload import build as workload
from sim.workload.ir import TaskGraph

SPINE = Path(__file__).resolve().parent.parent / "scenarios" / "llama2-7b_h100-32_spine.yaml"


def _phase(links: list[int], nbytes: float = 1e6, cap: float = 10.0) -> tuple[TransferPhase, ...]:
    return (TransferPhase(1e-6, (FlowChannel(tuple((link, 1) for link in links), nbytes, cap),)),)


def test_mirror_maps_copies_and_refuses_shared_or_unequal_links() -> None:
    mirror = Mirror(2, [5.0, 5.0, 5.0, 5.0, 7.0, 5.0])
    assert mirror.add([_phase([0, 1]), _phase([2, 3])])
    assert mirror.images == {0: (2,), 1: (3,)} and mirror.links() == {0, 1, 2, 3}
    assert mirror.add([_phase([1]), _phase([3])])  # the same map
    assert not mirror.add([_phase([0]), _phase([5])]) and "different links" in mirror.reason
    assert not mirror.add([_phase([5]), _phase([2])]) and "two roles" in mirror.reason  # 2 is an image already
    assert not mirror.add([_phase([5]), _phase([5])]) and "two copies" in mirror.reason  # both copies cross link 5
    assert not mirror.add([_phase([5]), _phase([4])]) and "capacities" in mirror.reason
    assert not mirror.add([_phase([5]), _phase([4], cap=11.0)]) and "rate caps" in mirror.reason
    assert mirror.images == {0: (2,), 1: (3,)}  # refused transfers leave the map as it was


def test_one_copy_gives_every_copy_the_same_floats_as_running_them_all() -> None:
    """Random flows over 5 representative links, run once with their 2 images (links 5-9, 10-14) as flows of
    their own, once mirrored: every finish time and every link's usage and segments are equal as floats."""
    rng = random.Random(7)
    caps = [rng.choice([10.0, 25.0, 40.0]) for _ in range(5)]
    full = FlowNetwork(caps * 3, record_segments=True)
    one = FlowNetwork(caps * 3, record_segments=True, images={link: (link + 5, link + 10) for link in range(5)})
    live: list[int] = []
    now, key = 0.0, 0
    for _ in range(300):
        now += rng.choice([0.0, rng.random()])
        if live and rng.random() < 0.45:
            flow = live.pop(rng.randrange(len(live)))
            got = one.remove(flow, now)
            expect = full.remove(3 * flow, now)
            for copy in (1, 2):
                full.remove(3 * flow + copy, now)
        else:
            links = rng.sample(range(5), rng.randint(1, 3))
            loads = tuple((link, rng.randint(1, 2)) for link in links)
            nbytes, cap = rng.uniform(1, 50), rng.choice([5.0, 12.0, 30.0])
            got = one.add(key, loads, nbytes, cap, now)
            expect = full.add(3 * key, loads, nbytes, cap, now)
            for copy in (1, 2):
                full.add(3 * key + copy, tuple((link + 5 * copy, n) for link, n in loads), nbytes, cap, now)
            live.append(key)
            key += 1
        assert got == {k // 3: t for k, t in expect.items()}  # copy 0's keys are 3 x the mirrored ones
    full.close(now + 1.0)
    one.close(now + 1.0)
    assert sorted(one.links) == sorted(full.links) == list(range(15))
    assert all(astuple(one.links[link]) == astuple(full.links[link]) for link in range(15))
    assert one.segments == full.segments
    assert one.images == {}


def test_unmirror_refuses_while_a_mirrored_flow_runs_and_copies_the_state_after() -> None:
    flows = FlowNetwork([10.0, 10.0, 10.0], images={0: (1,)})
    flows.add(0, ((0, 1),), 5.0, 10.0, 0.0)
    with pytest.raises(MirrorBroken):
        flows.unmirror()
    flows.remove(0, 0.5)
    flows.unmirror()
    assert flows.images == {} and astuple(flows.links[1]) == astuple(flows.links[0])
    assert flows.links[1].bytes == 5.0 and flows.links[1].busy_s == 0.5


def _spine(extra: list[str]) -> tuple[network.ContentionNetwork, TaskGraph]:
    scenario = load_scenario(SPINE, extra)
    plan = resolve(scenario)
    net = network.make(scenario.network.model, runner.build_topology(plan), scenario.network.algorithm)
    assert isinstance(net, network.ContentionNetwork)
    return net, workload.build(plan)


@pytest.mark.parametrize("extra", [[], ["cluster.fabric.oversubscription=1"], ["cluster.fabric.nodes_per_leaf=1"]],
                         ids=lambda e: ",".join(e) or "4:1")
@pytest.mark.parametrize("record", [False, True], ids=["booked", "timeline"])
def test_a_rail_optimized_fabric_mirrors_the_tp_peers_with_the_same_result(extra: list[str], record: bool) -> None:
    net, graph = _spine(extra)
    assert graph.lockstep == 8
    found = engine.lockstep_mirror(graph, net, [t.duration for t in graph.tasks],
                                   lambda t: net.transfer(t.op, t.nbytes, t.group, t.skew), set())
    assert found is not None and found[1]  # the DP rings' 8 copies: one per rail
    mirrored, full = engine.simulate(graph, net, record), engine.simulate(graph, net, record, mirror=False)
    assert mirrored.start == full.start and mirrored.end == full.end
    assert mirrored.events < full.events
    assert mirrored.flows is not None and full.flows is not None
    usage = {link: astuple(u) for link, u in full.flows.links.items()}
    assert {link: astuple(u) for link, u in mirrored.flows.links.items()} == usage
    assert mirrored.flows.segments == full.flows.segments


def test_copies_sharing_a_leaf_uplink_are_not_mirrored() -> None:
    """Without rail optimization every NIC of a leaf group goes to one leaf, whose uplink all 8 copies cross."""
    net, graph = _spine(["cluster.fabric.rail_optimized=false"])
    assert graph.lockstep == 8
    assert engine.lockstep_mirror(graph, net, [t.duration for t in graph.tasks],
                                  lambda t: net.transfer(t.op, t.nbytes, t.group, t.skew), set()) is None
    mirrored, full = engine.simulate(graph, net), engine.simulate(graph, net, mirror=False)
    assert mirrored.end == full.end and mirrored.events == full.events


@pytest.mark.parametrize("busy", [False, True], ids=["between-transfers", "mid-transfer"])
def test_a_transfer_crossing_the_mirror_stops_it_or_replays_without_it(busy: bool,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The TP collectives (run as flows when the link timeline is recorded) declared as crossing the mirror's links.
    Stopped with no mirrored flow running (the first TP collective, before any DP transfer), the images take their
    representatives' state and the replay goes on with every copy as flows. Stopped while a DP ring's mirrored flow
    runs (the stops asked before that ignored: the TP flows do not really cross the map), the replay starts again
    without the mirror. Both equal the replay without it, bit for bit."""
    net, graph = _spine([])
    found = engine.lockstep_mirror
    tp = {(t.op, t.nbytes, t.group, t.skew) for t in graph.tasks if t.kind == "tp"}

    def crossing(*args: object) -> tuple[Mirror, set[tuple[object, ...]], set[tuple[object, ...]]] | None:
        result = found(*args)  # type: ignore[arg-type]
        assert result is not None and result[1] and not result[2]
        return result[0], result[1], tp

    calls: list[str] = []
    unmirror = FlowNetwork.unmirror

    def counted(self: FlowNetwork) -> None:
        if busy and not any(link in self.images for flow in self.flows.values() for link, _ in flow.loads):
            return  # wait for a mirrored flow to be running
        try:
            unmirror(self)
            calls.append("stopped")
        except MirrorBroken:
            calls.append("broken")
            raise

    monkeypatch.setattr(engine, "lockstep_mirror", crossing)
    monkeypatch.setattr(FlowNetwork, "unmirror", counted)
    stopped, full = engine.simulate(graph, net, True), engine.simulate(graph, net, True, mirror=False)
    # (a failed process surfaces from simpy's loop after the events already due at that instant: others may ask too)
    assert calls and set(calls) == ({"broken"} if busy else {"stopped"})
    assert stopped.start == full.start and stopped.end == full.end
    assert stopped.flows is not None and full.flows is not None
    usage = {link: astuple(u) for link, u in full.flows.links.items()}
    assert {link: astuple(u) for link, u in stopped.flows.links.items()} == usage
    assert stopped.flows.segments == full.flows.segments
