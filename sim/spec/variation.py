"""Asymmetry between ranks, for ``ranks: all``: stragglers, compute jitter, mixed GPU types, degraded links.

In: the ``variation:`` mapping of a scenario. Out: a frozen ``VariationSpec`` and the helpers the builders use:
``compute_scale(rank)`` (a straggler's slowdown), ``jitter_stream(sigma, seed, rank)`` (seeded, reproducible
noise on compute times), ``gpu_of_node`` (mixed clusters) and ``link_factor`` for the topology.

- ``slowdown: {rank: factor}``: every compute task and the optimizer step of that GPU take ``factor`` times as
  long (thermal throttling, a slow HBM stack: the straggler of large-scale runs).
- ``jitter: sigma``: each compute task's time is multiplied by a log-normal factor with median 1 and log
  standard deviation sigma, drawn from numpy's PCG64 seeded by (scenario seed, rank): same scenario and seed,
  same trace; another seed, another draw.
- ``gpus: {node: GPU preset}``: those nodes hold another GPU type; their ranks are priced with its roofline.
- ``links: {name: factor}``: a NIC (``nic{node}.{rail}``) or a link (``a->b``, both directions) runs at
  ``factor`` of its capacity; a NIC with factor 0 has failed, and transfers that would use it go through the
  next healthy NIC of its node (NCCL falls back to the remaining rails). Needs ``network: contention``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from sim.hardware.frozen import FrozenSpec
from sim.hardware.gpus import GPU_PRESETS


class VariationSpec(FrozenSpec):
    slowdown: dict[int, float] = Field(default_factory=dict)
    jitter: float = Field(default=0.0, ge=0.0, le=1.0)
    gpus: dict[int, str] = Field(default_factory=dict)
    links: dict[str, float] = Field(default_factory=dict)

    @field_validator("slowdown")
    @classmethod
    def _positive(cls, value: dict[int, float]) -> dict[int, float]:
        for rank, factor in value.items():
            if factor <= 0:
                raise ValueError(f"rank {rank}: slowdown must be > 0 (1.2 = 20% slower), got {factor}")
        return value

    @field_validator("gpus")
    @classmethod
    def _known_gpus(cls, value: dict[int, str]) -> dict[int, str]:
        known = {name.lower(): name for name in GPU_PRESETS}
        for node, name in value.items():
            if name.lower() not in known:
                raise ValueError(f"node {node}: unknown GPU preset {name!r} (known: {', '.join(GPU_PRESETS)})")
        return {node: known[name.lower()] for node, name in value.items()}

    @field_validator("links")
    @classmethod
    def _factors(cls, value: dict[str, float]) -> dict[str, float]:
        for name, factor in value.items():
            if not 0 <= factor <= 1:
                raise ValueError(f"{name}: capacity factor must be in [0, 1] (0 = failed), got {factor}")
            if factor == 0 and not name.startswith("nic"):
                raise ValueError(f"{name}: only a NIC can fail (factor 0); degrade other links with 0 < factor")
        return value

    @property
    def active(self) -> bool:
        return bool(self.slowdown or self.jitter or self.gpus or self.links)

    def compute_scale(self, rank: int) -> float:
        return self.slowdown.get(rank, 1.0)


def check_variation(scenario: Any) -> None:
    """Cross-field rules of ``variation`` (ValueError naming the field)."""
    v = scenario.variation
    if v.active and scenario.ranks != "all":
        raise ValueError("variation: stragglers, jitter, mixed GPUs and link faults need ranks: all "
                         "(the default slice simulates one symmetric rank per pipeline stage)")
    if v.links and scenario.network.model != "contention":
        raise ValueError("variation.links: degraded or failed links need network: contention")
    bad_rank = next((r for r in v.slowdown if not 0 <= r < scenario.cluster.num_gpus), None)
    if bad_rank is not None:
        raise ValueError(f"variation.slowdown: rank {bad_rank} is not in 0..{scenario.cluster.num_gpus - 1}")
    bad_node = next((n for n in v.gpus if not 0 <= n < scenario.cluster.nodes), None)
    if bad_node is not None:
        raise ValueError(f"variation.gpus: node {bad_node} is not in 0..{scenario.cluster.nodes - 1}")


def jitter_stream(sigma: float, seed: int, rank: int) -> Callable[[], float]:
    """A function returning one rank's next compute-time factor (log-normal, median 1), reproducible from
    (seed, rank); drawn in blocks because a rank runs 10^4..10^5 compute tasks."""
    if sigma == 0:
        return lambda: 1.0
    generator = np.random.Generator(np.random.PCG64([seed, rank]))

    def draws() -> Iterator[float]:
        while True:
            yield from generator.lognormal(0.0, sigma, 4096).tolist()

    return draws().__next__
