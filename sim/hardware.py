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

from pydantic import BaseModel, ConfigDict, Field

from sim.units import Bytes, BytesPerSecond, FlopsPerSecond, GB, GiB, Seconds

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")


class FrozenSpec(BaseModel):
    """Base of every validated spec: immutable, unknown keys rejected (ARCHITECTURE.md rule 1)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuSpec(FrozenSpec):
    name: str
    peak_flops: dict[str, FlopsPerSecond] = Field(description="dense peak FLOP/s per dtype")
    hbm_capacity: Bytes
    hbm_bandwidth: BytesPerSecond
    matmul_efficiency: float = Field(gt=0, le=1)
    memory_efficiency: float = Field(gt=0, le=1)
    source: str = ""

    def peak(self, dtype: str) -> float:
        """Dense peak for ``dtype``; KeyError when the GPU has no such tensor-core path (fp8 on A100)."""
        return self.peak_flops[dtype]


class LinkSpec(FrozenSpec):
    """One tier of links, per GPU and per direction."""

    bandwidth: BytesPerSecond = Field(gt=0)
    latency: Seconds
    efficiency: float = Field(default=1.0, gt=0, le=1)

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth * self.efficiency


class NodeSpec(FrozenSpec):
    name: str
    intra_node: LinkSpec
    inter_node: LinkSpec
    source: str = ""


T = 1e12
# Copy efficiency measured on H100 (3.0 of 3.35 TB/s) and H200 (4.3 of 4.8 TB/s), measured_gpu_figures.csv;
# their mean stands in for A100 and B200, for which no device-copy measurement is in the reference data.
_COPY_EFFICIENCY_MEASURED_MEAN = (3.0 / 3.35 + 4.3 / 4.8) / 2
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
            source="NVIDIA A100 datasheet via ml-engineering (peaks, 1,555 GB/s); MAMF bf16 271.2 TFLOP/s",
        ),
        GpuSpec(
            name="A100-80GB-SXM",
            peak_flops=_AMPERE_PEAKS,
            hbm_capacity=80 * GiB,
            hbm_bandwidth=2039 * GB,
            matmul_efficiency=271.2 / 312,
            memory_efficiency=_COPY_EFFICIENCY_MEASURED_MEAN,
            source="NVIDIA A100 datasheet via ml-engineering (peaks, 2,039 GB/s); MAMF bf16 271.2 TFLOP/s",
        ),
        GpuSpec(
            name="H100-SXM",
            peak_flops=_HOPPER_PEAKS,
            hbm_capacity=80 * GiB,
            hbm_bandwidth=3.35e12,
            matmul_efficiency=794.5 / 989,
            memory_efficiency=3.0 / 3.35,
            source="NVIDIA H100 SXM datasheet via ml-engineering; MAMF bf16 794.5 TFLOP/s; copy 3.0 TB/s",
        ),
        GpuSpec(
            name="H200",
            peak_flops=_HOPPER_PEAKS,
            hbm_capacity=141 * GB,
            hbm_bandwidth=4.8e12,
            matmul_efficiency=788 / 989,
            memory_efficiency=4.3 / 4.8,
            source="NVIDIA H200 datasheet via ml-engineering; bf16 8192^3 matmul 788 TFLOP/s; copy 4.3 TB/s",
        ),
        GpuSpec(
            name="B200",
            peak_flops={"fp32": 80 * T, "tf32": 1100 * T, "fp16": 2250 * T, "bf16": 2250 * T, "fp8": 4500 * T},
            hbm_capacity=192 * GB,
            hbm_bandwidth=8e12,
            matmul_efficiency=1745 / 2250,
            memory_efficiency=_COPY_EFFICIENCY_MEASURED_MEAN,
            source="HGX B200 (1000 W) dense peaks (glennklockwood.com/garden/processors/B200); MAMF bf16 1745",
        ),
    )
}

# Per-step ring latency: intra-node from OpenXLA's H100 8-GPU all-reduce floor (32.3 us at 8 KiB over
# 2(n-1) = 14 ring steps = 2.3 us, xla_collective_perf_tables.csv); inter-node from NCCL's tuning model
# (src/graph/tuning.cc hwLat, NET / Ring / Simple = 6.6 us).
_NVLINK_STEP_LATENCY = 2.3e-6
_IB_STEP_LATENCY = 6.6e-6

NODE_PRESETS: dict[str, NodeSpec] = {
    spec.name: spec
    for spec in (
        NodeSpec(
            name="dgx-a100",
            # NVLink3 300 GB/s per direction per GPU; nccl-tests all-reduce busbw 232.5 GB/s (issue #175).
            intra_node=LinkSpec(bandwidth=300 * GB, latency=_NVLINK_STEP_LATENCY, efficiency=232.54 / 300),
            # 8x 200 Gb/s HDR per node = 25 GB/s per GPU; 96 of 100 GB/s busbw measured (nccl-tests #119).
            inter_node=LinkSpec(bandwidth=25 * GB, latency=_IB_STEP_LATENCY, efficiency=96 / 100),
            source="Narayanan et al. SC21 Sec 5 (Selene); nccl-tests issues #175, #119",
        ),
        NodeSpec(
            name="dgx-h100",
            # NVLink4 450 GB/s per direction; ~370 GB/s ring busbw (nccl-tests #212, maintainer).
            intra_node=LinkSpec(bandwidth=450 * GB, latency=_NVLINK_STEP_LATENCY, efficiency=370 / 450),
            # 8x 400 Gb/s NDR = 50 GB/s per GPU; "46-48 GB/s per NIC" (nccl-tests #290, maintainer).
            inter_node=LinkSpec(bandwidth=50 * GB, latency=_IB_STEP_LATENCY, efficiency=47 / 50),
            source="MLPerf v4.0 DGX H100 system description; nccl-tests issues #212, #290",
        ),
        NodeSpec(
            name="dgx-b200",
            # NVLink5 900 GB/s per direction. No B200 nccl-tests row in the reference data: Hopper's ring
            # efficiency stands in until the network issue fits B200 from the OpenXLA tables.
            intra_node=LinkSpec(bandwidth=900 * GB, latency=_NVLINK_STEP_LATENCY, efficiency=370 / 450),
            inter_node=LinkSpec(bandwidth=50 * GB, latency=_IB_STEP_LATENCY, efficiency=47 / 50),
            source="ml-engineering network README (NVLink5); DGX B200 8x ConnectX-7 400 Gb/s",
        ),
    )
}

DEFAULT_NODE_FOR_GPU = {
    "A100-40GB-SXM": "dgx-a100",
    "A100-80GB-SXM": "dgx-a100",
    "H100-SXM": "dgx-h100",
    "H200": "dgx-h100",
    "B200": "dgx-b200",
}


def bytes_per_element(dtype: str) -> int:
    """Bytes of an activation/weight element in the compute dtype (fp8 keeps bf16 activations and weights)."""
    return 4 if dtype in ("fp32", "tf32") else 2
