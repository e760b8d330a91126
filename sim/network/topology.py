"""The cluster as a directed graph of links.

In: nodes, GPUs per node, the link tiers (``LinkSpec``: NVLink per GPU, as rings and as all-to-alls use it,
InfiniBand per NIC, PCIe to the host), NICs per node, GPUs per NVSwitch domain and the leaf/spine fabric
(``FabricSpec``). Out: a ``Topology``: a networkx DiGraph (nodes ``gpu{r}``, ``nvswitch{d}``, ``nic{node}.{i}``,
``leaf{group}.{rail}``, ``spine``, ``host{node}``; one edge per link and direction with ``bandwidth`` in bytes/s
and a ``tier``), the links as an indexed list, and the questions the network models ask: which tier a group of
ranks crosses (``tier``), and the links a transfer between two GPUs loads (``route``, cached).

Routes. Inside an NVSwitch domain: GPU -> NVSwitch -> GPU. Across domains, NCCL's PXN path (NCCL >= 2.12):
the data first moves over NVLink to the local GPU whose NIC sits on the destination's rail, then NIC -> leaf
[-> spine -> leaf] -> NIC -> destination GPU, so a rail-optimized fabric carries rail-aligned traffic only.
Leaf uplinks carry (downlink bandwidth) / oversubscription.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import pairwise
from typing import TYPE_CHECKING

from sim.hardware.links import LinkSpec
from sim.hardware.nodes import FabricSpec

if TYPE_CHECKING:  # imported where the graph is wired (0.1 CPU s): the closed-form models never read it
    import networkx as nx


@dataclass(frozen=True)
class Link:
    src: str
    dst: str
    tier: str  # nvlink | pcie | nic | uplink | host
    capacity: float  # bytes/s per direction: line rate x the tier's plateau efficiency


@dataclass(frozen=True, eq=False)
class Topology:
    nodes: int
    gpus_per_node: int
    intra_node: LinkSpec
    inter_node: LinkSpec
    nics_per_node: int
    nvlink_domain: int
    fabric: FabricSpec
    nvls: LinkSpec | None
    pcie: LinkSpec | None = None
    link_factors: tuple[tuple[str, float], ...] = ()  # degraded / failed links (sim.spec.variation)
    all_to_all: LinkSpec | None = None  # NVLink as NCCL's all-to-all drives it (None: the ring's intra_node)

    @property
    def all_to_all_link(self) -> LinkSpec:
        """The NVLink tier an all-to-all's intra-domain peers move over: its own fit, else the ring's."""
        return self.all_to_all or self.intra_node

    # The graph and its links are wired on first use (issue 25): the closed-form network models ask only the
    # questions below, and wiring 16,384 GPUs' 132,096 links took longer than simulating their step.
    @cached_property
    def _wiring(self) -> _Wiring:
        return _wire(self)

    @property
    def graph(self) -> nx.DiGraph:
        return self._wiring.graph

    @property
    def links(self) -> tuple[Link, ...]:
        return self._wiring.links

    @property
    def link_index(self) -> dict[tuple[str, str], int]:
        return self._wiring.link_index

    @property
    def failed_nics(self) -> frozenset[str]:
        """NICs with capacity factor 0: routes go around them."""
        return self._wiring.failed

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def domain_of(self, rank: int) -> int:
        return rank // self.nvlink_domain

    def rail_of(self, rank: int) -> int:
        return (rank % self.gpus_per_node) * self.nics_per_node // self.gpus_per_node

    def per_node(self, ranks: Iterable[int]) -> dict[int, int]:
        """Members of ``ranks`` per node, nodes in first-seen order. (Counted in C: a 98,304-GPU step's
        gradient-statistics group spans every rank.)"""
        return dict(Counter(map(self.gpus_per_node.__rfloordiv__, ranks)))

    def in_one_domain(self, ranks: Iterable[int]) -> bool:
        """Whether every rank (at least one) is in one NVLink domain: domains are contiguous rank ranges, so
        the lowest and the highest rank decide."""
        ranks = ranks if isinstance(ranks, tuple | list) else tuple(ranks)
        return bool(ranks) and self.domain_of(min(ranks)) == self.domain_of(max(ranks))

    def rail_bandwidth(self, members_per_node: int, shared: bool = True) -> float:
        """Line rate into the fabric for ``members_per_node`` GPUs of a node. ``shared``: every GPU of the node
        moves alike (symmetric groups, the analytic model's assumption), so they get their share of its NICs;
        otherwise up to one NIC each (the flow-level model, which shares NICs itself)."""
        if shared:
            return self.inter_node.bandwidth * self.nics_per_node * members_per_node / self.gpus_per_node
        return self.inter_node.bandwidth * min(members_per_node, self.nics_per_node)

    def tier(self, ranks: Iterable[int], shared: bool = True) -> LinkSpec:
        """The link a ring over ``ranks`` is limited by. Inside an NVLink domain: NVLink. Across domains, a
        group with k members per node runs k rings side by side on k rails (NCCL's channels), so the node
        offers k NIC shares, up to its NVLink bandwidth (nccl-tests: 2 A100 nodes with 4x200 Gb/s reach 86 of
        the ~100 GB/s of their NICs)."""
        ranks = tuple(ranks)
        if self.in_one_domain(ranks):
            return self.intra_node
        k = min(self.per_node(ranks).values())
        bandwidth = min(self.rail_bandwidth(k, shared),
                        self.intra_node.effective_bandwidth / self.inter_node.efficiency)
        return self.inter_node.model_copy(update={"bandwidth": bandwidth})

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """Indices (into ``links``) of the links a transfer from GPU ``src`` to GPU ``dst`` loads."""
        return _route(self, src, dst)

    def route_names(self, src: int, dst: int) -> list[str]:
        """The route as graph node names, e.g. ['gpu0', 'nvswitch0', 'gpu3']."""
        hops = [self.links[i] for i in self.route(src, dst)]
        return [hops[0].src] + [link.dst for link in hops] if hops else []


@lru_cache(maxsize=1 << 16)
def _route(topology: Topology, src: int, dst: int) -> tuple[int, ...]:
    if src == dst:
        return ()
    index = topology.link_index
    if topology.domain_of(src) == topology.domain_of(dst):
        switch = f"nvswitch{topology.domain_of(src)}"
        return index[(f"gpu{src}", switch)], index[(switch, f"gpu{dst}")]
    hops: list[str] = [f"gpu{src}"]
    rail = topology.rail_of(dst)
    out_rail = _healthy_rail(topology, topology.node_of(src), rail)
    if topology.rail_of(src) != out_rail:  # PXN: hop over NVLink to the local GPU on the rail it sends on
        hops += [f"nvswitch{topology.domain_of(src)}", f"gpu{_rail_gpu(topology, topology.node_of(src), out_rail)}"]
    in_rail = _healthy_rail(topology, topology.node_of(dst), rail)
    src_nic, dst_nic = f"nic{topology.node_of(src)}.{out_rail}", f"nic{topology.node_of(dst)}.{in_rail}"
    import networkx as nx

    hops += nx.shortest_path(topology.graph, src_nic, dst_nic)
    if topology.rail_of(dst) != in_rail:  # the destination's own NIC failed: in by another, then NVLink
        hops += [f"gpu{_rail_gpu(topology, topology.node_of(dst), in_rail)}", f"nvswitch{topology.domain_of(dst)}"]
    hops.append(f"gpu{dst}")
    return tuple(index[(a, b)] for a, b in pairwise(hops))


def _rail_gpu(topology: Topology, node: int, rail: int) -> int:
    """The GPU of ``node`` attached to NIC ``rail`` (PCIe switch)."""
    return node * topology.gpus_per_node + rail * topology.gpus_per_node // topology.nics_per_node


def _healthy_rail(topology: Topology, node: int, rail: int) -> int:
    """``rail``, or when that NIC failed the next working one of the node (NCCL uses the remaining rails)."""
    for step in range(topology.nics_per_node):
        candidate = (rail + step) % topology.nics_per_node
        if f"nic{node}.{candidate}" not in topology.failed_nics:
            return candidate
    raise ValueError(f"variation.links: every NIC of node {node} has failed")


@dataclass(frozen=True)
class _Wiring:
    graph: nx.DiGraph
    links: tuple[Link, ...]
    link_index: dict[tuple[str, str], int]
    failed: frozenset[str]


def build(nodes: int, gpus_per_node: int, intra_node: LinkSpec, inter_node: LinkSpec, *,
          nics_per_node: int | None = None, nvlink_domain: int | None = None, fabric: FabricSpec | None = None,
          pcie: LinkSpec | None = None, nvls: LinkSpec | None = None,
          link_factors: dict[str, float] | None = None, all_to_all: LinkSpec | None = None) -> Topology:
    """The cluster; its graph and links are wired when first asked for, except with ``link_factors``, whose
    names are checked now (a ``ValueError`` naming the link)."""
    nics = nics_per_node or gpus_per_node
    domain = nvlink_domain or gpus_per_node
    if domain % gpus_per_node:  # a partial last domain is allowed (sim.spec.cluster: whole nodes of it)
        raise ValueError(f"nvlink_domain: {domain} GPUs must be whole nodes of {gpus_per_node} GPUs")
    topology = Topology(nodes, gpus_per_node, intra_node, inter_node, nics, domain, fabric or FabricSpec(), nvls,
                        pcie, tuple((link_factors or {}).items()), all_to_all)
    if topology.link_factors:
        topology.failed_nics  # noqa: B018 - wire now: a bad link name is the scenario's error, not a later one
    return topology


def _wire(topology: Topology) -> _Wiring:
    import networkx as nx

    nodes, gpus_per_node = topology.nodes, topology.gpus_per_node
    intra_node, inter_node, pcie = topology.intra_node, topology.inter_node, topology.pcie
    nics, domain, fabric = topology.nics_per_node, topology.nvlink_domain, topology.fabric
    graph: nx.DiGraph[str] = nx.DiGraph()
    links: list[Link] = []
    all_to_all = topology.all_to_all
    # A link carries at most what its best-measured group moves over it (factors above 1 included); once per
    # tier, not per link.
    best = {id(spec): max([1.0] + [factor for _, factor in spec.group_efficiency])
            for spec in (intra_node, inter_node, pcie, all_to_all) if spec is not None}

    def connect(a: str, b: str, tier: str, spec: LinkSpec, line_rate: float | None = None,
                capacity: float | None = None) -> None:
        rate = line_rate if line_rate is not None else spec.bandwidth
        capacity = capacity if capacity is not None else rate * spec.efficiency * best[id(spec)]
        for u, v in ((a, b), (b, a)):
            graph.add_edge(u, v, bandwidth=rate, tier=tier, index=len(links))
            links.append(Link(u, v, tier, capacity))

    # NVLink carries the best of what its ring and its all-to-all reach: the all-to-all's capacity replaces the
    # ring's only where it is higher (no shipped preset's is; a profile or an override may be).
    nvlink_capacity = None
    if all_to_all is not None:
        a2a_capacity = all_to_all.bandwidth * all_to_all.efficiency * best[id(all_to_all)]
        if a2a_capacity > intra_node.bandwidth * intra_node.efficiency * best[id(intra_node)]:
            nvlink_capacity = a2a_capacity

    graph.add_node("spine", kind="spine")
    groups = -(-nodes // fabric.nodes_per_leaf)
    leaves_per_group = nics if fabric.rail_optimized else 1
    for group in range(groups):
        members = min(fabric.nodes_per_leaf, nodes - group * fabric.nodes_per_leaf)
        nics_per_leaf = members * (1 if fabric.rail_optimized else nics)
        uplink = nics_per_leaf * inter_node.bandwidth / fabric.oversubscription
        for leaf in range(leaves_per_group):
            graph.add_node(f"leaf{group}.{leaf}", kind="leaf")
            if groups > 1:
                connect(f"leaf{group}.{leaf}", "spine", "uplink", inter_node, uplink)
    for node in range(nodes):
        group = node // fabric.nodes_per_leaf
        graph.add_node(f"host{node}", kind="host", node=node)
        for nic in range(nics):
            leaf_name = f"leaf{group}.{nic if fabric.rail_optimized else 0}"
            connect(f"nic{node}.{nic}", leaf_name, "nic", inter_node)
        for local in range(gpus_per_node):
            rank = node * gpus_per_node + local
            gpu = f"gpu{rank}"
            graph.add_node(gpu, kind="gpu", node=node, rank=rank)
            connect(gpu, f"nvswitch{rank // domain}", "nvlink", intra_node, capacity=nvlink_capacity)
            connect(gpu, f"nic{node}.{local * nics // gpus_per_node}", "pcie", pcie or inter_node,
                    None if pcie else 4 * inter_node.bandwidth)
            if pcie is not None:
                connect(gpu, f"host{node}", "host", pcie)
    failed: set[str] = set()
    for name, factor in topology.link_factors:  # degraded / failed links (sim.spec.variation)
        if name in graph and name.startswith("nic"):
            touched = [i for i, link in enumerate(links) if name in (link.src, link.dst)]
            if factor == 0:
                failed.add(name)
        elif "->" in name and graph.has_edge(*name.split("->", 1)):
            a, b = name.split("->", 1)
            touched = [i for i, link in enumerate(links) if (link.src, link.dst) in ((a, b), (b, a))]
        else:
            raise ValueError(f"variation.links: no NIC or link named {name!r} (e.g. nic0.3 or leaf0.3->spine)")
        for i in touched:  # a failed NIC keeps a tiny capacity so rates stay finite; no route uses it
            links[i] = Link(links[i].src, links[i].dst, links[i].tier, links[i].capacity * max(factor, 1e-9))
    return _Wiring(graph, tuple(links), {(link.src, link.dst): i for i, link in enumerate(links)}, frozenset(failed))
