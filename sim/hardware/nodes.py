"""Node presets and the scale-out fabric: the links inside a node and between nodes.

In: a node preset name (``"dgx-h100"``, ``"gb200-nvl72"``, ...), a GPU preset name (its default node) or explicit
fields. Out: frozen ``NodeSpec`` / ``FabricSpec`` objects in SI units; each tier's latencies, plateau and curve are
fitted to published measurements (``sim/data/network_fit.json``), its line rate is the datasheet's.
"""

from __future__ import annotations

import json
from importlib import resources

from pydantic import Field

from sim.hardware.frozen import FrozenSpec
from sim.hardware.links import LinkSpec
from sim.units import GB


class FabricSpec(FrozenSpec):
    """The scale-out network: NICs into leaf switches, leaves into a spine (a two-level fat tree).

    ``rail_optimized``: NIC i of every node under a leaf group plugs into that group's leaf i (DGX SuperPOD),
    so same-rail traffic between those nodes crosses one switch; otherwise a group's NICs share one leaf.
    ``oversubscription``: a leaf's downlink bandwidth over its uplink bandwidth to the spine (1 = full
    bisection). The spine is one aggregate switch: flow-level models assume ECMP spreads flows evenly.
    """

    nodes_per_leaf: int = Field(default=32, ge=1, description="nodes under one leaf group (a scalable unit)")
    oversubscription: float = Field(default=1.0, ge=1.0)
    rail_optimized: bool = True


class NodeSpec(FrozenSpec):
    name: str
    intra_node: LinkSpec
    inter_node: LinkSpec
    gpus_per_node: int = Field(default=8, ge=1)
    nics_per_node: int = Field(default=8, ge=1)
    nvlink_domain: int = Field(default=8, ge=1, description="GPUs that share one NVSwitch domain")
    nvls: LinkSpec | None = Field(default=None, description="NVSwitch in-network reduction (NVLink SHARP)")
    all_to_all: LinkSpec | None = Field(
        default=None, description="NVLink as NCCL's all-to-all (grouped send/recv to every peer) drives it: its own "
        "latency, plateau and curve; None: the intra_node ring's")
    pcie: LinkSpec = Field(description="GPU <-> host (CPU offload)")
    source: str = ""


# Link latencies, plateau efficiencies and efficiency curves are fitted to published measurements by
# scripts/fit_network_defaults.py (OpenXLA's collective tables, nccl-tests results): see that script for which
# rows feed which tier. Line rates are datasheet figures per GPU (per NIC for InfiniBand) and direction.
_FIT: dict[str, dict[str, dict[str, object]]] = json.loads(
    resources.files("sim").joinpath("data/network_fit.json").read_text())


def _fitted(node: str, tier: str, bandwidth: float) -> LinkSpec:
    return LinkSpec(bandwidth=bandwidth, **_FIT[node][tier])  # type: ignore[arg-type]


# Host links: PCIe Gen4 x16 = 32 GB/s and Gen5 x16 = 64 GB/s per direction; pinned-memory copies reach ~80% of
# it (ml-engineering, "PCIe"); GB200's Grace link is NVLink-C2C, 450 GB/s per direction.
_PCIE4 = LinkSpec(bandwidth=32 * GB, latency=1e-6, efficiency=0.8)
_PCIE5 = LinkSpec(bandwidth=64 * GB, latency=1e-6, efficiency=0.8)

_DGX_H100 = NodeSpec(
    name="dgx-h100",
    # NVLink4 450 GB/s per direction, NVSwitch3 with NVLink SHARP; 8x 400 Gb/s NDR = 50 GB/s per NIC.
    intra_node=_fitted("dgx-h100", "intra_node", 450 * GB),
    inter_node=_fitted("dgx-h100", "inter_node", 50 * GB),
    nvls=_fitted("dgx-h100", "nvls", 450 * GB),
    all_to_all=_fitted("dgx-h100", "all_to_all", 450 * GB),
    pcie=_PCIE5,
    source="MLPerf v4.0 DGX H100 system description; OpenXLA sm_90 tables; nccl-tests issues #212, #290",
)

_GB200_NVL72 = NodeSpec(
    name="gb200-nvl72",
    # 18 trays of 4 GPUs in one 72-GPU NVLink5 domain; one 400 Gb/s ConnectX-7 per GPU; Grace over C2C.
    intra_node=_fitted("gb200-nvl72", "intra_node", 900 * GB),
    inter_node=_fitted("gb200-nvl72", "inter_node", 50 * GB),
    all_to_all=_fitted("gb200-nvl72", "all_to_all", 900 * GB),
    gpus_per_node=4,
    nics_per_node=4,
    nvlink_domain=72,
    pcie=LinkSpec(bandwidth=450 * GB, latency=1e-6, efficiency=0.8),
    source="NVIDIA GB200 NVL72 datasheet; OpenXLA sm_100 GB200 NVL72 tables",
)

NODE_PRESETS: dict[str, NodeSpec] = {
    spec.name: spec
    for spec in (
        NodeSpec(
            name="dgx-a100",
            # NVLink3 300 GB/s per direction; 8x 200 Gb/s HDR = 25 GB/s per NIC.
            intra_node=_fitted("dgx-a100", "intra_node", 300 * GB),
            inter_node=_fitted("dgx-a100", "inter_node", 25 * GB),
            pcie=_PCIE4,
            source="Narayanan et al. SC21 Sec 5 (Selene); nccl-tests issues #175, #119",
        ),
        _DGX_H100,
        NodeSpec(
            name="hgx-h800",
            # H800 NVLink: 8 of H100's 18 NVLink4 links (25 GB/s per direction each) = 200 GB/s per direction,
            # 400 GB/s bidirectional; one 400 Gb/s ConnectX-7 InfiniBand NIC per GPU = 50 GB/s (DeepSeek-V3
            # report Secs 3.1, 3.2.2; DeepEP README: "H800 (~160 GB/s NVLink maximum bandwidth) ... CX7 InfiniBand
            # 400 Gb/s RDMA network card (~50 GB/s maximum bandwidth)"). The same NVLink4/NVSwitch generation as
            # DGX H100, so H100's fitted latencies and curves as fractions of the line rate (200 x 0.786 = 157
            # GB/s, DeepEP's ~160). NVLS left out: no public H800 measurement shows NCCL running it.
            intra_node=_fitted("dgx-h100", "intra_node", 200 * GB),
            inter_node=_fitted("dgx-h100", "inter_node", 50 * GB),
            all_to_all=_fitted("dgx-h100", "all_to_all", 200 * GB),
            pcie=_PCIE5,
            source="DeepSeek-V3 technical report Secs 3.1, 3.2.2 (8 H800 per node, NVLink + NVSwitch, 8 IB NICs); "
                   "DeepEP README (H800 NVLink, CX7 400 Gb/s per GPU); NVLink4 18 links x 25 GB/s per direction",
        ),
        NodeSpec(
            name="dgx-b200",
            # NVLink5 900 GB/s per direction; 8x ConnectX-7 400 Gb/s. No NVLS size sweep in the reference data.
            intra_node=_fitted("dgx-b200", "intra_node", 900 * GB),
            inter_node=_fitted("dgx-b200", "inter_node", 50 * GB),
            all_to_all=_fitted("dgx-b200", "all_to_all", 900 * GB),
            pcie=_PCIE5,
            source="ml-engineering network README (NVLink5); OpenXLA sm_100 tables; DGX B200 datasheet",
        ),
        _GB200_NVL72,
        # H20 keeps H100's NVLink4 (18 links, 900 GB/s bidirectional = 450 GB/s per direction), NVSwitch3 and
        # HGX H100's 8x 400 Gb/s NICs: DGX H100's fabric under its own name.
        _DGX_H100.model_copy(update={"name": "hgx-h20", "source": "NVIDIA HGX H20 specification (NVLink 900 GB/s, "
                                     "PCIe Gen5); DGX H100's NVLink4 fits"}),
        # GB200 NVL72's NVLink5 rack (72-GPU domain, trays of 4) with one 800 Gb/s ConnectX-8 SuperNIC per GPU
        # (100 GB/s) instead of ConnectX-7; GB200 NVL72's fitted latencies and curves stand in.
        _GB200_NVL72.model_copy(update={
            "name": "gb300-nvl72", "inter_node": _fitted("gb200-nvl72", "inter_node", 100 * GB),
            "source": "NVIDIA GB300 NVL72 datasheet (NVLink 130 TB/s over 72 GPUs = 1.8 TB/s each, ConnectX-8 800 "
                      "Gb/s per GPU); GB200 NVL72's fits"}),
        NodeSpec(
            name="amd-mi300x-platform",
            # 8 OAM GPUs fully connected by Infinity Fabric: 7 links of 64 GB/s per direction each (896 GB/s
            # bidirectional per GPU, AMD's "peak aggregate"), modelled as one switched tier of 7 x 64 = 448 GB/s
            # per direction; no switch, so no NVLS-like in-network reduction. RCCL's plateau and curve: DGX H100's
            # NVLink4 fractions stand in (no rccl-tests measurement in the reference data: calibrate to replace).
            # 8x 400 Gb/s NICs per node (AMD Instinct platform reference design).
            intra_node=_fitted("dgx-h100", "intra_node", 448 * GB),
            inter_node=_fitted("dgx-h100", "inter_node", 50 * GB),
            pcie=_PCIE5,
            source="AMD Instinct MI300X / MI325X platform data sheets (8 GPUs, Infinity Fabric 896 GB/s aggregate "
                   "per GPU over 7 links, PCIe Gen5 x16 host links); DGX H100's fits stand in for RCCL",
        ),
    )
}

DEFAULT_NODE_FOR_GPU = {
    "A100-40GB-SXM": "dgx-a100",
    "A100-80GB-SXM": "dgx-a100",
    "H100-SXM": "dgx-h100",
    "H800-SXM": "hgx-h800",
    "H200": "dgx-h100",
    "B200": "dgx-b200",
    "GB200": "gb200-nvl72",
    "H20": "hgx-h20",
    "GB300": "gb300-nvl72",
    "MI300X": "amd-mi300x-platform",
    "MI325X": "amd-mi300x-platform",
}
