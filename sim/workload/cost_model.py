"""The cost model a plan's tasks are priced with, shared by the emitters and the estimate.

In: a ``Plan`` (its ``costs`` section, GPU, dtype and loaded profile) and, for a node of another type in a mixed
cluster, that node's ``GpuSpec``. Out: the ``CostModel`` (sim.costs.models: ``fixed``, ``roofline`` or
``calibrated``) with the kernel floor, launch overhead (none under CUDA graphs), attention curves, FP8 options and
the GPU type's end-to-end factor resolved (docs/mechanisms/end_to_end_calibration.md, kernel_launch.md).
"""

from __future__ import annotations

from sim.costs import profile as profiles
from sim.costs.models import (
    CalibratedCosts,
    CostModel,
    FixedCosts,
    RooflineCosts,
    resolve_attention_backend,
)
from sim.hardware.gpus import GpuSpec
from sim.plan import Plan
from sim.spec.scenario import CalibratedCostsSpec, FixedCostsSpec


def make_costs(plan: Plan, gpu: GpuSpec | None = None) -> CostModel:
    """The plan's cost model, for its GPU or for ``gpu`` (a node of another type in a mixed cluster, priced on
    that GPU's own default profile)."""
    spec, own = plan.scenario.costs, plan.scenario.cluster.gpu
    gpu = gpu or own
    if isinstance(spec, FixedCostsSpec):
        return FixedCosts(spec.forward, spec.backward, spec.weight_grad, spec.optimizer)
    training = plan.scenario.training
    fp8_attention = training.fp8_attention
    # Launch overheads (docs/mechanisms/kernel_launch.md): the CPU launches nothing one by one under CUDA graphs.
    floor, launch = spec.kernel_floor, 0.0 if training.cuda_graphs else spec.launch_overhead
    # None: costs.attention_curves off, the flash kernel on the GEMM curve
    attention = (resolve_attention_backend(training.attention_backend, training.fused_kernels)
                 if spec.attention_curves else None)
    if isinstance(spec, CalibratedCostsSpec):
        return CalibratedCosts(gpu, plan.dtype, plan.profile, fp8_attention,  # type: ignore[arg-type]  # loaded
                               spec.end_to_end_factor, floor, launch, spec.fp8_split_accumulation, attention)
    profile = plan.profile if gpu.name == own.name else profiles.default_for(gpu.name)
    # The GPU type's end-to-end factor comes with its default profile, curve or flat rate alike.
    factor = spec.end_to_end_factor
    if factor is None:
        fitted = profile if profile is not None else profiles.default_for(gpu.name)
        factor = fitted.end_to_end_factor if fitted is not None else 1.0
    return RooflineCosts(gpu, plan.dtype, profile if spec.shape_efficiency else None, fp8_attention, spec.fp8_gemm,
                         factor, floor, launch, spec.fp8_split_accumulation, attention)
