"""The ``costs:`` section of a scenario: which cost model prices compute, and its knobs.

In: the ``costs:`` mapping, tagged by ``model`` (or the model name alone, ``costs: roofline``, and a mapping
without ``model`` is the roofline model: ``Scenario._model_shorthand`` in ``sim.spec.scenario``). Out: one frozen
spec per cost model: ``FixedCostsSpec`` (a layer's pass times given), ``RooflineCostsSpec`` (the GPU's peaks and
its default profile's curves) and ``CalibratedCostsSpec`` (a measured profile), the last two sharing
``KernelCostsSpec``: the end-to-end factor, the launch floor and overheads, the host times behind a MoE
dispatcher's sync, FP8's split accumulation and the attention curves. ``sim.workload.cost_model`` builds the
model they name (``sim.costs.models``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sim.hardware.frozen import FrozenSpec
from sim.units import Seconds, parse_seconds


class FixedCostsSpec(FrozenSpec):
    model: Literal["fixed"]
    forward: Seconds = Field(gt=0, description="one transformer layer's forward, one micro-batch")
    backward: Seconds = Field(gt=0, description="one layer's backward; its input-gradient part (B) if weight_grad "
                              "is given")
    weight_grad: Seconds = Field(default=0.0, description="one layer's weight-gradient pass (W)")
    optimizer: Seconds = 0.0


class KernelCostsSpec(FrozenSpec):
    """What the roofline and calibrated cost models share: the end-to-end factor and the launch overheads."""

    end_to_end_factor: float | None = Field(default=None, gt=0, description=(
        "every kernel's time x this; default: the profile's factor (a shipped default profile: the GPU type's, "
        "fitted on named rows, docs/mechanisms/end_to_end_calibration.md; a measured profile: 1); 1 = the "
        "microbenchmark curves as measured"))
    kernel_floor: Seconds = Field(default=parse_seconds("1.2 us"), ge=0, description=(
        "the least device time of one kernel launch (a tiny kernel and the gap to the next): 1.1-1.3 us measured "
        "for a 1024-element add (pytorch/pytorch#161104)"))
    launch_overhead: Seconds = Field(default=parse_seconds("5 us"), ge=0, description=(
        "CPU time to launch one kernel without CUDA graphs (training.cuda_graphs: false): a piece of work of n "
        "launches takes at least n times this. 5 us: the low end of HTA's 5-20 us for the CPU launch event"))
    eager_op_overhead: Seconds = Field(default=parse_seconds("32 us"), ge=0, description=(
        "host time per kernel an eager PyTorch op issues from Python (dispatch, autograd bookkeeping, launch): "
        "what a MoE layer pass's eager ops cost the host behind the token dispatcher's host sync (moe.host_sync; "
        "sim.costs.host). 32 us: the median of an H100 host's 26-35 us per kernel replaying Megatron-Core's MoE "
        "layer (sim/data/reference/moe_host_measurements.csv); 0 = off"))
    te_module_overhead: Seconds = Field(default=parse_seconds("83 us"), ge=0, description=(
        "host time one Transformer Engine linear module's forward call costs beyond the eager op counted for its "
        "GEMM, added per TE linear module of Megatron-Core's TE layer spec (qkv and proj, or multi-head latent "
        "attention's 4-5; the experts' fc1 and fc2; a shared expert's 2: sim.costs.host.te_linear_modules) to a MoE "
        "layer forward's host time behind the dispatcher's sync. 83 us: 115 us measured per Megatron-Core "
        "TEColumnParallelLinear forward (BF16, TP 1; NVIDIA/TransformerEngine#1191, "
        "sim/data/reference/te_module_host_measurements.csv) less costs.eager_op_overhead's 32 us; 0 = off"))
    megatron_moe_host_ops: float = Field(default=63, ge=0, description=(
        "host time Megatron-Core's own MoE code (TopKRouter, the token dispatcher, the unpermute) adds to a MoE "
        "layer forward behind the dispatcher's sync, in eager ops at costs.eager_op_overhead each (sim.costs.host). "
        "63: the median over two H100/H200 hosts, two runs and two permute paths of Megatron-LM 1e05700595's "
        "router + dispatch + unpermute host time less the plain-PyTorch replay's for the same op sequence, over the "
        "replay's host time per kernel on the same host (sim/data/reference/megatron_moe_host_measurements.csv, "
        "docs/mechanisms/moe_host_sync.md); the backward adds none (measured no more than the replay's); 0 = off"))
    a2a_overlap_node_overhead: Seconds = Field(default=parse_seconds("41 us"), ge=0, description=(
        "host time one schedule-node call of Megatron-Core's combined 1F1B (moe.a2a_overlap) costs beyond plain "
        "1F1B's forward and backward: per MoE layer pass 4 node forwards, or 4 node backwards (each its own "
        "autograd run_backward) and 2 dw calls (sim.costs.host.schedule_node_host_seconds), added to the pass's "
        "host time behind the dispatcher's sync. 41 us: Megatron-LM f3e6c5's own ScheduleNode / "
        "TransformerLayerNode / schedule_chunk_1f1b (the plan built per micro-batch included) around small layer "
        "functions, less the same functions run plainly, per node call of a merged F&B layer pair; the median of "
        "the three runs of 800 on an AMD EPYC host at a load below 3 on its 2 cores (2026-11-26; three earlier "
        "runs on the host shared 8 ways read 62-73 us), with CUDA's event, stream and NVTX calls stubbed "
        "(sim/data/reference/combined_1f1b_host_measurements.csv, scripts/measure_combined_1f1b_host.py): a lower "
        "bound, a GPU adds those calls and each run_backward's hand-off to the autograd device thread; 0 = off"))
    fp8_split_accumulation: float = Field(default=1.15, ge=1, description=(
        "with dtype fp8: how much slower an FP8 GEMM runs with split (FP32-promoted) accumulation than with "
        "Hopper's fast accumulation. Transformer Engine's recipe (and torchao's) accumulates the forward GEMM fast "
        "and the input- and weight-gradient GEMMs split (_2X_ACC_DGRAD/_2X_ACC_WGRAD); 1.15: the middle of the "
        "1.1-1.2x that fast accumulation measured (pytorch/ao#2377); 1 = fast accumulation everywhere. "
        "docs/mechanisms/fp8.md"))
    attention_curves: bool = Field(default=True, description=(
        "price the flash attention kernel at the profile's measured attention rates for training.attention_backend "
        "where the profile has them (the shipped H100 profile: cuDNN fused and FlashAttention-2; "
        "docs/mechanisms/attention_kernels.md); false: as a GEMM of the same FLOPs on the GEMM curve"))


class RooflineCostsSpec(KernelCostsSpec):
    model: Literal["roofline"] = "roofline"
    shape_efficiency: bool = Field(default=True, description="GEMM efficiency by size from the GPU's default "
                                   "profile (else the flat large-GEMM efficiency)")
    fp8_gemm: Literal["scaled_bf16", "profile"] = Field(default="scaled_bf16", description=(
        "FP8 GEMMs: scaled_bf16 prices an FP8 GEMM of f FLOPs as a bf16 GEMM of f/R FLOPs (R = FP8/bf16 peak, "
        "2 on Hopper): the bf16 curve's shape at twice the rate; profile: the profile's own fp8 curve, or the "
        "preset's flat efficiency of the FP8 peak where it has none (H100)"))


class CalibratedCostsSpec(KernelCostsSpec):
    """A measured profile (``sim calibrate``): its GEMM curve and copy bandwidth, and its link tiers if any."""

    model: Literal["calibrated"]
    profile: str = Field(description="path to a profile JSON (relative to the scenario file)")
