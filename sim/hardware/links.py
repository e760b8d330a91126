"""One tier of links (NVLink, NVLS, InfiniBand, PCIe) and its efficiency over message and group size.

In: a tier's line rate, latencies, plateau efficiency and knots, from a node preset, a scenario or a calibration
profile. Out: a frozen ``LinkSpec`` and the effective bandwidth of a message of n bytes in a group of n GPUs.
``efficiency`` is the fraction of the per-GPU line rate that NCCL's ring achieves as nccl-tests busbw on large
messages; it feeds the analytic network until a calibration profile replaces it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from pydantic import Field, field_validator

from sim.hardware.frozen import FrozenSpec
from sim.units import BytesPerSecond, Seconds


class LinkSpec(FrozenSpec):
    """One tier of links, per GPU (per NIC for ``inter_node``) and per direction.

    ``efficiency`` is the fraction of the line rate NCCL reaches on large messages (protocol overhead);
    ``efficiency_curve`` scales it down for smaller messages: knots (message bytes, fraction of the plateau),
    interpolated linearly in log2(bytes) and clamped at both ends. An empty curve is flat.
    """

    bandwidth: BytesPerSecond = Field(gt=0)
    latency: Seconds = Field(description="per algorithm step (a ring hop, a tree level)")
    base_latency: Seconds = Field(default=0.0, description="per collective: launch and synchronization")
    efficiency: float = Field(default=1.0, gt=0, le=1)
    efficiency_curve: tuple[tuple[float, float], ...] = ()
    group_efficiency: tuple[tuple[int, float], ...] = Field(
        default=(), description="knots (group size, bandwidth factor): a group of n GPUs takes the factor of the "
        "largest knot <= n (the first knot's below it); 1 without knots. NCCL runs fewer channels for small groups")

    @field_validator("efficiency_curve")
    @classmethod
    def _sorted_fractions(cls, curve: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
        sizes = [size for size, _ in curve]
        if sizes != sorted(sizes) or any(size <= 0 for size in sizes):
            raise ValueError("efficiency_curve: knots must be [bytes, fraction] pairs with increasing bytes > 0")
        if any(not 0 < fraction <= 1 for _, fraction in curve):
            raise ValueError("efficiency_curve: each fraction of the plateau must be in (0, 1]")
        return curve

    @field_validator("group_efficiency")
    @classmethod
    def _group_knots(cls, knots: tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
        sizes = [n for n, _ in knots]
        if sizes != sorted(set(sizes)) or any(n < 2 for n in sizes) or any(not 0 < f <= 2 for _, f in knots):
            raise ValueError("group_efficiency: knots must be [group size >= 2, factor in (0, 2]] "
                             "with increasing sizes")
        return knots

    @property
    def effective_bandwidth(self) -> float:
        """Large-message bandwidth: the line rate times the plateau efficiency."""
        return self.bandwidth * self.efficiency

    def group_factor(self, group_size: int | None) -> float:
        if not self.group_efficiency or group_size is None:
            return 1.0
        below = [factor for n, factor in self.group_efficiency if n <= group_size]
        return below[-1] if below else self.group_efficiency[0][1]

    def bandwidth_at(self, nbytes: float, group_size: int | None = None) -> float:
        """Effective bandwidth for a message of ``nbytes`` in a group of ``group_size`` GPUs (line rate x
        plateau x curve(nbytes) x the group's factor)."""
        return (self.effective_bandwidth * interpolate_log2(self.efficiency_curve, nbytes)
                * self.group_factor(group_size))


def interpolate_log2(curve: Sequence[tuple[float, float]], x: float, log_y: bool = False) -> float:
    """Piecewise-linear interpolation of knots (x, y) in log2(x) (and in log2(y) with ``log_y``), clamped to the
    end knots; 1.0 for no knots."""
    if not curve:
        return 1.0
    if x <= curve[0][0]:
        return curve[0][1]
    if x >= curve[-1][0]:
        return curve[-1][1]
    index = bisect.bisect_right([size for size, _ in curve], x)
    (x0, y0), (x1, y1) = curve[index - 1], curve[index]
    share = (math.log2(x) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
    if log_y:
        return 2 ** (math.log2(y0) + share * (math.log2(y1) - math.log2(y0)))
    return y0 + share * (y1 - y0)
