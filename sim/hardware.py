"""GPU and node presets.

In: a preset name (``"A100-80GB-SXM"``, ``"H100-SXM"``, ``"dgx-h100"``, ...) or explicit fields.
Out: frozen ``GpuSpec`` / ``NodeSpec`` objects in SI units (FLOP/s, bytes, bytes/s, seconds).

Every number cites its source. Peaks are *dense* tensor-core peaks (the sparse figures on NVIDIA's pages are
2x these). ``matmul_efficiency`` is the fraction of dense peak a large GEMM reaches in practice (the
"maximum achievable matmul FLOPs" of ml-engineering, measured with PyTorch); ``memory_efficiency`` the
fraction of HBM bandwidth a large device copy reaches. Link ``efficiency`` is the fraction of the per-GPU line
rate that NCCL's ring achieves as nccl-tests busbw on large messages. These feed the roofline cost model and
the analytic network until a calibration profile replaces them.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from importlib import resources
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sim.units import GB, Bytes, BytesPerSecond, FlopsPerSecond, GiB, Seconds

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")


class FrozenSpec(BaseModel):
    """Base of every validated spec: immutable, unknown keys rejected (ARCHITECTURE.md rule 1), and every float
    finite: a NaN or infinite number is refused at the boundary, naming its field, instead of surfacing as a
    NaN step time or an MFU above 1 (NaN slips through checks such as ``factor <= 0``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class GpuSpec(FrozenSpec):
    name: str
    peak_flops: dict[str, Annotated[FlopsPerSecond, Field(gt=0)]] = Field(description="dense peak FLOP/s per dtype")
    hbm_capacity: Bytes
    hbm_bandwidth: BytesPerSecond
    matmul_efficiency: float = Field(gt=0, le=1)
    memory_efficiency: float = Field(gt=0, le=1)
    sms: int | None = Field(default=None, ge=1, description="streaming multiprocessors (for NCCL SM contention)")
    board_power: float | None = Field(default=None, gt=0, description=(
        "watts: the board's maximum power (NVIDIA TDP, AMD TBP), for the energy estimate (sim.output.planning)"))
    source: str = ""

    def peak(self, dtype: str) -> float:
        """Dense peak for ``dtype``; KeyError when the GPU has no such tensor-core path (fp8 on A100)."""
        return self.peak_flops[dtype]


class LinkSpec(FrozenSpec):
    """One tier of links, per GPU (per NIC for ``inter_node``) and per direction.

    ``efficiency`` is the fraction of the line rate NCCL reaches on large messages (protocol overhead);
    ``efficiency_curve`` scales it down for smaller messages: knots (message bytes, fraction of the plateau),
    interpolated linearly in log2(bytes) and clamped at both ends. An empty curve is flat.
    """

    bandwidth: BytesPerSecond = Field(gt=0)
    latency: Seconds = Field(description="per algorithm step (a ring hop, a tree level)")
    base_latency: Seconds = Field(default=0.0, description="per collective: launch and synchronization")
    efficiency: float = Field(default=1.0, gt=0, le=1)
    efficiency_curve: tuple[tuple[float, float], ...] = ()
    group_efficiency: tuple[tuple[int, float], ...] = Field(
        default=(), description="knots (group size, bandwidth factor): a group of n GPUs takes the factor of the "
        "largest knot <= n (the first knot's below it); 1 without knots. NCCL runs fewer channels for small groups")

    @field_validator("efficiency_curve")
    @classmethod
    def _sorted_fractions(cls, curve: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
        sizes = [size for size, _ in curve]
        if sizes != sorted(sizes) or any(size <= 0 for size in sizes):
            raise ValueError("efficiency_curve: knots must be [bytes, fraction] pairs with increasing bytes > 0")
        if any(not 0 < fraction <= 1 for _, fraction in curve):
            raise ValueError("efficiency_curve: each fraction of the plateau must be in (0, 1]")
        return curve

    @field_validator("group_efficiency")
    @classmethod
    def _group_knots(cls, knots: tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
        sizes = [n for n, _ in knots]
        if sizes != sorted(set(sizes)) or any(n < 2 for n in sizes) or any(not 0 < f <= 2 for _, f in knots):
            raise ValueError("group_efficiency: knots must be [group size >= 2, factor in (0, 2]] "
                             "with increasing sizes")
        return knots

    @property
    def effective_bandwidth(self) -> float:
        """Large-message bandwidth: the line rate times the plateau efficiency."""
        return self.bandwidth * self.efficiency

    def group_factor(self, group_size: int | None) -> float:
        if not self.group_efficiency or group_size is None:
            return 1.0
        below = [factor for n, factor in self.group_efficiency if n <= group_size]
        return below[-1] if below else self.group_efficiency[0][1]

    def bandwidth_at(self, nbytes: float, group_size: int | None = None) -> float:
        """Effective bandwidth for a message of ``nbytes`` in a group of ``group_size`` GPUs (line rate x
        plateau x curve(nbytes) x the group's factor)."""
        return (self.effective_bandwidth * interpolate_log2(self.efficiency_curve, nbytes)
                * self.group_factor(group_size))


def interpolate_log2(curve: Sequence[tuple[float, float]], x: float, log_y: bool = False) -> float:
    """Piecewise-linear interpolation of knots (x, y) in log2(x) (and in log2(y) with ``log_y``), clamped to the
    end knots; 1.0 for no knots."""
    if not curve:
        return 1.0
    if x <= curve[0][0]:
        return curve[0][1]
    if x >= curve[-1][0]:
        return curve[-1][1]
    index = bisect.bisect_right([size for size, _ in curve], x)
    (x0, y0), (x1, y1) = curve[index - 1], curve[index]
    share = (math.log2(x) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
    if log_y:
        return 2 ** (math.log2(y0) + share * (math.log2(y1) - math.log2(y0)))
    return y0 + share * (y1 - y0)


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


T = 1e12
# Copy efficiency measured on H100 (3.0 of 3.35 TB/s) and H200 (4.3 of 4.8 TB/s), measured_gpu_figures.csv;
# their mean stands in for A100 and B200, for which no device-copy measurement is in the reference data.
_COPY_EFFICIENCY_MEASURED_MEAN = (3.0 / 3.35 + 4.3 / 4.8) / 2
# SM counts: 108 on A100 (NVIDIA A100 Tensor Core GPU Architecture whitepaper), 132 on H100 SXM and H200
# (CUDA device properties in measured_gpu_figures.csv); none is given for Blackwell, so sm contention there
# needs ``sms`` set by hand.
# Dense tensor-core peaks shared by the SKUs of one chip (A100 40/80 GB; H100 SXM and H200 share GH100).
_AMPERE_PEAKS = {"fp32": 19.5 * T, "tf32": 156 * T, "fp16": 312 * T, "bf16": 312 * T}
_HOPPER_PEAKS = {"fp32": 67 * T, "tf32": 494.5 * T, "fp16": 989 * T, "bf16": 989 * T, "fp8": 1979 * T}

GPU_PRESETS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec(
            name="A100-40GB-SXM",
            peak_flops=_AMPERE_PEAKS,
            hbm_capacity=40 * GiB,
            hbm_bandwidth=1555 * GB,
            matmul_efficiency=271.2 / 312,
            memory_efficiency=_COPY_EFFICIENCY_MEASURED_MEAN,
            sms=108,
            board_power=400,
            source="NVIDIA A100 datasheet via ml-engineering (peaks, 1,555 GB/s); MAMF bf16 271.2 TFLOP/s",
        ),
        GpuSpec(
            name="A100-80GB-SXM",
            peak_flops=_AMPERE_PEAKS,
            hbm_capacity=80 * GiB,
            hbm_bandwidth=2039 * GB,
            matmul_efficiency=271.2 / 312,
            memory_efficiency=_COPY_EFFICIENCY_MEASURED_MEAN,
            sms=108,
            board_power=400,
            source="NVIDIA A100 datasheet via ml-engineering (peaks, 2,039 GB/s); MAMF bf16 271.2 TFLOP/s",
        ),
        GpuSpec(
            name="H100-SXM",
            peak_flops=_HOPPER_PEAKS,
            hbm_capacity=80 * GiB,
            hbm_bandwidth=3.35e12,
            matmul_efficiency=794.5 / 989,
            memory_efficiency=3.0 / 3.35,
            sms=132,
            board_power=700,
            source="NVIDIA H100 SXM datasheet via ml-engineering; MAMF bf16 794.5 TFLOP/s; copy 3.0 TB/s",
        ),
        GpuSpec(
            # The export variant of H100 SXM5: the same GH100 chip, clocks, HBM3 and tensor-core peaks (FP64, not
            # modelled, is cut); only NVLink differs (its node, hgx-h800). DeepSeek-V3 trained on H800 clusters.
            name="H800-SXM",
            peak_flops=_HOPPER_PEAKS,
            hbm_capacity=80 * GiB,
            hbm_bandwidth=3.35e12,
            matmul_efficiency=794.5 / 989,
            memory_efficiency=3.0 / 3.35,
            sms=132,
            board_power=700,
            source="H100 SXM's chip (NVIDIA H100 datasheet via ml-engineering); MAMF and copy of H100 SXM",
        ),
        GpuSpec(
            name="H200",
            peak_flops=_HOPPER_PEAKS,
            hbm_capacity=141 * GB,
            hbm_bandwidth=4.8e12,
            matmul_efficiency=788 / 989,
            memory_efficiency=4.3 / 4.8,
            sms=132,
            board_power=700,
            source="NVIDIA H200 datasheet via ml-engineering; bf16 8192^3 matmul 788 TFLOP/s; copy 4.3 TB/s",
        ),
        GpuSpec(
            name="B200",
            peak_flops={"fp32": 80 * T, "tf32": 1100 * T, "fp16": 2250 * T, "bf16": 2250 * T, "fp8": 4500 * T},
            hbm_capacity=192 * GB,
            hbm_bandwidth=8e12,
            matmul_efficiency=1745 / 2250,
            memory_efficiency=_COPY_EFFICIENCY_MEASURED_MEAN,
            board_power=1000,
            source="HGX B200 (1000 W) dense peaks (glennklockwood.com/garden/processors/B200); MAMF bf16 1745",
        ),
        GpuSpec(
            name="GB200",
            peak_flops={"fp32": 80 * T, "tf32": 1250 * T, "fp16": 2500 * T, "bf16": 2500 * T, "fp8": 5000 * T},
            hbm_capacity=186 * GB,
            hbm_bandwidth=8e12,
            matmul_efficiency=1745 / 2250,
            memory_efficiency=_COPY_EFFICIENCY_MEASURED_MEAN,
            board_power=1200,
            source="ml-engineering (GB200 per B200 chip: 2500 TFLOP/s dense bf16, 1200 W); GB200 NVL72 datasheet "
                   "(13.4 TB HBM3e over 72 GPUs); B200's MAMF fraction stands in",
        ),
        GpuSpec(
            # The China-market Hopper: GH100 with most tensor throughput fused off, full HBM3 and NVLink.
            name="H20",
            peak_flops={"fp32": 44 * T, "tf32": 74 * T, "fp16": 148 * T, "bf16": 148 * T, "fp8": 296 * T},
            hbm_capacity=96 * GB,
            hbm_bandwidth=4.0e12,
            matmul_efficiency=794.5 / 989,
            memory_efficiency=3.0 / 3.35,
            board_power=400,
            source="NVIDIA HGX H20 specification (dense: FP8 296, BF16 148, TF32 74, FP32 44 TFLOPS; 96 GB HBM3, "
                   "4.0 TB/s; NVLink 900 GB/s; 400 W) as published by SemiAnalysis and the press, Nov 2023; H100 "
                   "SXM's MAMF and copy fractions stand in (no H20 measurement in the reference data)",
        ),
        GpuSpec(
            # Blackwell Ultra in the GB300 NVL72 rack: FP4 raised and FP64 cut against GB200; FP8/BF16 unchanged.
            name="GB300",
            peak_flops={"fp32": 80 * T, "tf32": 1250 * T, "fp16": 2500 * T, "bf16": 2500 * T, "fp8": 5000 * T},
            hbm_capacity=288 * GB,
            hbm_bandwidth=8e12,
            matmul_efficiency=1745 / 2250,
            memory_efficiency=_COPY_EFFICIENCY_MEASURED_MEAN,
            board_power=1400,
            source="NVIDIA GB300 NVL72 datasheet (72 GPUs: FP8 720 PFLOPS and BF16 360 PFLOPS with sparsity, i.e. "
                   "5.0 and 2.5 PFLOPS dense per GPU; up to 21 TB HBM3e = 288 GB per GPU; 576 TB/s = 8 TB/s per "
                   "GPU); 1,400 W per GPU from OEM GB300 listings (no NVIDIA datasheet figure); B200's MAMF "
                   "fraction stands in",
        ),
        GpuSpec(
            name="MI300X",
            peak_flops={"fp32": 163.4 * T, "tf32": 653.7 * T, "fp16": 1307.4 * T, "bf16": 1307.4 * T,
                        "fp8": 2614.9 * T},
            hbm_capacity=192 * GB,
            hbm_bandwidth=5.3e12,
            matmul_efficiency=794.5 / 989,
            memory_efficiency=3.0 / 3.35,
            sms=304,  # compute units (AMD CDNA 3 white paper): RCCL's channels hold CUs as NCCL's hold SMs
            board_power=750,
            source="AMD Instinct MI300X data sheet (dense matrix peaks: FP32 163.4, TF32 653.7, FP16/BF16 1307.4, "
                   "FP8 2614.9 TFLOPS; 192 GB HBM3, 5.3 TB/s; 304 CUs; 750 W TBP); H100 SXM's MAMF and copy "
                   "fractions stand in (no MI300X measurement in the reference data)",
        ),
        GpuSpec(
            name="MI325X",
            peak_flops={"fp32": 163.4 * T, "tf32": 653.7 * T, "fp16": 1307.4 * T, "bf16": 1307.4 * T,
                        "fp8": 2614.9 * T},
            hbm_capacity=256 * GB,
            hbm_bandwidth=6.0e12,
            matmul_efficiency=794.5 / 989,
            memory_efficiency=3.0 / 3.35,
            sms=304,
            board_power=1000,
            source="AMD Instinct MI325X data sheet (MI300X's CDNA 3 compute and peaks; 256 GB HBM3E, 6.0 TB/s; "
                   "1000 W TBP); H100 SXM's MAMF and copy fractions stand in",
        ),
    )
}

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


def parameter_dtype(dtype: str) -> str:
    """The dtype a training dtype keeps its (working) parameters and their gradients in: its own, except FP8,
    whose GEMMs Transformer Engine runs in FP8 from bf16 weights (amax-scaled casts), so the parameters, their
    gradients and every reduction stay bf16; and TF32, a GEMM mode of fp32 parameters."""
    return {"fp8": "bf16", "tf32": "fp32"}.get(dtype, dtype)


def bytes_per_element(dtype: str) -> int:
    """Bytes of an activation/weight element in the compute dtype (fp8 keeps bf16 activations and weights)."""
    return 4 if dtype in ("fp32", "tf32") else 2
