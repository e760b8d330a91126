"""The scenario rules of what the cluster must offer the run: a tensor-core peak for the training
dtype, a measured profile's GEMMs in it, SMs left over by NCCL's, and the variation section's ranks, nodes and links.

In: a ``Scenario`` and its ``Degrees`` (``sim.spec.degrees``). Out: nothing, or a ``ValueError`` whose one line names
the field (``training.dtype: fp8 has no tensor-core peak on A100-80GB-SXM``); the variation section's own rules are
``sim.spec.variation.check_variation``. ``sim.spec.rules`` runs them in its order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.costs import profile
from sim.spec.degrees import Degrees
from sim.spec.variation import check_variation

if TYPE_CHECKING:
    from sim.spec.scenario import Scenario


def dtype(s: Scenario, d: Degrees) -> None:
    t = s.training
    if t.dtype not in s.cluster.gpu.peak_flops:
        raise ValueError(f"training.dtype: {t.dtype} has no tensor-core peak on {s.cluster.gpu.name}")


def calibrated(s: Scenario, d: Degrees) -> None:
    t = s.training
    if s.costs.model == "calibrated":
        measured = profile.load(s.costs.profile)  # ProfileError: file, format, version, fields
        if t.dtype not in measured.gemm:
            raise ValueError(f"costs.profile: {s.costs.profile} has no {t.dtype} GEMM measurements (it has: "
                             f"{', '.join(sorted(measured.gemm)) or 'none'}); set training.dtype or recalibrate")


def check_sm_contention(s: Scenario) -> None:
    net, gpu = s.network, s.cluster.gpu
    if not net.nccl_sms:
        return
    if gpu.sms is None:
        raise ValueError(f"network.nccl_sms: {gpu.name} has no SM count; set cluster.gpu.sms")
    for field, held in (("nccl_sms", net.nccl_sms), ("nccl_p2p_sms", net.nccl_p2p_sms)):
        if held >= gpu.sms:
            raise ValueError(f"network.{field}: {held} SMs must leave some of {gpu.name}'s {gpu.sms} to compute")


def variation(s: Scenario, d: Degrees) -> None:
    check_variation(s)
