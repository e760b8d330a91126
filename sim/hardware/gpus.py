"""GPU presets.

In: a preset name (``"A100-80GB-SXM"``, ``"H100-SXM"``, ``"MI300X"``, ...) or explicit fields. Out: a frozen
``GpuSpec`` in SI units (FLOP/s, bytes, bytes/s).

Every number cites its source. Peaks are *dense* tensor-core peaks (the sparse figures on NVIDIA's pages are
2x these). ``matmul_efficiency`` is the fraction of dense peak a large GEMM reaches in practice (the
"maximum achievable matmul FLOPs" of ml-engineering, measured with PyTorch); ``memory_efficiency`` the
fraction of HBM bandwidth a large device copy reaches. These feed the roofline cost model until a calibration
profile replaces them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from sim.hardware.frozen import FrozenSpec
from sim.units import GB, Bytes, BytesPerSecond, FlopsPerSecond, GiB


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

# The Blackwell presets (compute capability 10.x). Megatron-LM requires CUDA_DEVICE_MAX_CONNECTIONS=1 for tensor and
# context parallelism only below compute capability 10 (megatron/training/arguments.py: "CUDA_DEVICE_MAX_CONNECTIONS
# requirement no longer exists since the Blackwell architecture", 50d847514d, 0db0e8328b; its warning against TP with
# the EP A2A overlap is "for Hopper and before"), and Transformer Engine orders its userbuffers launches at more
# than one queue "only for Hopper, which uses persistent CTA execution" (common/comm_gemm_overlap/
# comm_gemm_overlap.cpp): sim.workload.tp_collectives reads it.
BLACKWELL: frozenset[str] = frozenset({"B200", "GB200", "GB300"})
