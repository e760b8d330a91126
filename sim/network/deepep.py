"""DeepEP's normal (high-throughput) dispatch and combine kernels: what they send and how long they take.

In: a rank's tokens, hidden size and element bytes, the routing (experts, top-k, uniform), the EP group's shape
(ranks per NVLink domain, domains) and the two achieved bandwidths. Out: the bytes each rank moves over RDMA and
over NVLink, and the seconds of one dispatch (or combine), the slower of the two.

What DeepEP sends (DeepEP V1, ``csrc/kernels/internode.cu`` / ``intranode.cu``; docs/legacy.md; Megatron-Core's
``--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep``, ``fused_a2a.py``): a token goes once
to every *node* that holds one of its experts (RDMA, to the GPU of the same local index there), and that GPU
forwards it once to every local *rank* holding one of its experts (NVLink); combine is the mirror (reduced inside
the node over NVLink, then one RDMA message per node). NCCL's all-to-all of Megatron's ``alltoall`` dispatcher
sends a token once per (token, expert) pair instead: top-k copies. Inside one NVLink domain DeepEP's intranode
kernels send a token once per destination rank.

For uniform routing of top-k experts out of E, spread evenly over G groups (nodes or ranks), a token reaches
``distinct_groups(G, E, k) = G (1 - C(E - E/G, k) / C(E, k))`` of them (sampling without replacement).

Bandwidths. DeepEP's tests report a *logical* bandwidth: RDMA bytes = tokens x distinct nodes (its own node
included) x hidden x bytes over the kernel's time (``tests/test_internode.py``: ``num_rdma_token_sent``), NVLink
bytes = tokens received per rank (its own included) over the time (``test_intranode.py``: ``recv_x``). The
README's table (legacy V1, H800 with one 400 Gb/s CX7 per GPU, "~50 GB/s maximum", and NVLink "~160 GB/s",
i.e. 200 GB/s line rate) gives, dispatch / combine: intranode EP 8 153 / 158 GB/s (NVLink); internode EP 16
43 / 43, EP 32 58 / 57, EP 64 51 / 50 GB/s (RDMA). The same counting is used here, so those numbers apply as
they are: the RDMA figure scales with the GPU's NIC line rate / 50 GB/s, the NVLink one is taken as a fraction of
the NVLink line rate (153 / 200 = 0.765; cross-check: an H20, 450 GB/s NVLink, reached 337 GB/s = 0.75,
deepseek-ai/DeepEP issue #16).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

# DeepEP README (docs/legacy.md, 'Normal kernels with NVLink and RDMA forwarding'), H800 + CX7 400 Gb/s:
# nodes in the EP group -> (dispatch, combine) RDMA bottleneck bandwidth, bytes/s (logical, as counted above)
README_RDMA: dict[int, tuple[float, float]] = {2: (43e9, 43e9), 4: (58e9, 57e9), 8: (51e9, 50e9)}
README_NIC = 50e9  # the CX7's "~50 GB/s maximum bandwidth" those rows ran on (one NIC per GPU)
README_NVLINK: tuple[float, float] = (153e9, 158e9)  # intranode EP 8, dispatch / combine
README_NVLINK_LINE = 200e9  # H800 NVLink per direction (DeepSeek-V3 report Sec. 3.1: 400 GB/s bidirectional)
# DeepEP V1 (v1.2.1) csrc/kernels/configs.cuh: the NVLink ranks of one node and the RDMA ranks (nodes) the normal
# kernels address. csrc/deep_ep.cpp Buffer: rdma_rank = rank / NUM_MAX_NVL_PEERS, nvl_rank = rank %
# NUM_MAX_NVL_PEERS (each 8 consecutive EP ranks are one node, their buffers opened by CUDA IPC), num_ranks <
# NUM_MAX_NVL_PEERS or a multiple of it, num_ranks <= NUM_MAX_NVL_PEERS x NUM_MAX_RDMA_PEERS (low-latency mode apart).
NUM_MAX_NVL_PEERS = 8
NUM_MAX_RDMA_PEERS = 20


def ep_group_shape(group: tuple[int, ...], nvlink_domain: int) -> tuple[int, int]:
    """An EP group's (NVLink domains it spans, its ranks per domain), ``nvlink_domain`` GPUs to a domain."""
    domains = len({rank // nvlink_domain for rank in group})
    return domains, len(group) // domains


def beyond_peer_limits(domains: int, per_domain: int) -> str | None:
    """Why DeepEP V1's normal kernels cannot run an EP group of ``per_domain`` ranks in each of ``domains`` NVLink
    domains (``NUM_MAX_NVL_PEERS``, ``NUM_MAX_RDMA_PEERS``), or None where they can: at most 8 ranks in one domain
    (intranode), or 8 ranks in each of 2 to 20 domains (internode: DeepEP makes each 8 consecutive EP ranks a
    node, so a domain must hold exactly 8 of the group)."""
    if per_domain > NUM_MAX_NVL_PEERS:
        return (f"{per_domain} ranks of the EP group share an NVLink domain; DeepEP's normal kernels reach at most "
                f"{NUM_MAX_NVL_PEERS} NVLink peers (NUM_MAX_NVL_PEERS)")
    if domains > 1 and per_domain != NUM_MAX_NVL_PEERS:
        return (f"{per_domain} ranks of the EP group per NVLink domain over {domains} domains; DeepEP's internode "
                f"kernels take each {NUM_MAX_NVL_PEERS} consecutive EP ranks as one NVLink node (rank / "
                f"{NUM_MAX_NVL_PEERS}), so a domain must hold {NUM_MAX_NVL_PEERS} of them")
    if domains > NUM_MAX_RDMA_PEERS:
        return (f"the EP group spans {domains} NVLink domains; DeepEP's normal kernels reach at most "
                f"{NUM_MAX_RDMA_PEERS} RDMA peers (NUM_MAX_RDMA_PEERS)")
    return None


def distinct_groups(groups: int, experts: int, topk: int) -> float:
    """Expected number of the ``groups`` equal groups of experts one token's ``topk`` experts (uniform, without
    replacement, out of ``experts``) fall in: groups x (1 - C(E - E/G, k) / C(E, k))."""
    if groups <= 1:
        return float(groups)
    per_group = experts // groups
    return groups * (1.0 - comb(experts - per_group, topk) / comb(experts, topk))


def rdma_bandwidth(nodes: int, nic_bandwidth: float, combine: bool = False) -> float:
    """DeepEP's achieved (logical) RDMA bandwidth for an EP group over ``nodes`` nodes, from the README's table
    (the nearest row at or below ``nodes``; 2 nodes below that), scaled by the GPU's NIC line rate / 50 GB/s."""
    row = max((n for n in README_RDMA if n <= nodes), default=min(README_RDMA))
    return README_RDMA[row][1 if combine else 0] * nic_bandwidth / README_NIC


def nvlink_bandwidth(line_rate: float, combine: bool = False) -> float:
    """DeepEP's achieved (logical) NVLink bandwidth: the README's intranode row as a fraction of H800's 200 GB/s
    line rate, times this node's NVLink line rate (per direction)."""
    return README_NVLINK[1 if combine else 0] * line_rate / README_NVLINK_LINE


def deepep_bytes(tokens: float, hidden: int, elem_bytes: float, experts: int, topk: int, domains: int,
                 ranks_per_domain: int) -> tuple[float, float]:
    """(RDMA bytes, NVLink bytes) one rank's dispatch moves, as DeepEP counts them (see the module docstring):
    tokens x distinct destination domains x hidden x bytes over RDMA (0 inside one domain), and per rank received
    tokens x hidden x bytes over NVLink (= sent, routing being uniform)."""
    row = hidden * elem_bytes
    ranks = domains * ranks_per_domain
    rdma = tokens * distinct_groups(domains, experts, topk) * row if domains > 1 else 0.0
    nvlink = tokens * distinct_groups(ranks, experts, topk) * row
    return rdma, nvlink


def deepep_time(rdma_bytes: float, nvlink_bytes: float, rdma_bw: float, nvlink_bw: float,
                skew: float = 1.0) -> float:
    """Seconds of one DeepEP dispatch or combine: its RDMA and NVLink parts run at once (the forwarder relays as
    chunks arrive), so the slower sets the time; ``skew`` (the hottest receiver's bytes / the mean) scales both,
    as it scales an all-to-all's bandwidth term (sim.network.collectives.all_to_all_terms)."""
    rdma = rdma_bytes / rdma_bw if rdma_bytes > 0 else 0.0
    nvlink = nvlink_bytes / nvlink_bw if nvlink_bytes > 0 else 0.0
    return skew * max(rdma, nvlink)


# The ops of DeepEP's exchanges as the network models see them (sim.network.models): a MoE layer's dispatch and
# combine under ``moe.token_dispatcher: flex`` (the backward's combine-gradient is a dispatch, and so on).
DISPATCH, COMBINE = "deepep_dispatch", "deepep_combine"
OPS = (DISPATCH, COMBINE)


@dataclass(frozen=True)
class DeepepTraffic:
    """What one rank's DeepEP dispatch (and combine, its mirror) moves and how fast, for the network models:
    ``rdma_bytes`` / ``nvlink_bytes`` as DeepEP counts them (``deepep_bytes``: R and N), and the achieved
    bandwidths, (dispatch, combine) each (``rdma_bandwidth``, ``nvlink_bandwidth`` or the scenario's knobs)."""

    rdma_bytes: float
    nvlink_bytes: float
    rdma_bandwidth: tuple[float, float]
    nvlink_bandwidth: tuple[float, float]

    def seconds(self, op: str, skew: float = 1.0) -> float:
        """``op``'s (``DISPATCH`` or ``COMBINE``) closed-form seconds (``deepep_time``)."""
        combine = OPS.index(op)
        return deepep_time(self.rdma_bytes, self.nvlink_bytes, self.rdma_bandwidth[combine],
                           self.nvlink_bandwidth[combine], skew)


def deepep_flows(op: str, traffic: DeepepTraffic, group: tuple[int, ...], domain_of: dict[int, int],
                 skew: float = 1.0) -> list[tuple[int, int, float, float]]:
    """The point-to-point flows of one DeepEP exchange over ``group`` as (sender, receiver, bytes, rate cap): each
    sender sends its tokens once to every other NVLink domain of the group, to the member with its own local
    index there (RDMA; R / D bytes each, D domains, R counting its own domain as DeepEP does), and the tokens
    that every member of a domain received are forwarded once to each other member of that domain holding one of
    their experts (NVLink; N / P bytes from each of the P members to each, N the bytes a rank receives, its own
    share included). The forwarder relays chunks as they arrive, so both tiers' flows run at once; each is capped
    at its tier's achieved bandwidth over D (or P) destinations, so that alone they end together at R / B_rdma
    and N / B_nvl: the closed form's slower part (``deepep_time``). With ``skew`` the group's first rank is the
    hottest receiver: the flows into it carry skew x their bytes, so they end at skew x that time."""
    combine = OPS.index(op)
    members: dict[int, list[int]] = {}
    for rank in group:
        members.setdefault(domain_of[rank], []).append(rank)
    domains = len(members)
    rdma_bw, nvlink_bw = traffic.rdma_bandwidth[combine], traffic.nvlink_bandwidth[combine]
    flows = []
    for sender in group:
        own = members[domain_of[sender]]
        local = own.index(sender)
        if domains > 1 and traffic.rdma_bytes > 0:
            for domain, ranks in members.items():
                if domain != domain_of[sender]:
                    receiver = ranks[local % len(ranks)]
                    share = traffic.rdma_bytes / domains * (skew if receiver == group[0] else 1.0)
                    flows.append((sender, receiver, share, rdma_bw / domains))
        if len(own) > 1 and traffic.nvlink_bytes > 0:
            for receiver in own:
                if receiver != sender:
                    share = traffic.nvlink_bytes / len(own) * (skew if receiver == group[0] else 1.0)
                    flows.append((sender, receiver, share, nvlink_bw / len(own)))
    return flows
