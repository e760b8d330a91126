"""Network models the engine asks for communication times.

In: a ``Topology``, an algorithm choice (``auto`` or one of sim.network.collectives.ALGORITHMS) and, per request, a
collective (op, bytes, group of global ranks) or a point-to-point transfer (bytes, source, destination).
Out: seconds (``collective_time``, ``p2p_time``), the algorithm used (``algorithm_for``), and for the
flow-level model the phases of a transfer (``transfer``): a latency, then channels whose hops load links.

``ideal``: every transfer takes zero time (for exact schedule tests).
``analytic``: the closed forms of sim.network.collectives on the tiers the group crosses, each tier's bandwidth
scaled by its efficiency curve at the message size. ``auto`` takes the fastest applicable algorithm, as
NCCL's tuner does; a fixed algorithm that does not apply to a collective (tree for an all-gather, NVLS
without NVSwitch reduction or across nodes) falls back to ring. Results are cached.
``contention``: the same algorithm choice, but the engine moves each channel as a flow over the links of its
route (sim.network.flows shares every link max-min fairly); uncontended, it takes exactly the analytic time.
An all-to-all is NCCL's grouped send/recv to every peer on both (sim.network.collectives ``all_to_all_terms``):
intra-domain peers over NVLink (the topology's ``all_to_all_link``), the others over each GPU's NIC share, the
slower tier and the slowest rank setting the time; the contention model moves every (sender, receiver) pair
along its route (PXN included), capped at its tier's per-peer share (a sender's pairs of one tier as one flow).
``skew`` (max/mean bytes per receiving rank, an MoE router's imbalance) makes the group's first rank the hottest
receiver; only an all-to-all takes one.
DeepEP's dispatch and combine (ops ``deepep_dispatch`` / ``deepep_combine``, ``moe.token_dispatcher: flex``) are
priced from the run's ``DeepepTraffic`` (sim.network.deepep): analytic, its closed form; contention, its RDMA flows
(one per destination node) and NVLink flows (one per destination rank) at once, capped so that alone they end at
that closed form (``deepep_flows``).
It is a ``FlowLevelNetwork``: the protocol the event engine and the estimate read (``is_flow_level``).

The topology is only a type here (imported for type checking): the engine imports this module for
``TransferPhase`` and the protocols, and must not load the topology's hardware specs (pydantic) or networkx.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol, TypeGuard

from sim.network.collectives import (
    Channel,
    all_to_all_channels,
    all_to_all_terms,
    bytes_moved,
    check_skew,
    multinode_ring_time,
    nvls_time,
    p2p_time,
    ring_channels,
    ring_orders,
    ring_time,
    tree_channels,
    tree_time,
)
from sim.network.deepep import OPS as DEEPEP_OPS
from sim.network.deepep import DeepepTraffic, deepep_flows

if TYPE_CHECKING:
    from sim.network.topology import Topology


class Network(Protocol):
    name: str
    flow_level: bool

    def collective_time(self, op: str, nbytes: float, group: tuple[int, ...], skew: float = 1.0) -> float: ...

    def p2p_time(self, nbytes: float, src: int, dst: int) -> float: ...


@dataclass(frozen=True)
class FlowChannel:
    loads: tuple[tuple[int, int], ...]  # (link index, how many of this channel's hops cross it)
    nbytes: float  # per hop
    rate_cap: float  # bytes/s per hop when nothing else shares its links (the analytic rate)


@dataclass(frozen=True)
class TransferPhase:
    latency: float
    channels: tuple[FlowChannel, ...]


class FlowLevelNetwork(Network, Protocol):
    """A network whose transfers the event engine moves as flows over links (``flow_level`` is True):
    ``capacities`` are the links' bytes/s by link index (the topology's ``links`` order, as ``FlowChannel.loads``
    index them), and ``transfer`` gives a collective's or a send's phases (op, bytes, group of global ranks; a
    send's group is (src, dst); ``skew``: an all-to-all's max/mean bytes per receiving rank): each a latency, then
    channels that run as flows."""

    capacities: list[float]

    def transfer(self, op: str, nbytes: float, group: tuple[int, ...],
                 skew: float = 1.0) -> tuple[TransferPhase, ...]: ...


def is_flow_level(network: Network) -> TypeGuard[FlowLevelNetwork]:
    """Whether the engine must move this network's transfers as flows (then it is a ``FlowLevelNetwork``)."""
    return network.flow_level


class IdealNetwork:
    name = "ideal"
    flow_level = False

    def collective_time(self, op: str, nbytes: float, group: tuple[int, ...], skew: float = 1.0) -> float:
        _check_skew(op, skew, len(group))
        return 0.0

    def p2p_time(self, nbytes: float, src: int, dst: int) -> float:
        return 0.0


class AnalyticNetwork:
    name = "analytic"
    flow_level = False
    shared_nics = True  # symmetric traffic: a GPU gets its share of the node's NICs (see Topology.rail_bandwidth)

    def __init__(self, topology: Topology, algorithm: str = "auto", protocol: str = "auto",
                 deepep: DeepepTraffic | None = None) -> None:
        self.topology = topology
        self.algorithm = algorithm
        self.protocol = protocol  # NCCL_PROTO for rings across nodes (sim.network.collectives.RING_PROTOCOLS)
        self.deepep = deepep  # the run's DeepEP exchanges (moe.token_dispatcher: flex), else None
        self.options = lru_cache(maxsize=None)(self._options)
        self.p2p_time = lru_cache(maxsize=None)(self._p2p_time)  # type: ignore[method-assign]
        self.all_to_all_terms = lru_cache(maxsize=None)(self._all_to_all_terms)

    # ------------------------------------------------------------------------------ algorithm choice
    def _options(self, op: str, nbytes: float, group: tuple[int, ...]) -> dict[str, float]:
        """Time of every algorithm that applies to this collective on this group: its base latency (one per
        collective), its latency steps, and its bandwidth term at the tier's efficiency for this size."""
        topo, n = self.topology, len(group)
        if n <= 1:
            return {"ring": 0.0}
        if op == "send":
            return {"ring": self.p2p_time(nbytes, group[0], group[1])}
        if op == "all_to_all":  # NCCL's one way: send/recv to every peer (its p2p schedule, not a ring)
            return {"ring": sum(self.all_to_all_terms(nbytes, group, 1.0))}
        intra = topo.intra_node
        if topo.in_one_domain(group):
            base, bandwidth = intra.base_latency, intra.bandwidth_at(nbytes, n)
            times = {"ring": base + ring_time(op, nbytes, n, intra.latency, bandwidth)}
            if op == "all_reduce":
                times["tree"] = base + tree_time(nbytes, math.ceil(math.log2(n)) * intra.latency, bandwidth)
                if topo.nvls is not None:
                    nvls = topo.nvls
                    times["nvls"] = nvls.base_latency + nvls_time(nbytes, nvls.latency, nvls.bandwidth_at(nbytes))
            return times
        tier = topo.tier(group, self.shared_nics)
        base, bandwidth = tier.base_latency, tier.bandwidth_at(nbytes)
        local, domains = self._local_shape(group)
        nodes = len(topo.per_node(group))
        # Across nodes the ring's steps pay NCCL's per-protocol hop latencies (sim.network.collectives
        # RING_PROTOCOLS): a ring of 1,536 ranks has 1,535 steps.
        times = {"ring": base + multinode_ring_time(op, nbytes, n, nodes, bandwidth, self.protocol)[0]}
        if op == "all_reduce":
            depth = (local - 1) * intra.latency + math.ceil(math.log2(domains)) * tier.latency
            times["tree"] = base + tree_time(nbytes, depth, bandwidth)
        # NCCL runs all-gather and reduce-scatter across nodes as rings only (tuning.cc: "if (coll !=
        # ncclCollAllReduce && a != NCCL_ALGO_RING) continue"; PAT, 2.23+, only at one GPU per node): the 2D
        # scheme is offered to ``auto`` for all-reduce, and for the others only when asked for by name.
        two_d = op == "all_reduce" or (self.algorithm == "hierarchical" and op in ("reduce_scatter", "all_gather"))
        if two_d and local > 1:
            times["hierarchical"] = sum(seconds for seconds, _ in self._hierarchical(op, nbytes, group))
        return times

    def _domain_counts(self, group: tuple[int, ...]) -> dict[int, int]:
        """NVLink domain -> how many of the group's ranks it holds (counted in C: this runs per collective)."""
        return Counter(map(self.topology.nvlink_domain.__rfloordiv__, group))  # rank // domain (Topology.domain_of)

    def _local_shape(self, group: tuple[int, ...]) -> tuple[int, int]:
        """(members per NVLink domain, domains) when every domain holds the same number, else (1, n)."""
        counts = self._domain_counts(group)
        sizes = set(counts.values())
        return (sizes.pop(), len(counts)) if len(sizes) == 1 else (1, len(group))

    def _hierarchical(self, op: str, nbytes: float, group: tuple[int, ...]) -> list[tuple[float, str]]:
        """TransferPhase times of the 2D algorithm: (seconds, which tier) in execution order."""
        topo = self.topology
        local, domains = self._local_shape(group)
        intra = topo.intra_node
        inter = topo.inter_node.model_copy(update={"bandwidth": topo.rail_bandwidth(1, self.shared_nics)})
        part = nbytes / local
        inner_bw = intra.bandwidth_at(nbytes, local)
        inner = {op_: intra.base_latency + ring_time(op_, nbytes, local, intra.latency, inner_bw)
                 for op_ in ("reduce_scatter", "all_gather")}
        outer = inter.base_latency + ring_time(op, part, domains, inter.latency, inter.bandwidth_at(part))
        if op == "all_reduce":
            return [(inner["reduce_scatter"], "intra"), (outer, "inter"), (inner["all_gather"], "intra")]
        if op == "reduce_scatter":
            return [(inner["reduce_scatter"], "intra"), (outer, "inter")]
        return [(outer, "inter"), (inner["all_gather"], "intra")]

    def algorithm_for(self, op: str, nbytes: float, group: tuple[int, ...]) -> str:
        options = self.options(op, nbytes, group)
        if self.algorithm == "auto":
            return min(options, key=options.__getitem__)  # ties: ring first (dict order)
        return self.algorithm if self.algorithm in options else "ring"

    def _deepep_traffic(self, op: str) -> DeepepTraffic:
        if self.deepep is None:
            raise ValueError(f"{op}: this network was made without the run's DeepEP traffic (models.make's deepep)")
        return self.deepep

    def collective_time(self, op: str, nbytes: float, group: tuple[int, ...], skew: float = 1.0) -> float:
        if op in DEEPEP_OPS:  # DeepEP's closed form (sim.network.deepep.deepep_time)
            _check_skew(op, skew, len(group))
            return self._deepep_traffic(op).seconds(op, skew) if len(group) > 1 else 0.0
        if skew != 1.0:
            _check_skew(op, skew, len(group))
            return sum(self.all_to_all_terms(nbytes, group, skew))
        return self.options(op, nbytes, group)[self.algorithm_for(op, nbytes, group)]

    def _all_to_all_shape(self, nbytes: float, group: tuple[int, ...]) -> list[tuple[int, float, float, float]]:
        """Per distinct domain count ``local`` of the group: (local, NVLink bandwidth at this size and local
        group, the per-GPU NIC bandwidth, the network's per-peer latency); the NIC figures only across domains."""
        topo = self.topology
        counts = self._domain_counts(group)
        nvlink = topo.all_to_all_link
        net_bandwidth, net_latency = math.inf, 0.0
        if len(counts) > 1:  # each GPU's own NIC (its share of the node's NICs when shared: analytic)
            inter = topo.inter_node.model_copy(update={"bandwidth": topo.rail_bandwidth(1, self.shared_nics)})
            net_bandwidth, net_latency = inter.bandwidth_at(nbytes), inter.latency
        return [(local, nvlink.bandwidth_at(nbytes, local) if local > 1 else math.inf, net_bandwidth, net_latency)
                for local in sorted(set(counts.values()))]

    def _all_to_all_terms(self, nbytes: float, group: tuple[int, ...], skew: float) -> tuple[float, float]:
        """(base + per-peer latencies, bandwidth seconds) of an all-to-all, each at its worst rank
        (sim.network.collectives.all_to_all_terms)."""
        n = len(group)
        check_skew(skew, n)
        if n <= 1 or nbytes <= 0:
            return 0.0, 0.0
        topo, nvlink = self.topology, self.topology.all_to_all_link
        shape = self._all_to_all_shape(nbytes, group)
        base = nvlink.base_latency if len(shape) == 1 and topo.in_one_domain(group) else max(
            nvlink.base_latency, topo.inter_node.base_latency)
        terms = [all_to_all_terms(nbytes, n, local, nvlink.latency, nvlink_bw, net_latency, net_bw, skew)
                 for local, nvlink_bw, net_bw, net_latency in shape]
        return base + max(latency for latency, _ in terms), max(seconds for _, seconds in terms)

    def _p2p_time(self, nbytes: float, src: int, dst: int) -> float:
        link = self.topology.tier((src, dst), self.shared_nics)
        return link.base_latency + p2p_time(nbytes, link.latency, link.bandwidth_at(nbytes))


class ContentionNetwork(AnalyticNetwork):
    """Analytic choice of algorithm; the engine moves its channels as flows (see sim.network.flows). A
    ``FlowLevelNetwork``."""

    name = "contention"
    flow_level = True
    shared_nics = False  # NIC sharing is what the flows compute

    def __init__(self, topology: Topology, algorithm: str = "auto", protocol: str = "auto",
                 deepep: DeepepTraffic | None = None) -> None:
        super().__init__(topology, algorithm, protocol, deepep)
        self.capacities = [link.capacity for link in topology.links]
        self.transfer = lru_cache(maxsize=None)(self._transfer)

    def _channels(self, channels: list[Channel], rate_cap: float) -> list[FlowChannel]:
        out = []
        for channel in channels:
            loads: dict[int, int] = {}
            for src, dst in channel.hops:
                for link in self.topology.route(src, dst):
                    loads[link] = loads.get(link, 0) + 1
            if loads and channel.nbytes > 0:
                out.append(FlowChannel(tuple(loads.items()), channel.nbytes, rate_cap))
        return out

    def _ring_phase(self, op: str, nbytes: float, group: tuple[int, ...], seconds: float,
                    bandwidth: float) -> TransferPhase:
        """A ring taking ``seconds`` uncontended at ``bandwidth`` per rank: the latency is what the bandwidth term
        leaves of it."""
        node_of = {rank: self.topology.node_of(rank) for rank in group}
        orders = ring_orders(group, node_of)
        flows = self._channels(ring_channels(op, nbytes, orders), bandwidth / len(orders))
        moved = bytes_moved("ring", op, len(group), nbytes)
        return TransferPhase(max(0.0, seconds - moved / bandwidth), tuple(flows))

    def _all_to_all_phase(self, nbytes: float, group: tuple[int, ...], skew: float) -> TransferPhase:
        """The analytic latency, then the (sender, receiver) hops (sim.network.collectives.all_to_all_channels),
        each capped at the sender's per-peer share of its tier (NVLink: B_nvl / (local-1); NIC: B_net /
        (n-local)), so that uncontended the hottest receiver's hops end at the analytic time and the others
        earlier."""
        topo, n = self.topology, len(group)
        latency, _ = self.all_to_all_terms(nbytes, group, skew)
        domain_of = {rank: topo.domain_of(rank) for rank in group}
        members = self._domain_counts(group)
        caps = {local: (nvlink_bw / (local - 1) if local > 1 else math.inf,
                        net_bw / (n - local) if n > local else math.inf)
                for local, nvlink_bw, net_bw, _ in self._all_to_all_shape(nbytes, group)}
        flows: list[FlowChannel] = []
        for channel in all_to_all_channels(nbytes, group, skew, domain_of):
            src, dst = channel.hops[0]
            nvlink_cap, net_cap = caps[members[domain_of[src]]]
            flows += self._channels([channel], nvlink_cap if domain_of[src] == domain_of[dst] else net_cap)
        return TransferPhase(latency, tuple(flows))

    def _deepep_phase(self, op: str, group: tuple[int, ...], skew: float) -> TransferPhase:
        """A DeepEP dispatch or combine: no latency term (the closed form has none: docs/mechanisms/deepep.md),
        then its RDMA and NVLink flows at once (sim.network.deepep.deepep_flows), each on its route. A sender's
        flows of one tier (and to the hot receiver apart) move as one channel, as NCCL's all-to-all's do
        (sim.network.collectives.all_to_all_channels): each pair still loads its own route with its own bytes at
        its own cap, and the pairs progress together (they leave through the sender's one NIC, or its one NVLink
        port), so the solver sees about 2 flows per rank rather than one per destination (2 nodes x 4 ranks:
        16 flows, not 32)."""
        domain_of = {rank: self.topology.domain_of(rank) for rank in group}
        channels: dict[tuple[int, float, float], list[tuple[int, int]]] = {}
        for src, dst, nbytes, cap in deepep_flows(op, self._deepep_traffic(op), group, domain_of, skew):
            channels.setdefault((src, nbytes, cap), []).append((src, dst))
        flows: list[FlowChannel] = []
        for (_, nbytes, cap), hops in channels.items():
            flows += self._channels([Channel(tuple(hops), nbytes)], cap)
        return TransferPhase(0.0, tuple(flows))

    def _transfer(self, op: str, nbytes: float, group: tuple[int, ...],
                  skew: float = 1.0) -> tuple[TransferPhase, ...]:
        topo, n = self.topology, len(group)
        _check_skew(op, skew, n)
        if n <= 1 or nbytes <= 0:
            return ()
        if op == "all_to_all":
            return (self._all_to_all_phase(nbytes, group, skew),)
        if op in DEEPEP_OPS:
            return (self._deepep_phase(op, group, skew),)
        if op == "send":
            bandwidth = topo.tier(group, self.shared_nics).bandwidth_at(nbytes)
            latency = self.p2p_time(nbytes, group[0], group[1]) - nbytes / bandwidth
            hop = self._channels([Channel(((group[0], group[1]),), nbytes)], bandwidth)
            return (TransferPhase(latency, tuple(hop)),)
        algorithm = self.algorithm_for(op, nbytes, group)
        seconds = self.options(op, nbytes, group)[algorithm]
        inside = topo.in_one_domain(group)
        tier = topo.intra_node if inside else topo.tier(group, self.shared_nics)
        size = n if inside else None  # the group-size factor is NVLink's (fewer NCCL channels in small groups)
        if algorithm == "nvls":
            assert topo.nvls is not None
            bandwidth = topo.nvls.bandwidth_at(nbytes)
            loads = []
            for rank in group:
                switch = f"nvswitch{topo.domain_of(rank)}"
                loads += [(topo.link_index[(f"gpu{rank}", switch)], 1), (topo.link_index[(switch, f"gpu{rank}")], 1)]
            return (TransferPhase(seconds - nbytes / bandwidth, (FlowChannel(tuple(loads), nbytes, bandwidth),)),)
        if algorithm == "tree":
            bandwidth = tier.bandwidth_at(nbytes, size)
            trees = tree_channels(nbytes, group, {rank: 0 if inside else topo.node_of(rank) for rank in group})
            per_node = len(trees) // 2
            channels = tuple(self._channels(trees, bandwidth / (4 * per_node)))
            return (TransferPhase(seconds - 2 * nbytes / bandwidth, channels),)
        if algorithm == "hierarchical":
            return self._hierarchical_phases(op, nbytes, group)
        return (self._ring_phase(op, nbytes, group, seconds, tier.bandwidth_at(nbytes, size)),)

    def _hierarchical_phases(self, op: str, nbytes: float, group: tuple[int, ...]) -> tuple[TransferPhase, ...]:
        """The 2D algorithm's phases, each one ring per NVLink domain (inside) or per local rank (across)."""
        topo = self.topology
        local, _ = self._local_shape(group)
        by_domain: dict[int, list[int]] = {}
        for rank in group:
            by_domain.setdefault(topo.domain_of(rank), []).append(rank)
        domains = list(by_domain.values())
        intra = topo.intra_node
        inter = topo.inter_node.model_copy(update={"bandwidth": topo.rail_bandwidth(1, self.shared_nics)})
        times = iter(seconds for seconds, _ in self._hierarchical(op, nbytes, group))

        def phase(rings: list[tuple[int, ...]], op_: str, size: float, bandwidth: float) -> TransferPhase:
            seconds = next(times)
            parts = [self._ring_phase(op_, size, ring, seconds, bandwidth) for ring in rings]
            return TransferPhase(parts[0].latency, tuple(c for p in parts for c in p.channels))

        inside = [tuple(d) for d in domains]
        across = [tuple(d[i] for d in domains) for i in range(local)]
        part = nbytes / local
        inner_bw, outer_bw = intra.bandwidth_at(nbytes, local), inter.bandwidth_at(part)
        if op == "all_reduce":
            return (phase(inside, "reduce_scatter", nbytes, inner_bw), phase(across, op, part, outer_bw),
                    phase(inside, "all_gather", nbytes, inner_bw))
        if op == "reduce_scatter":
            return phase(inside, "reduce_scatter", nbytes, inner_bw), phase(across, op, part, outer_bw)
        return phase(across, op, part, outer_bw), phase(inside, "all_gather", nbytes, inner_bw)


def transfer_time(network: Network, op: str, nbytes: float, group: tuple[int, ...], skew: float = 1.0) -> float:
    """A communication task's time on a network whose times do not depend on other traffic: a send (``group`` is
    (src, dst)) by ``p2p_time``, a collective by ``collective_time`` (an all-to-all with its ``skew``). Both
    replays price transfers with it."""
    if op == "send":
        return network.p2p_time(nbytes, group[0], group[1])
    if skew != 1.0:
        return network.collective_time(op, nbytes, group, skew)
    return network.collective_time(op, nbytes, group)


def _check_skew(op: str, skew: float, n: int) -> None:
    """Only an all-to-all (NCCL's or DeepEP's) takes a routing skew (max/mean bytes per receiving rank), in
    [1, n]."""
    if skew != 1.0:
        if op != "all_to_all" and op not in DEEPEP_OPS:
            raise ValueError(f"skew: only an all_to_all has a routing skew, not {op} (got skew {skew})")
        check_skew(skew, n)


def make(name: str, topology: Topology, algorithm: str = "auto", protocol: str = "auto",
         deepep: DeepepTraffic | None = None) -> Network:
    """The network model ``name`` on ``topology``; ``deepep``: the run's DeepEP traffic (``Plan.deepep_traffic``),
    which prices the ``deepep_*`` ops (the ideal network makes every transfer free)."""
    if name == "ideal":
        return IdealNetwork()
    if name == "analytic":
        return AnalyticNetwork(topology, algorithm, protocol, deepep)
    if name == "contention":
        return ContentionNetwork(topology, algorithm, protocol, deepep)
    raise ValueError(f"unknown network model {name!r}")
