"""Network models the engine asks for communication times.

In: a ``Topology`` and, per request, a collective (op, total bytes, group of global ranks) or a point-to-point
transfer (bytes, source, destination). Out: seconds.

``ideal``: every transfer takes zero time (for exact schedule tests).
``analytic``: NCCL-style ring alpha-beta (sim.collectives) on the slowest tier the group crosses, with the
tier's measured ring efficiency applied to its line rate (sim.hardware). Results are cached: the same request
always costs the same.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol

from sim.collectives import p2p_time, ring_time
from sim.topology import Topology


class Network(Protocol):
    name: str

    def collective_time(self, op: str, nbytes: float, group: tuple[int, ...]) -> float: ...

    def p2p_time(self, nbytes: float, src: int, dst: int) -> float: ...


class IdealNetwork:
    name = "ideal"

    def collective_time(self, op: str, nbytes: float, group: tuple[int, ...]) -> float:
        return 0.0

    def p2p_time(self, nbytes: float, src: int, dst: int) -> float:
        return 0.0


class AnalyticNetwork:
    name = "analytic"

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.collective_time = lru_cache(maxsize=None)(self._collective_time)  # type: ignore[method-assign]
        self.p2p_time = lru_cache(maxsize=None)(self._p2p_time)  # type: ignore[method-assign]

    def _collective_time(self, op: str, nbytes: float, group: tuple[int, ...]) -> float:
        link = self.topology.tier(group)
        return ring_time(op, nbytes, len(group), link.latency, link.effective_bandwidth)

    def _p2p_time(self, nbytes: float, src: int, dst: int) -> float:
        link = self.topology.tier((src, dst))
        return p2p_time(nbytes, link.latency, link.effective_bandwidth)


def make(name: str, topology: Topology) -> Network:
    if name == "ideal":
        return IdealNetwork()
    if name == "analytic":
        return AnalyticNetwork(topology)
    raise ValueError(f"unknown network model {name!r}")
