"""The cluster as a graph of links.

In: number of nodes, GPUs per node, and the two link tiers (``LinkSpec`` per GPU and direction). Out: a
``Topology`` holding a networkx graph (GPUs, one NVSwitch per node, one NIC per GPU, an InfiniBand fabric
switch) and the questions the network models ask of it: which node holds a rank, which tier a group of ranks
must cross, and the route between two GPUs.

This is the two-tier picture of a DGX-style cluster (NVLink/NVSwitch inside a node, rail NICs into a
non-blocking fabric across nodes). Leaf/spine fat trees with oversubscription belong to the network issue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable

import networkx as nx

from sim.hardware import LinkSpec


@dataclass(frozen=True)
class Topology:
    nodes: int
    gpus_per_node: int
    intra_node: LinkSpec
    inter_node: LinkSpec
    graph: nx.Graph = field(compare=False, repr=False)

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def tier(self, ranks: Iterable[int]) -> LinkSpec:
        """The link a ring over ``ranks`` is limited by. Inside a node: NVLink. Across nodes: the NICs, and a
        group with k members in every node runs k rings side by side over k rails (NCCL's channels, ordered
        so each ring crosses each node boundary once), so the node offers k NIC shares, up to its NVLink
        bandwidth (nccl-tests: 2 A100 nodes with 4x200 Gb/s reach 86 of the ~100 GB/s of their NICs)."""
        ranks = tuple(ranks)
        per_node: dict[int, int] = {}
        for rank in ranks:
            per_node[self.node_of(rank)] = per_node.get(self.node_of(rank), 0) + 1
        if len(per_node) == 1:
            return self.intra_node
        rails = min(per_node.values())
        bandwidth = min(self.inter_node.bandwidth * rails,
                        self.intra_node.effective_bandwidth / self.inter_node.efficiency)
        return self.inter_node.model_copy(update={"bandwidth": bandwidth})

    def route(self, src: int, dst: int) -> tuple[str, ...]:
        return _route(self, src, dst)


@lru_cache(maxsize=4096)
def _route(topology: Topology, src: int, dst: int) -> tuple[str, ...]:
    return tuple(nx.shortest_path(topology.graph, f"gpu{src}", f"gpu{dst}"))


def build(nodes: int, gpus_per_node: int, intra_node: LinkSpec, inter_node: LinkSpec) -> Topology:
    graph = nx.Graph()
    graph.add_node("fabric", kind="switch")
    for node in range(nodes):
        switch = f"nvswitch{node}"
        graph.add_node(switch, kind="nvswitch", node=node)
        for local in range(gpus_per_node):
            rank = node * gpus_per_node + local
            gpu, nic = f"gpu{rank}", f"nic{rank}"
            graph.add_node(gpu, kind="gpu", node=node, rank=rank)
            graph.add_node(nic, kind="nic", node=node)
            graph.add_edge(gpu, switch, bandwidth=intra_node.bandwidth, latency=intra_node.latency, tier="intra")
            graph.add_edge(gpu, nic, bandwidth=inter_node.bandwidth, latency=0.0, tier="pcie")
            graph.add_edge(nic, "fabric", bandwidth=inter_node.bandwidth, latency=inter_node.latency, tier="inter")
    return Topology(nodes, gpus_per_node, intra_node, inter_node, graph)
