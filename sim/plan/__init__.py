"""Scenario -> Plan: every fact derived from the knobs, decided once.

In: a validated ``Scenario`` (schema and presets, SI units). Out: a frozen ``Plan`` that everything below the
configuration layer reads instead of re-interpreting the raw knobs: the parallel degrees and rank grid; the
batch (micro-batch, micro-batches per pipeline, sequence length); the dtypes and bytes per parameter of weights
and gradients; the pipeline's stage -> model chunk -> layer map for the schedule's layout (Megatron's
interleaving, or ZB-V's V) with the stages that hold the embedding and the LM head; the parameters each stage
holds; which layers full recomputation rebuilds; TP and PP message bytes; ZeRO/FSDP semantics (the stage, what is
sharded, unit layers, prefetch, shard and replica groups); and the calibration profile, loaded once.

Modelled on TorchTitan's ``ParallelDims``: the degrees are validated once (``sim.spec.rules``) and the derived
facts are named, cached properties. Each rule here is the one definition the workload emitters, the closed-form
estimate and the memory model share (docs/architecture.md, "Rules and where they live").

The facts live in one module per concept, each a class the next one extends (the order they read each other in),
and ``Plan`` is the last: ``grid`` (degrees, rank grid, batch), ``dtypes`` (bytes per element, parameter and
message), ``pipeline`` (schedule, stage -> chunk -> layer map, embedding and head stages), ``params`` (parameters
per stage and layer; fine-tuning's trained and frozen ones), ``moe`` (a MoE layer's tokens, exchanges, DeepEP,
host sync), ``sharding`` (ZeRO/FSDP semantics and groups), ``sequence`` (documents in a row, model tokens and
FLOPs), ``activations`` (recompute, offload, stashed and transient activation bytes); each fact is a
``cached_property`` (``cached``). This module adds the loaded profile and ``resolve``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.costs import profile as profiles
from sim.costs.profile import Profile
from sim.plan.activations import ActivationFacts
from sim.plan.cached import cached_property
from sim.spec.degrees import Degrees
from sim.spec.scenario import CalibratedCostsSpec, RooflineCostsSpec, Scenario


@dataclass(frozen=True, eq=False)
class Plan(ActivationFacts):
    """The resolved facts of one scenario. Build with ``resolve(scenario)``."""

    scenario: Scenario

    def __getstate__(self) -> dict[str, Scenario]:
        """Pickle only the scenario: the cached facts are rebuilt on use (some, like the schedule's functions,
        do not pickle), so a ``RunResult`` crosses process boundaries."""
        return {"scenario": self.scenario}

    def __setstate__(self, state: dict[str, Scenario]) -> None:
        object.__setattr__(self, "scenario", state["scenario"])

    @cached_property
    def profile(self) -> Profile | None:
        """The calibration profile the cost model (and, if it has link tiers, the topology) uses: the measured
        one under ``costs: calibrated``, the GPU's shipped default under ``roofline`` with shape efficiency."""
        costs = self.scenario.costs
        if isinstance(costs, CalibratedCostsSpec):
            return profiles.load(costs.profile)
        if isinstance(costs, RooflineCostsSpec) and costs.shape_efficiency:
            return profiles.default_for(self.scenario.cluster.gpu.name)
        return None



def resolve(scenario: Scenario, implied: Degrees | None = None) -> Plan:
    """The plan of a validated scenario (cheap: every fact is computed on first use and kept). ``implied``: the
    scenario's degrees where the caller has them (``check_rules`` returns them), kept as ``Plan.degrees``."""
    plan = Plan(scenario)
    if implied is not None:
        plan.__dict__["degrees"] = implied  # where the cached property keeps it
    return plan
