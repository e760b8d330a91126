"""The ``network:`` section of a scenario: which network model prices communication, and NCCL's choices.

In: the ``network:`` mapping (or its model name alone, ``network: contention``, expanded by ``sim.spec.scenario``):
the network model (ideal, analytic, contention), NCCL's algorithm and protocol, and the SMs an in-flight
collective or send holds. Out: a frozen ``NetworkSpec`` with every default filled.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sim.hardware.frozen import FrozenSpec


class NetworkSpec(FrozenSpec):
    """``analytic``: closed forms per algorithm; ``contention``: flows sharing links max-min fairly (use with
    ``ranks: all`` so concurrent groups really share); ``ideal``: free communication. ``algorithm``: ``auto``
    picks the fastest per collective as NCCL's tuner does, or fix one (NCCL_ALGO)."""

    model: Literal["ideal", "analytic", "contention"] = "analytic"
    algorithm: Literal["auto", "ring", "tree", "nvls", "hierarchical"] = "auto"
    protocol: Literal["auto", "LL", "LL128", "Simple"] = Field(default="auto", description=(
        "NCCL protocol of rings across nodes (NCCL_PROTO): per-hop latency and bandwidth from NCCL's tuning "
        "model (sim.network.collectives.RING_PROTOCOLS); auto: the fastest per collective, as NCCL's tuner"))
    nccl_sms: int = Field(default=0, ge=0, description="SMs an in-flight collective holds (NCCL channels); "
                          "overlapped compute runs at (SMs - held) / SMs of its rate "
                          "(sim.engine.sm_contention); 0: off")
    nccl_p2p_sms: int = Field(default=2, ge=0, description="SMs an in-flight send holds, when nccl_sms > 0")
