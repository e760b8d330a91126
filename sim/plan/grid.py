"""The Plan's first layer of facts: the parallel degrees, the rank grid and the batch.

In: the scenario (``GridFacts.scenario``). Out: ``GridFacts``, the degrees as the rules checked them
(``sim.spec.degrees``: tp, pp, vpp, dp, cp, for a MoE model ep, etp, edp, the ZeRO stage), sequence parallelism and
CP's communication type, the ``RankGrid`` (Megatron's tp-cp-dp-pp order with MoE's parallel folding) and the batch
(micro-batch, micro-batches per pipeline, global batch, sequence length and the s/cp tokens one rank holds). Every
other fact of the Plan is derived from these (``sim.plan``, whose ``Plan`` stacks the fact classes of its modules).
"""

from __future__ import annotations

from sim.model.transformer import ModelSpec
from sim.parallel.context import CpCommType
from sim.parallel.grid import RankGrid
from sim.plan.cached import cached_property
from sim.spec.degrees import Degrees, degrees
from sim.spec.scenario import Scenario


class GridFacts:
    """Degrees, grid and batch of one scenario (the base of ``sim.plan.Plan``)."""

    scenario: Scenario  # the validated scenario (a field of the Plan dataclass)

    # ---------------------------------------------------------------------------------------- degrees and grid
    @cached_property
    def model(self) -> ModelSpec:
        return self.scenario.model

    @cached_property
    def degrees(self) -> Degrees:
        """Degrees and batch as the rules checked them (sim.spec.degrees)."""
        return degrees(self.scenario)

    @cached_property
    def tp(self) -> int:
        return self.degrees.tp

    @cached_property
    def pp(self) -> int:
        return self.degrees.pp

    @cached_property
    def vpp(self) -> int:
        return self.degrees.vpp

    @cached_property
    def num_gpus(self) -> int:
        return self.degrees.num_gpus

    @cached_property
    def dp(self) -> int:
        """Data-parallel degree: ``parallel.dp``, or the GPUs left by tp x pp."""
        return self.degrees.dp

    @cached_property
    def sequence_parallel(self) -> bool:
        return self.scenario.parallel.sequence_parallel

    @cached_property
    def cp(self) -> int:
        """Context-parallel degree: the ranks each sequence is split over (``parallel.cp``)."""
        return self.degrees.cp

    @cached_property
    def cp_comm_type(self) -> CpCommType:
        """How a CP rank's attention sees the others' K and V (``parallel.cp_comm_type``; sim.parallel.context)."""
        return self.scenario.parallel.cp_comm_type

    # --------------------------------------------------------------------------------------------- MoE degrees
    # Megatron-Core's MoE parallel folding: the routed experts of a MoE layer are split over ep ranks and each
    # expert's FFN over etp ranks, folded over a stage's tp x dp ranks; the edp = tp*dp/(ep*etp) ranks holding
    # the same experts reduce their gradients (and shard their optimizer states) among themselves.
    @cached_property
    def is_moe(self) -> bool:
        return self.model.is_moe

    @cached_property
    def ep(self) -> int:
        return self.degrees.ep

    @cached_property
    def etp(self) -> int:
        return self.degrees.etp

    @cached_property
    def edp(self) -> int:
        return self.degrees.edp

    # ---------------------------------------------------------------------------------------------------- ZeRO
    @cached_property
    def zero_stage(self) -> int:
        """ZeRO stage: ``parallel.zero``, or FSDP's sharding strategy (FULL_SHARD and HYBRID_SHARD 3,
        SHARD_GRAD_OP 2, NO_SHARD 0)."""
        return self.degrees.zero_stage

    @cached_property
    def grid(self) -> RankGrid:
        if self.is_moe:
            return RankGrid(self.tp, self.pp, self.dp, self.scenario.cluster.gpus_per_node, self.ep, self.etp, self.cp)
        return RankGrid(self.tp, self.pp, self.dp, self.scenario.cluster.gpus_per_node, cp=self.cp)

    # --------------------------------------------------------------------------------------------------- batch
    @cached_property
    def micro_batch(self) -> int:
        return self.degrees.micro_batch

    @cached_property
    def seq_len(self) -> int:
        return self.degrees.seq_len

    @cached_property
    def local_seq_len(self) -> int:
        """Tokens of each sequence one rank holds: seq_len / cp (the rules make it whole). Every kernel but the
        attention core, every activation and every TP, PP and MoE message is sized by it."""
        return self.seq_len // self.cp

    @cached_property
    def microbatches(self) -> int:
        """Micro-batches per pipeline per step: ``training.microbatches``, or global_batch / (dp x micro_batch)."""
        return self.degrees.microbatches

    @cached_property
    def global_batch(self) -> int:
        return self.degrees.global_batch
