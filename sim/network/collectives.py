"""Collective algorithms: closed-form times, bytes per rank, and the point-to-point hops they run over.

In: a collective (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``, ``all_to_all``, ``send``),
the buffer size S in bytes (nccl-tests convention: for all-gather / reduce-scatter the gathered size, for
all-to-all the per-rank send buffer), the group size n, a per-step latency alpha and a bandwidth B per GPU and
direction. Out: seconds; the nccl-tests algbw / busbw of a time; and, for the flow-level network, the hops
(src, dst) every channel of an algorithm loads with equal bytes.

Algorithms (as NCCL runs them):
  ring (Patarasuk & Yuan 2009; Thakur et al. 2005)
    all-reduce                  2(n-1) alpha + 2(n-1)/n * S/B
    all-gather, reduce-scatter   (n-1) alpha +  (n-1)/n * S/B
    all-to-all (pairwise)        (n-1) alpha +  (n-1)/n * S/B
    broadcast (pipelined)        (n-1) alpha +          S/B
    send/recv                          alpha +          S/B
  tree: double binary tree all-reduce (Sanders, Speck & Traeff 2009), NCCL's model of it (src/graph/tuning.cc:
    tree algbw = busbw / 2): 2 * depth latency + 2 * S/B. Wins on latency at scale, never on bandwidth.
  nvls: NVLink SHARP all-reduce in the NVSwitch (H100 and later): each GPU pushes S in and pulls S out,
    2 alpha + S/B, with B the NVLS effective bandwidth.
  hierarchical (NCCL's CollNet-free 2D scheme; Jia et al. 2018): reduce-scatter inside each node over k GPUs,
    all-reduce of S/k across the N nodes (one rail per local rank), all-gather inside the node.
  all-to-all on a topology (``all_to_all_time``): NCCL has no all-to-all algorithm of its own; ncclAlltoAll
    (src/enqueue.cc) and nccl-tests' alltoall.cu before it post one ncclSend and one ncclRecv of S/n per peer
    in a group, run over its p2p schedule (src/init.cc: one round per peer). A rank with ``local`` members in
    its NVLink domain (itself included) sends (local-1)/n S over NVLink and (n-local)/n S over its NIC, both
    at once, and pays one latency per peer: per rank
        (local-1) alpha_nvl + (n-local) alpha_net + skew * max((local-1)/n S / B_nvl, (n-local)/n S / B_net),
    the slowest rank setting the pace; inside one domain it is the pairwise form above. ``skew`` = max/mean
    bytes a rank receives (MoE routing imbalance): the hottest receiver takes skew x the mean in each tier.
A group of one costs nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send")
ALGORITHMS = ("auto", "ring", "tree", "nvls", "hierarchical")

# nccl-tests doc/PERFORMANCE.md: busbw = algbw * factor(n).
_BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send": lambda n: 1.0,
}


def _check(op: str) -> None:
    if op not in _BUS_FACTOR:
        raise ValueError(f"unknown collective {op!r} (known: {', '.join(OPS)})")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw, i.e. the bytes each rank moves per byte of the collective's size."""
    _check(op)
    return _BUS_FACTOR[op](n)


def ring_steps(op: str, n: int) -> int:
    _check(op)
    if op == "send":
        return 1
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def latency_steps(algorithm: str, op: str, n: int) -> int:
    """How many alphas an algorithm pays inside one tier."""
    if algorithm == "tree":
        return 2 * math.ceil(math.log2(n)) if n > 1 else 0
    if algorithm == "nvls":
        return 2
    return ring_steps(op, n)


def bytes_moved(algorithm: str, op: str, n: int, nbytes: float) -> float:
    """Bytes each rank sends over its busiest link (what the bandwidth term divides)."""
    if algorithm == "tree":
        return 2 * nbytes
    if algorithm == "nvls":
        return nbytes
    if op == "broadcast" or op == "send":
        return nbytes
    return bus_factor(op, n) * nbytes


def ring_latency(op: str, n: int, nodes: int, alpha_intra: float, alpha_inter: float) -> float:
    """Latency of a ring over n ranks on ``nodes`` nodes: its inter-node steps pay the network's alpha, the rest
    NVLink's (NCCL src/graph/tuning.cc: nInterSteps = 2(nNodes-1) for all-reduce, nNodes-1 otherwise)."""
    steps = ring_steps(op, n)
    inter = 0 if nodes <= 1 else (2 * (nodes - 1) if op == "all_reduce" else nodes - 1)
    return (steps - inter) * alpha_intra + inter * alpha_inter


@dataclass(frozen=True)
class RingProtocol:
    """One of NCCL's ring protocols across nodes: seconds per ring step over NVLink and over the network, and the
    fraction of the Simple protocol's bus bandwidth it reaches."""

    nvlink: float
    net: float
    bandwidth: float


# NCCL src/graph/tuning.cc (2.19 and later), Ring, multi-node: hwLat NVLink {LL .6, LL128 1.9, Simple 3.4} us, NET
# {2.7, 4.0, 14.0} us; LL's NVLink latency x1.8 when the communicator spans nodes; LL moves 8 bytes of flag with
# every 8 of data and the model gives it 1/4 of the bus bandwidth across nodes, LL128 120 of 128 bytes (x0.92).
# The tuner takes the protocol with the least latency + bytes / bandwidth (ncclTopoGetAlgoTime).
RING_PROTOCOLS = {
    "LL": RingProtocol(nvlink=0.6e-6 * 1.8, net=2.7e-6, bandwidth=0.25),
    "LL128": RingProtocol(nvlink=1.9e-6, net=4.0e-6, bandwidth=0.92),
    "Simple": RingProtocol(nvlink=3.4e-6, net=14.0e-6, bandwidth=1.0),
}
PROTOCOLS = ("auto", *RING_PROTOCOLS)


def multinode_ring_time(op: str, nbytes: float, n: int, nodes: int, bandwidth: float,
                        protocol: str = "auto") -> tuple[float, str]:
    """(seconds, protocol) of a ring over n ranks on ``nodes`` > 1 nodes, without the per-collective base
    latency: (steps - inter-node steps) NVLink hops and the inter-node steps network hops at the protocol's
    latencies (``ring_latency``), plus the bytes each rank moves at ``bandwidth`` x the protocol's fraction;
    ``auto`` takes the fastest, as NCCL's tuner does. The ring's latency grows with the ring: about
    n x 1.9 us + nodes x 4 us with LL128, which at 1,536 ranks is 3.3 ms per all-gather."""
    moved = bytes_moved("ring", op, n, nbytes)
    names = tuple(RING_PROTOCOLS) if protocol == "auto" else (protocol,)
    times = {name: ring_latency(op, n, nodes, RING_PROTOCOLS[name].nvlink, RING_PROTOCOLS[name].net)
             + moved / (bandwidth * RING_PROTOCOLS[name].bandwidth) for name in names}
    best = min(times, key=times.__getitem__)
    return times[best], best


def ring_time(op: str, nbytes: float, n: int, latency: float, bandwidth: float) -> float:
    _check(op)
    if n <= 1:
        return 0.0
    return ring_steps(op, n) * latency + bytes_moved("ring", op, n, nbytes) / bandwidth


def check_skew(skew: float, n: int) -> None:
    """``skew`` (max/mean bytes per receiving rank) is at least 1 and at most n (one rank receiving everything)."""
    if not 1.0 <= skew <= max(n, 1):
        raise ValueError(f"skew: max/mean bytes per rank must be in [1, {max(n, 1)}] for a group of {n}, got {skew}")


def all_to_all_terms(nbytes: float, n: int, local: int, nvlink_latency: float, nvlink_bandwidth: float,
                     net_latency: float = 0.0, net_bandwidth: float = math.inf,
                     skew: float = 1.0) -> tuple[float, float]:
    """(latency, bandwidth seconds) of NCCL's all-to-all of S = ``nbytes`` per rank (S/n to each peer) over n
    ranks, for a rank with ``local`` members in its NVLink domain (itself included), without the per-collective
    base latency: one latency per peer, (local-1) alpha_nvl + (n-local) alpha_net, and the slower of its NVLink
    share (local-1)/n S and its network share (n-local)/n S (the two move at once, on other links), each ``skew``
    x the uniform bytes, as the hottest receiver gets them (see the module docstring)."""
    check_skew(skew, n)
    if n <= 1:
        return 0.0, 0.0
    nvlink = (local - 1) / n * nbytes / nvlink_bandwidth if local > 1 else 0.0
    net = (n - local) / n * nbytes / net_bandwidth if n > local else 0.0
    return (local - 1) * nvlink_latency + (n - local) * net_latency, skew * max(nvlink, net)


def all_to_all_time(nbytes: float, n: int, local: int, nvlink_latency: float, nvlink_bandwidth: float,
                    net_latency: float = 0.0, net_bandwidth: float = math.inf, skew: float = 1.0) -> float:
    """``all_to_all_terms`` summed: inside one domain (local = n), (n-1) alpha + skew (n-1)/n S / B."""
    latency, seconds = all_to_all_terms(nbytes, n, local, nvlink_latency, nvlink_bandwidth, net_latency,
                                        net_bandwidth, skew)
    return latency + seconds


def tree_time(nbytes: float, depth_latency: float, bandwidth: float) -> float:
    """Double-binary-tree all-reduce: reduce up and broadcast down a tree of the given one-way latency."""
    return 2 * depth_latency + 2 * nbytes / bandwidth


def nvls_time(nbytes: float, latency: float, bandwidth: float) -> float:
    return 2 * latency + nbytes / bandwidth


def p2p_time(nbytes: float, latency: float, bandwidth: float) -> float:
    return latency + nbytes / bandwidth


def algbw(nbytes: float, seconds: float) -> float:
    return nbytes / seconds


def busbw(op: str, nbytes: float, seconds: float, n: int) -> float:
    return algbw(nbytes, seconds) * bus_factor(op, n)


# ------------------------------------------------------------------------------------- flow-level shapes


@dataclass(frozen=True)
class Channel:
    """One channel of an algorithm: ``hops`` (src, dst rank pairs) all progress at one rate, each carrying
    ``nbytes`` (a ring advances in lock-step, so its slowest hop sets the pace of all of them)."""

    hops: tuple[tuple[int, int], ...]
    nbytes: float


def ring_orders(group: tuple[int, ...], node_of: dict[int, int]) -> list[tuple[int, ...]]:
    """NCCL-style rings over ``group``: one per GPU a node contributes when the group spans nodes (each ring
    leaves every node from a different GPU, so k rings use k rails), else one ring in rank order."""
    by_node: dict[int, list[int]] = {}
    for rank in group:
        by_node.setdefault(node_of[rank], []).append(rank)
    if len(by_node) == 1:
        return [tuple(group)]
    k = min(len(members) for members in by_node.values())
    orders = []
    for channel in range(k):
        order: list[int] = []
        for members in by_node.values():
            shift = (channel + 1) % len(members)
            order.extend(members[shift:] + members[:shift])  # leaves this node from members[channel]
        orders.append(tuple(order))
    return orders


def ring_channels(op: str, nbytes: float, orders: list[tuple[int, ...]]) -> list[Channel]:
    n = len(orders[0])
    share = bytes_moved("ring", op, n, nbytes) / len(orders)
    if op == "broadcast":  # a pipelined chain: the last rank does not send back to the root
        return [Channel(tuple(zip(order[:-1], order[1:], strict=True)), share) for order in orders]
    return [Channel(tuple(zip(order, order[1:] + order[:1], strict=True)), share) for order in orders]


def _binary_tree_hops(order: tuple[int, ...] | list[int]) -> list[tuple[int, int]]:
    hops = []
    for index in range(1, len(order)):
        parent, child = order[(index - 1) // 2], order[index]
        hops += [(child, parent), (parent, child)]
    return hops


def tree_channels(nbytes: float, group: tuple[int, ...], node_of: dict[int, int]) -> list[Channel]:
    """Double binary tree (NCCL): two trees, the second over the order reversed so one tree's inner ranks are
    the other's leaves; each carries half the data up (reduce) and down (broadcast), so a rank's busiest link
    carries 4 hops of S/2 = 2S, the closed form's bandwidth term. Across nodes, as NCCL does: k channels (k
    members per node), channel j chains each node's members from member j, whose rail links the nodes' trees;
    each channel carries S/k."""
    by_node: dict[int, list[int]] = {}
    for rank in group:
        by_node.setdefault(node_of[rank], []).append(rank)
    if len(by_node) == 1:
        return [Channel(tuple(_binary_tree_hops(order)), nbytes / 2) for order in (group, group[::-1])]
    k = min(len(members) for members in by_node.values())
    channels = []
    for j in range(k):
        heads, chains = [], []
        for members in by_node.values():
            chain = members[j:] + members[:j]
            heads.append(chain[0])
            chains += [hop for a, b in pairwise(chain) for hop in ((b, a), (a, b))]
        for order in (heads, heads[::-1]):
            channels.append(Channel(tuple(chains + _binary_tree_hops(order)), nbytes / (2 * k)))
    return channels


def all_to_all_channels(nbytes: float, group: tuple[int, ...], skew: float = 1.0,
                        domain_of: dict[int, int] | None = None) -> list[Channel]:
    """The (sender, receiver) hops of an all-to-all, one per pair as NCCL posts one send per peer, each carrying
    S/n when uniform. With ``skew`` the group's first rank is the hottest receiver: every sender gives it skew x
    S/n and spreads the rest of its S evenly, (n - skew)/(n - 1) x S/n to each other peer. A sender's hops move
    in one channel per kind of peer (``domain_of``: its NVLink-domain peers, the others; the hot receiver apart),
    so an all-to-all is about 2n flows rather than n^2: every pair still loads its own route, and a sender's
    peers of one tier progress together, as its tier's share of the sender's bandwidth is split among them."""
    n = len(group)
    check_skew(skew, n)
    hot, rest = skew * nbytes / n, (n - skew) / (n - 1) * nbytes / n
    domain = domain_of or {}
    channels = []
    for a in group:
        kinds: dict[tuple[bool, bool], list[tuple[int, int]]] = {}
        for b in group:
            if a != b:
                kinds.setdefault((domain.get(a) == domain.get(b), b == group[0] and skew != 1.0), []).append((a, b))
        channels += [Channel(tuple(hops), hot if to_hot else rest) for (_, to_hot), hops in kinds.items()]
    return channels
