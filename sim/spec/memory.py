"""The ``memory:`` section of a scenario: what the allocator adds to the tensors' bytes.

In: the ``memory:`` mapping: bytes reserved by the CUDA context and library workspaces, and the caching
allocator's fragmentation as a fraction of the dynamic peak. Out: a frozen ``MemorySpec`` (both 0 by default).
"""

from __future__ import annotations

from pydantic import Field

from sim.hardware.frozen import FrozenSpec
from sim.units import Bytes


class MemorySpec(FrozenSpec):
    """What the allocator adds to what the tensors need: the CUDA context and library workspaces (``reserved``,
    typically 0.5-1 GiB) and the caching allocator's fragmentation (``allocator_overhead``, a fraction of the
    dynamic peak, typically 5-15%). Both default to 0, so reported peaks are the tensors' own bytes."""

    reserved: Bytes = Field(default=0.0, ge=0)
    allocator_overhead: float = Field(default=0.0, ge=0, le=1)
