"""Cost models: how long a piece of compute takes on one GPU.

In: ``Work`` (the kernels of a block of a layer, from sim.model, and the share of a transformer layer it
represents) and a phase (forward / backward); the optimizer step by parameter count. Out: seconds.

``fixed``: the scenario gives one layer's forward and backward time; a block costs its share of them, and
the embedding, head and recomputation cost nothing unless priced by share (for exact schedule tests).
``roofline``: each kernel takes max(FLOPs / achievable FLOP/s, bytes / achievable HBM bandwidth) with the
GPU preset's measured matmul and copy efficiencies (Williams et al. 2009, roofline); a backward is two GEMMs
per forward GEMM (input and weight gradients) and about twice the element-wise traffic, so 2x forward.
The optimizer step is memory-bound Adam: 28 bytes of HBM traffic per parameter (read 16-bit grad, fp32
master, m, v; write master, m, v and the 16-bit weight).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from sim.hardware import GpuSpec
from sim.model import Op

Phase = Literal["forward", "backward"]
ADAM_BYTES_PER_PARAM = 2 + 4 + 4 + 4 + 4 + 4 + 4 + 2
BACKWARD_FACTOR = 2.0


@dataclass(frozen=True)
class Work:
    ops: tuple[Op, ...]
    layer_share: float  # fraction of one transformer layer (0 for embedding, head, selective recompute)

    @property
    def forward_flops(self) -> float:
        return sum(op.flops for op in self.ops)

    def flops(self, phase: Phase) -> float:
        return self.forward_flops * (BACKWARD_FACTOR if phase == "backward" else 1.0)


class CostModel(Protocol):
    name: str

    def compute_time(self, work: Work, phase: Phase) -> float: ...

    def optimizer_time(self, params: float) -> float: ...


class FixedCosts:
    name = "fixed"

    def __init__(self, forward: float, backward: float, optimizer: float = 0.0) -> None:
        self.forward, self.backward, self.optimizer = forward, backward, optimizer

    def compute_time(self, work: Work, phase: Phase) -> float:
        return (self.forward if phase == "forward" else self.backward) * work.layer_share

    def optimizer_time(self, params: float) -> float:
        return self.optimizer


class RooflineCosts:
    name = "roofline"

    def __init__(self, gpu: GpuSpec, dtype: str) -> None:
        self.flops_rate = gpu.peak(dtype) * gpu.matmul_efficiency
        self.bytes_rate = gpu.hbm_bandwidth * gpu.memory_efficiency

    def kernel_time(self, op: Op) -> float:
        return max(op.flops / self.flops_rate, op.bytes / self.bytes_rate)

    def compute_time(self, work: Work, phase: Phase) -> float:
        scale = BACKWARD_FACTOR if phase == "backward" else 1.0
        return scale * sum(self.kernel_time(op) for op in work.ops)

    def optimizer_time(self, params: float) -> float:
        return ADAM_BYTES_PER_PARAM * params / self.bytes_rate
