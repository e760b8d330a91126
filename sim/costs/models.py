"""Cost models: how long a piece of compute takes on one GPU.

In: ``Work`` (the kernels of a block of a layer, from sim.model.ops, and the share of a transformer layer it
represents) and a phase; the optimizer step by parameter count. Out: seconds, and the FLOPs executed.

Phases: ``forward``; ``backward`` (the whole backward, as 1F1B and GPipe run it); ``input_grad`` (B) and
``weight_grad`` (W), the two halves that zero-bubble schedules run separately. A GEMM with weights costs its
forward once in B and once in W; ops without weights cost twice their forward in B and nothing in W; so
B + W = backward = 2x forward (Qi et al. ICLR 2024 Table 1).

``fixed``: the scenario gives one layer's forward, input-gradient (``backward``) and weight-gradient
(``weight_grad``, default 0) times; a block costs its share, a fused backward costs backward + weight_grad,
and the embedding, head and selective recomputation cost nothing (for exact schedule tests).
``roofline``: each kernel takes max(FLOPs / achievable FLOP/s, bytes / achievable HBM bandwidth) (Williams et
al. 2009). A GEMM's achievable FLOP/s comes from the GPU's shipped default profile (sim.costs.profile: achieved
FLOP/s over GEMM size, fitted to OpenXLA's measured tables; scaled by this GPU's peak over the profiled one),
or, without one (or with ``shape_efficiency: false``), the preset's flat large-GEMM efficiency (MAMF).
``calibrated``: the same roofline with a measured profile's GEMM curve and copy bandwidth (``sim calibrate``).
Both multiply every kernel's time (and the optimizer step's) by the GPU type's one end-to-end factor
(``Profile.end_to_end_factor``, fitted on named rows by scripts/fit_default_profiles.py; the scenario's
``costs.end_to_end_factor`` overrides it, 1 = none).
The optimizer step is memory-bound Adam: the caller's bytes of HBM traffic per parameter
(``sim.model.memory.adam_step_bytes_per_param``: 28 in mixed precision, read the 16-bit grad, fp32 master, m, v and
write master, m, v and the 16-bit weight; 30 where the gradients are fp32, Megatron-LM's bf16; 14 in pure bf16).

Launch overheads (roofline and calibrated; docs/mechanisms/kernel_launch.md): no kernel takes less than
``kernel_floor`` per launch on the device (an op of k kernels: k floors), and where no CUDA graph replays the step
the CPU issues each kernel in ``launch_overhead`` seconds, so a piece of work of n kernel launches takes at least
n x ``launch_overhead`` (the CPU runs ahead of the GPU only while the kernels are longer than their launches):
    kernel  = max(FLOPs / rate, bytes / bandwidth, k x kernel_floor)
    work    = max(sum of its kernels x phase scale, launches x launch_overhead)
A backward issues twice the forward's launches for the ops without weights and one per GEMM for each of B and W,
the same scale as its time (``phase_scale``).

FP8 accumulation (docs/mechanisms/fp8.md): Transformer Engine's recipe runs the forward GEMM with Hopper's fast
FP8 accumulation and the two backward GEMMs with split accumulation (partial sums promoted to FP32:
``_2X_ACC_FPROP = False``, ``_2X_ACC_DGRAD = _2X_ACC_WGRAD = True`` in transformer_engine/pytorch/module/base.py;
torchao's Float8LinearConfig makes the same choice, fast accumulation for the output GEMM only). Split
accumulation is slower by ``fp8_split_accumulation`` (1.1-1.2x measured, pytorch/ao#2377), so an FP8 linear's
input- and weight-gradient GEMMs take that much longer than the fast-accumulation curve says:
    fp8 linear GEMM = curve time x (fp8_split_accumulation in input_grad / weight_grad / backward, 1 in forward)
A measured profile's fp8 curve is torch._scaled_mm's, whose default is split accumulation (use_fast_accum
False): there the forward runs at curve time / fp8_split_accumulation instead.

Attention kernels (docs/mechanisms/attention_kernels.md): where the profile has curves for the scenario's attention
backend (``training.attention_backend``: cuDNN's fused attention or FlashAttention-2, ``resolve_attention_backend``),
the flash attention op runs at the measured rate of its pass over its executed FLOPs, forward and backward each
(``Profile.attention``); without them on the GEMM curve, as a GEMM of the same FLOPs. On an H100 the measured
rates are far below a GEMM's: cuDNN at 32 heads x 8k tokens 616 TFLOP/s forward and 428 backward (counted as twice
the forward's FLOPs), FlashAttention-2 318 and 226, against 800 for the GEMM curve. The curves are head dim 128's;
on the GPUs that measured other head dims (H100, H800) the rate is scaled to the op's own (``sim.costs.head_dim``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from sim.costs.head_dim import REFERENCE_HEAD_DIM, head_dim_scale
from sim.costs.profile import AttentionCurves, Profile
from sim.hardware.gpus import GpuSpec
from sim.model.attention_ops import FLASH_ATTENTION
from sim.model.memory import adam_step_bytes_per_param
from sim.model.ops import Op

ComputePhase = Literal["forward", "backward", "input_grad", "weight_grad"]
# How FP8 GEMMs are priced: ``scaled_bf16`` on the GPU's bf16 curve (RooflineCosts), ``profile`` on the profile's
# own fp8 curve where it has one, else the flat large-GEMM efficiency of the FP8 peak.
Fp8GemmRule = Literal["scaled_bf16", "profile"]
# Mixed-precision Adam with a 16-bit gradient: 28 bytes per parameter (also the host Adam's, ZeRO-Offload).
ADAM_BYTES_PER_PARAM = adam_step_bytes_per_param("bf16", 2.0)
AttentionBackend = Literal["fused", "flash"]


def resolve_attention_backend(requested: str, fused_kernels: bool) -> AttentionBackend:
    """``training.attention_backend``: ``fused`` or ``flash`` as asked; ``auto`` is cuDNN's fused attention where
    the layers run Megatron-LM's fused kernels on Transformer Engine (TE prefers FusedAttention on Hopper+:
    transformer_engine/pytorch/attention/dot_product_attention/utils.py get_attention_backend), FlashAttention-2
    in eager PyTorch (flash-attn, and PyTorch SDPA's priority order flash, efficient, math, cudnn: pytorch#138907)."""
    if requested in ("fused", "flash"):
        return requested  # type: ignore[return-value]
    return "fused" if fused_kernels else "flash"


def phase_scale(op: Op, phase: ComputePhase) -> float:
    """How many forward-equivalents of ``op`` a phase runs. A one-pass kernel (``op.runs_in``: FP8's casts) runs
    once in its pass, and in ``backward`` when that pass is one of its halves."""
    if op.runs_in is not None:
        return 1.0 if phase == op.runs_in or (phase == "backward" and op.runs_in != "forward") else 0.0
    if phase == "forward":
        return 1.0
    if phase == "backward":
        return 1.0 if op.has_weights and not op.trainable else 2.0  # a frozen weight: its input gradient only
    if phase == "input_grad":
        return 1.0 if op.has_weights else 2.0
    return 1.0 if op.has_weights and op.trainable else 0.0


@dataclass(frozen=True)
class Work:
    ops: tuple[Op, ...]
    layer_share: float  # fraction of one transformer layer (0 for embedding, head, selective recompute)

    def flops(self, phase: ComputePhase) -> float:
        """The FLOPs ``phase`` runs: each op's ``executed_flops`` (the causal flash kernel's executed tiles, the
        FLOPs its time is priced on) x ``phase_scale``. A task's FLOPs in the trace, summed into HFU; model FLOPs
        (MFU, Megatron's full-matrix count) are the Plan's, not these."""
        return sum(op.executed_flops * phase_scale(op, phase) for op in self.ops)


class CostModel(Protocol):
    name: str

    def compute_time(self, work: Work, phase: ComputePhase) -> float: ...

    def optimizer_time(self, params: float, bytes_per_param: float = ADAM_BYTES_PER_PARAM) -> float: ...

    def memory_time(self, nbytes: float, kernels: int = 1) -> float: ...


class FixedCosts:
    name = "fixed"

    def __init__(self, forward: float, backward: float, weight_grad: float = 0.0, optimizer: float = 0.0) -> None:
        self.per_layer = {"forward": forward, "backward": backward + weight_grad, "input_grad": backward,
                          "weight_grad": weight_grad}
        self.optimizer = optimizer

    def compute_time(self, work: Work, phase: ComputePhase) -> float:
        return self.per_layer[phase] * work.layer_share

    def optimizer_time(self, params: float, bytes_per_param: float = ADAM_BYTES_PER_PARAM) -> float:
        return self.optimizer

    def memory_time(self, nbytes: float, kernels: int = 1) -> float:
        return 0.0  # fixed costs time only the layers and the optimizer (exact schedule tests)


# The other 16-bit type of each: fp16 and bf16 GEMMs run on the same tensor cores, at the same dense peak on every
# GPU preset of sim.hardware.gpus (A100 312, H100 and H200 989, B200 2250 TFLOP/s for both, from the datasheets).
_SAME_TENSOR_CORES = {"fp16": "bf16", "bf16": "fp16"}


def profiled_dtype(profile: Profile, gpu: GpuSpec, dtype: str) -> str:
    """The profile curve that prices ``dtype``'s GEMMs: its own, or, where the profile measured only the other
    16-bit type and the GPU's peaks for the two are equal, that one. Without this an fp16 scenario on a
    bf16-only default profile (A100's) fell back to the flat large-GEMM rate and the preset's memory efficiency:
    87% of peak on every GEMM, against the fitted curve's 71% at most (Qi et al.'s fp16 rows ran ~20% fast)."""
    other = _SAME_TENSOR_CORES.get(dtype)
    if dtype in profile.gemm or other is None or other not in profile.gemm:
        return dtype
    return other if gpu.peak(other) == gpu.peak(dtype) else dtype


class RooflineCosts:
    name = "roofline"

    def __init__(self, gpu: GpuSpec, dtype: str, profile: Profile | None = None,
                 fp8_attention: bool = False, fp8_gemm: Fp8GemmRule = "scaled_bf16",
                 factor: float | None = None, kernel_floor: float = 0.0, launch_overhead: float = 0.0,
                 fp8_split_accumulation: float = 1.0, attention_backend: AttentionBackend | None = "fused") -> None:
        # The GPU type's end-to-end calibration: every kernel's time x factor (default: the profile's).
        if factor is None:
            factor = profile.end_to_end_factor if profile is not None else 1.0
        self.factor = factor
        self.kernel_floor, self.launch_overhead = kernel_floor, launch_overhead
        self.flops_rate = gpu.peak(dtype) * gpu.matmul_efficiency
        # FP8 as Transformer Engine runs it: fp8_autocast makes the linear layers' GEMMs FP8 (te.Linear,
        # LayerNormLinear, LayerNormMLP: Op.te_linear); the attention core (no weights) stays bf16 unless fp8_dpa
        # (Megatron-LM's --fp8-dot-product-attention), and the LM head (Megatron's output_layer, not a TE module)
        # always does. Those kernels are priced on a bf16 model of the same GPU (``bf16``).
        self.bf16: RooflineCosts | None = (RooflineCosts(gpu, "bf16", profile, factor=factor, kernel_floor=kernel_floor,
                                                         attention_backend=attention_backend)
                                           if dtype == "fp8" else None)
        self.fp8_attention = fp8_attention
        self.bytes_rate = gpu.hbm_bandwidth * gpu.memory_efficiency
        # The curve's dtype, which may be the other 16-bit type's (profiled_dtype); peaks use the scenario's.
        self.curve_dtype = profiled_dtype(profile, gpu, dtype) if profile is not None else dtype
        self.profile = profile if profile is not None and self.curve_dtype in profile.gemm else None
        self.scale = 1.0
        if self.profile is not None:
            profiled_peak = self.profile.gemm[self.curve_dtype].peak_flops
            self.scale = gpu.peak(dtype) / profiled_peak if profiled_peak else 1.0
        # The attention kernel's measured curves (bf16: an FP8 model's attention runs on its ``bf16`` model, and
        # fp8_attention on those curves at the FP8 peak ratio, kernel_time); None: the flash attention op prices
        # on the GEMM curve.
        self.attention: AttentionCurves | None = None
        if self.profile is not None and dtype in ("bf16", "fp16") and attention_backend is not None:
            self.attention = self.profile.attention.get(attention_backend)
        self.attention_backend, self.gpu_name = attention_backend, gpu.name
        # FP8 GEMMs on the bf16 curve (``fp8_gemm: scaled_bf16``): an FP8 GEMM of f FLOPs takes the time of a
        # bf16 GEMM of f / R FLOPs, R = FP8 peak / bf16 peak (2 on Hopper and Blackwell): the tensor cores do R
        # times the multiply-adds per cycle and the fixed costs (launch, tile ramp, wave tail) stay. On B200,
        # the one GPU whose OpenXLA table has both curves within the dense peak, this predicts the measured
        # FP8/bf16 ratio within 0.15 from 3e8 to 1e13 FLOPs (1.0 small, 1.4 at 1e10, 2.0 large; tests/test_fp8.py).
        self.fp8_ratio = 0.0
        # FP8 peak / bf16 peak: what an FP8 attention kernel gains on the bf16 one's measured curve (kernel_time)
        self.fp8_peak_ratio = gpu.peak("fp8") / gpu.peak("bf16") if self.bf16 is not None else 1.0
        if self.bf16 is not None and fp8_gemm == "scaled_bf16":
            self.fp8_ratio = gpu.peak("fp8") / gpu.peak("bf16")
        # Split over fast FP8 accumulation (module docstring): the backward's FP8 linear GEMMs x this.
        self.fp8_split_accumulation = fp8_split_accumulation

    # Which accumulation this model's FP8 curve was measured with: the bf16 curve at the peak ratio and the
    # preset's flat rate are the tensor cores' full rate (fast accumulation); CalibratedCosts overrides it.
    fp8_curve_split_accumulation = False

    def fp8_accumulation_scale(self, phase: ComputePhase) -> float:
        """How much longer than its curve an FP8 linear GEMM takes in ``phase``: TE's recipe accumulates the
        forward fast and the input- and weight-gradient GEMMs split (FP32-promoted), ``fp8_split_accumulation``
        times slower; 1 where the curve's accumulation is the phase's."""
        split = phase != "forward"
        if split == self.fp8_curve_split_accumulation:
            return 1.0
        return self.fp8_split_accumulation if split else 1.0 / self.fp8_split_accumulation

    def gemm_rate(self, flops: float) -> float:
        if self.fp8_ratio and self.bf16 is not None:
            return self.fp8_ratio * self.bf16.gemm_rate(flops / self.fp8_ratio)
        if self.profile is None:
            return self.flops_rate
        return self.profile.gemm_rate(self.curve_dtype, flops) * self.scale

    def kernel_time(self, op: Op, phase: ComputePhase = "forward") -> float:
        """One forward-equivalent of ``op`` as run in ``phase`` (the phase matters only to FP8 linear GEMMs,
        whose backward accumulates split: ``fp8_accumulation_scale``)."""
        if self.bf16 is not None and op.matmul and not (op.te_linear or (self.fp8_attention and not op.has_weights)):
            return self.bf16.kernel_time(op, phase)
        flops = op.executed_flops  # the FLOPs the kernel runs (causal flash attention: about half)
        attention = self.bf16.attention if self.bf16 is not None else self.attention
        if attention is not None and op.name == FLASH_ATTENTION and flops > 0:
            curve_pass = "forward" if phase == "forward" else "backward"
            # fp8_attention: the measured bf16 kernel's time at flops / R, as FP8 GEMMs on the bf16 curve
            # (fp8_gemm: scaled_bf16): the tensor cores run R x the multiply-adds, the softmax's exponentials
            # and the fixed costs do not speed up; at most R x the bf16 kernel (tests/test_attention_kernels.py)
            ratio = 1.0 if self.bf16 is None else self.fp8_peak_ratio
            scale = self.scale if self.bf16 is None else self.bf16.scale
            # A head dim other than the curve's 128 at its own measured rate (sim.costs.head_dim; H100 only).
            head = (head_dim_scale(self.gpu_name, self.attention_backend or "", curve_pass, op.head_dim,
                                   flops / ratio) if attention.head_dim == REFERENCE_HEAD_DIM else 1.0)
            compute = flops / (ratio * attention.rate(curve_pass, flops / ratio) * head * scale)
        else:
            compute = flops / self.gemm_rate(flops) if flops > 0 else 0.0
        if self.bf16 is not None and op.matmul and op.te_linear:
            compute *= self.fp8_accumulation_scale(phase)
        # The floor is a measured launch-to-end time, outside the end-to-end factor.
        return max(max(compute, op.bytes / self.bytes_rate) * self.factor, op.kernels * self.kernel_floor)

    def compute_time(self, work: Work, phase: ComputePhase) -> float:
        device = sum(phase_scale(op, phase) * self.kernel_time(op, phase) for op in work.ops)
        if not self.launch_overhead:
            return device
        launches = sum(phase_scale(op, phase) * op.kernels for op in work.ops)
        return max(device, launches * self.launch_overhead)

    def optimizer_time(self, params: float, bytes_per_param: float = ADAM_BYTES_PER_PARAM) -> float:
        return bytes_per_param * params / self.bytes_rate * self.factor

    def memory_time(self, nbytes: float, kernels: int = 1) -> float:
        """A memory-bound kernel sequence moving ``nbytes`` through HBM (``kernels`` launches, each at least the
        floor)."""
        return max(nbytes / self.bytes_rate * self.factor, kernels * self.kernel_floor)


class CalibratedCosts(RooflineCosts):
    """Roofline on a measured profile: its GEMM curve as measured (no peak scaling) and its copy bandwidth."""

    name = "calibrated"

    # sim calibrate measures FP8 with torch._scaled_mm, whose use_fast_accum defaults to False (split).
    fp8_curve_split_accumulation = True

    def __init__(self, gpu: GpuSpec, dtype: str, profile: Profile, fp8_attention: bool = False,
                 factor: float | None = None, kernel_floor: float = 0.0, launch_overhead: float = 0.0,
                 fp8_split_accumulation: float = 1.0, attention_backend: AttentionBackend | None = "fused") -> None:
        profile.gemm_rate(dtype, 1.0)  # a clear error now if the profile lacks the scenario's dtype
        super().__init__(gpu, dtype, profile, fp8_attention, fp8_gemm="profile",  # its own measured fp8 curve
                         factor=factor, kernel_floor=kernel_floor, launch_overhead=launch_overhead,
                         fp8_split_accumulation=fp8_split_accumulation, attention_backend=attention_backend)
        self.scale = 1.0
        if profile.copy_bandwidth is not None:
            self.bytes_rate = profile.copy_bandwidth


class ScaledCosts:
    """Another cost model's times times ``factor``: a straggler GPU (``variation.slowdown``)."""

    def __init__(self, inner: CostModel, factor: float) -> None:
        self.inner, self.factor, self.name = inner, factor, inner.name

    def compute_time(self, work: Work, phase: ComputePhase) -> float:
        return self.inner.compute_time(work, phase) * self.factor

    def optimizer_time(self, params: float, bytes_per_param: float = ADAM_BYTES_PER_PARAM) -> float:
        return self.inner.optimizer_time(params, bytes_per_param) * self.factor

    def memory_time(self, nbytes: float, kernels: int = 1) -> float:
        return self.inner.memory_time(nbytes, kernels) * self.factor
