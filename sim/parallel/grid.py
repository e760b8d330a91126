"""Rank grid of a tp x cp x dp x pp layout.

In: tp, pp, dp, cp and GPUs per node. Out: a ``RankGrid`` mapping global ranks to (tp, dp, pp, cp) coordinates
and back, the process group of any rank along each dimension, and the node that holds a rank; ``chunk_sizes``,
the layers of each of the pp*vpp model chunks (even, or with other counts on the first and last stage).

Placement follows Megatron-LM's default order "tp-cp-ep-dp-pp" (megatron/core/parallel_state.py,
RankGenerator) with tensor parallelism fastest, then context, then data, then pipeline:
``rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))``. With tp equal to the GPUs of a node, a TP
group is one node (NVLink) and CP/DP/PP groups span nodes (InfiniBand). Without context parallelism (cp = 1)
this is ``tp_rank + tp * (dp_rank + dp * pp_rank)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Coord:
    tp: int
    dp: int
    pp: int
    cp: int = 0


@dataclass(frozen=True)
class RankGrid:
    tp: int
    pp: int
    dp: int
    gpus_per_node: int
    ep: int = 1  # expert parallel (MoE): folded over a stage's tp x cp x dp ranks, after etp
    etp: int = 1  # expert tensor parallel, fastest
    cp: int = 1  # context parallel: between tp and dp (Megatron's "tp-cp-ep-dp-pp")

    @property
    def edp(self) -> int:
        """Expert data parallel: the ranks of a stage holding the same experts, tp*cp*dp / (ep*etp)."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    def rank(self, tp_rank: int, dp_rank: int, pp_rank: int, cp_rank: int = 0) -> int:
        return tp_rank + self.tp * (cp_rank + self.cp * (dp_rank + self.dp * pp_rank))

    def coord(self, rank: int) -> Coord:
        tp_rank = rank % self.tp
        cp_rank = (rank // self.tp) % self.cp
        dp_rank = (rank // (self.tp * self.cp)) % self.dp
        pp_rank = rank // (self.tp * self.cp * self.dp)
        return Coord(tp_rank, dp_rank, pp_rank, cp_rank)

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    # Groups are arithmetic progressions of ranks (tp fastest): built by range, not rank by rank, since the search's
    # screen asks for groups of up to thousands of ranks for every layout.
    def tp_group(self, rank: int) -> tuple[int, ...]:
        first = rank - rank % self.tp
        return tuple(range(first, first + self.tp))

    def dp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks that reduce ``rank``'s gradients and shard its ZeRO/FSDP states: the data-parallel group with
        the context-parallel ranks in it (dp x cp; Megatron-Core's get_data_parallel_group(
        with_context_parallel=True), which DDP and the distributed optimizer use; TorchTitan's dp_shard_cp mesh):
        CP ranks hold the same weights and each computes gradients on its part of the sequence. cp and dp are
        adjacent (tp-cp-dp), so the group is one stride-tp progression. The plain dp group when cp = 1."""
        c = self.coord(rank)
        first = self.rank(c.tp, 0, c.pp)
        return tuple(range(first, first + self.tp * self.cp * self.dp, self.tp))

    def cp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks sharing ``rank``'s sequences (its ring under cp_comm_type p2p, in ring order)."""
        c = self.coord(rank)
        first = self.rank(c.tp, c.dp, c.pp)
        return tuple(range(first, first + self.tp * self.cp, self.tp))

    def pp_group(self, rank: int) -> tuple[int, ...]:
        c = self.coord(rank)
        first = self.rank(c.tp, c.dp, 0, c.cp)
        stride = self.tp * self.cp * self.dp
        return tuple(range(first, first + stride * self.pp, stride))

    # MoE parallel folding (Megatron-Core parallel_state.py, expert RankGenerator with order "tp-ep-dp-pp"): the
    # tp*cp*dp ranks of a pipeline stage (contiguous: tp, cp and dp are the fastest dimensions) are re-indexed as
    # local = etp_rank + etp * (ep_rank + ep * edp_rank).
    def _expert_group(self, rank: int, stride: int, size: int) -> tuple[int, ...]:
        block = self.tp * self.cp * self.dp
        base = rank - rank % block
        local = rank % block
        first = base + local % stride + (local // (stride * size)) * stride * size
        return tuple(range(first, first + stride * size, stride))

    def etp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks splitting each of ``rank``'s experts' FFN (expert tensor parallel)."""
        return self._expert_group(rank, 1, self.etp)

    def ep_group(self, rank: int) -> tuple[int, ...]:
        """The ranks ``rank``'s tokens are dispatched over (expert parallel): one per ep index."""
        return self._expert_group(rank, self.etp, self.ep)

    def edp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks holding ``rank``'s experts (expert data parallel), which reduce their gradients."""
        return self._expert_group(rank, self.etp * self.ep, self.edp)

    def tp_ep_group(self, rank: int) -> tuple[int, ...]:
        """etp x ep ranks around ``rank``: the all-gather dispatcher's group."""
        return self._expert_group(rank, 1, self.etp * self.ep)

    def stage_representative(self, stage: int) -> int:
        """The rank simulated for a pipeline stage in representative-slice mode (tp 0, dp 0)."""
        return self.rank(0, 0, stage)


def lockstep_groups(group: tuple[int, ...], lockstep: int) -> tuple[tuple[int, ...], ...]:
    """The same collective's group for each of ``lockstep`` TP peers running in lockstep with ``group``'s
    members: tp is the fastest dimension of the grid, so rank r's peers are r+1 .. r+lockstep-1 and their DP
    (or PP) groups are ``group`` shifted by 1 .. lockstep-1. A folded rank's DP/PP transfers carry these flows.
    A group that spans the TP dimension itself (a member off TP rank 0: the model-parallel group of a gradient-norm
    all-reduce) already holds the peers, and is its own only group."""
    if any(rank % lockstep for rank in group):
        return (group,)
    return tuple(tuple(rank + t for rank in group) for t in range(lockstep))


# Cached: the search's screen asks for these per stage of thousands of layouts (pure functions of five ints).
@lru_cache(maxsize=4096)
def chunk_sizes(layers: int, pp: int, vpp: int = 1, first: int | None = None, last: int | None = None,
                embedding_slot: bool = False, loss_slot: bool = False) -> tuple[int, ...]:
    """Layers of each model chunk, in model order (chunk g = a * pp + b: virtual stage a of pipeline stage b).
    Even by default. ``first``/``last`` give the first and last pipeline stage other counts and split the rest
    evenly over the other stages, each stage's layers split evenly over its vpp chunks, as Megatron-LM's
    --decoder-first/last-pipeline-num-layers do (Qi et al. 2024 give the embedding and head stages one layer
    fewer). ``embedding_slot``/``loss_slot``: the embedding / the loss counts as one layer in an even split
    (Megatron-Core's account_for_embedding/loss_in_pipeline_split), so the first / last chunk holds one
    transformer layer fewer, none when chunks hold one. The scenario rules guarantee the split is whole."""
    if first is None and last is None:
        per = (layers + embedding_slot + loss_slot) // (pp * vpp)
        sizes = [per] * (pp * vpp)
        sizes[0] -= embedding_slot
        sizes[-1] -= loss_slot
        return tuple(sizes)
    if pp == 1:
        return (layers,)
    given = (first is not None) + (last is not None)
    rest = layers - (first or 0) - (last or 0)
    per = rest // (pp - given) if pp - given else 0
    stages = (first if first is not None else per,) + (per,) * (pp - 2) + (last if last is not None else per,)
    return tuple(stages[b] // vpp for _ in range(vpp) for b in range(pp))
