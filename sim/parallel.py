"""Rank grid of a tp x dp x pp layout.

In: tp, pp, dp and GPUs per node. Out: a ``RankGrid`` mapping global ranks to (tp, dp, pp) coordinates and
back, the process group of any rank along each dimension, and the node that holds a rank.

Placement follows Megatron-LM's default order with tensor parallelism fastest, then data, then pipeline:
``rank = tp_rank + tp * (dp_rank + dp * pp_rank)``. With tp equal to the GPUs of a node, a TP group is one
node (NVLink) and DP/PP groups span nodes (InfiniBand).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Coord:
    tp: int
    dp: int
    pp: int


@dataclass(frozen=True)
class RankGrid:
    tp: int
    pp: int
    dp: int
    gpus_per_node: int

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def rank(self, tp_rank: int, dp_rank: int, pp_rank: int) -> int:
        return tp_rank + self.tp * (dp_rank + self.dp * pp_rank)

    def coord(self, rank: int) -> Coord:
        tp_rank = rank % self.tp
        dp_rank = (rank // self.tp) % self.dp
        pp_rank = rank // (self.tp * self.dp)
        return Coord(tp_rank, dp_rank, pp_rank)

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def tp_group(self, rank: int) -> tuple[int, ...]:
        c = self.coord(rank)
        return tuple(self.rank(t, c.dp, c.pp) for t in range(self.tp))

    def dp_group(self, rank: int) -> tuple[int, ...]:
        c = self.coord(rank)
        return tuple(self.rank(c.tp, d, c.pp) for d in range(self.dp))

    def pp_group(self, rank: int) -> tuple[int, ...]:
        c = self.coord(rank)
        return tuple(self.rank(c.tp, c.dp, p) for p in range(self.pp))

    def stage_representative(self, stage: int) -> int:
        """The rank simulated for a pipeline stage in representative-slice mode (tp 0, dp 0)."""
        return self.rank(0, 0, stage)
