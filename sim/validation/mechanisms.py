"""The fidelity mechanisms (issue 22): what each adds to a step, the knob that turns it off, and its source.

In: nothing (a registry). Out: ``MECHANISMS``, one ``Mechanism`` per modelled effect that the validation set
measures: its name, the ``--set`` overrides that switch it off on every validation scenario (so its effect is
measured against the same rows, ``python -m analysis validate --mechanisms``), the scenario knob and its
default, and where its number comes from. The ablation table in ``docs/validation.md`` is generated from here,
so a mechanism is listed exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mechanism:
    name: str
    off: tuple[str, ...]  # overrides (``a.b=value``) that switch it off on any scenario
    knob: str  # the scenario field and its default
    source: str  # where its number comes from
    doc: str = ""  # the note under docs/ that says more


MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        name="end-to-end factor per GPU type",
        off=("costs.end_to_end_factor=1",),
        knob="costs.end_to_end_factor (default: the GPU type's fitted factor, Profile.end_to_end_factor)",
        source="one least-squares factor per GPU type on named fit rows (scripts/fit_default_profiles.py): A100 on "
               "Korthikanti et al. 2022 Table 4 layer times; other GPUs on published.csv rows marked fit",
        doc="validation.md#calibration",
    ),
    Mechanism(
        name="FP8 attention core in BF16",
        off=("training.fp8_attention=true",),
        knob="training.fp8_attention (default false: Megatron-LM --fp8-dot-product-attention off)",
        source="Transformer Engine fp8_autocast covers te.Linear / LayerNormLinear / LayerNormMLP GEMMs only; "
               "DotProductAttention runs FP8 only with fp8_dpa",
    ),
    Mechanism(
        name="FP8 cast/transpose kernels",
        off=("training.fp8_cast_kernels=false",),
        knob="training.fp8_cast_kernels (default true), training.fp8_weight_cache (true: Megatron/NeMo)",
        source="Transformer Engine v1.8 linear.py / layernorm_linear.py / base.py (cast_to_fp8, fp8_cast_transpose);"
               " Megatron core_r0.8 is_first_microbatch weight cache",
        doc="mechanisms/fp8.md",
    ),
    Mechanism(
        name="FP8 GEMMs on the bf16 curve at the peak ratio",
        off=("costs.fp8_gemm=profile",),
        knob="costs.fp8_gemm (default scaled_bf16)",
        source="OpenXLA sm_100 fp8 vs bf16 tables (ratio within 0.12); cuBLASLt H100 fp8 ~1,600 TFLOP/s at 8192^3",
        doc="mechanisms/fp8.md",
    ),
    Mechanism(
        name="distributed optimizer: weight all-gather overlapped with the next forward",
        off=("parallel.overlap_param_gather=false",),
        knob="parallel.overlap_param_gather (default false: Megatron-LM; NeMo 24.07 configs set overlap_param_sync "
             "true), parallel.align_param_gather (false: chained, core_r0.8 / Apex without interleaving)",
        source="Megatron-LM core_r0.8 distrib_optimizer.py (forward pre-hook, _finish_param_sync_helper), "
               "schedules.py param_sync_func; Apex DistributedFusedAdam overlap_param_sync",
        doc="mechanisms/distributed_optimizer.md",
    ),
    Mechanism(
        name="gradient buckets reduced during the backward",
        off=("parallel.overlap_grad_reduce=false",),
        knob="parallel.overlap_grad_reduce (default true: PyTorch DDP, NeMo overlap_grad_sync; Megatron-LM CLI "
             "false), parallel.dp_bucket_size",
        source="Megatron-LM core_r0.8 distributed_data_parallel.py (bucket_size None without overlap_grad_reduce), "
               "param_and_grad_buffer.py; PyTorch DDP bucket_cap_mb",
        doc="mechanisms/distributed_optimizer.md",
    ),
)
