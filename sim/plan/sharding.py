"""The Plan's ZeRO / FSDP semantics and the groups that shard and replicate model states.

In: ``parallel.zero``, the ``fsdp`` and ``deepspeed`` sections, the grid (``MoeFacts`` and below). Out:
``ShardingFacts``: how states rest between uses, whether weights are gathered per unit, FSDP + PP's once-per-step
gathers, flat parameters, HYBRID_SHARD, unit layers, DeepSpeed ZeRO-3's prefetch; the shard and replica groups of a
rank, the ranks the optimizer step (dense and expert) is split over, the expert-data-parallel group.
"""

from __future__ import annotations

from sim.model.params import layer_modules
from sim.plan.cached import cached_property
from sim.plan.moe import MoeFacts
from sim.spec.scenario import DeepSpeedSpec


class ShardingFacts(MoeFacts):
    """ZeRO / FSDP semantics and groups (a base of ``sim.plan.Plan``)."""

    @cached_property
    def zero_stage_at_rest(self) -> int:
        """How model states are stored between uses: FSDP keeps every sharded strategy's weights sharded
        (SHARD_GRAD_OP only skips re-sharding between forward and backward); DeepSpeed ZeRO-2 keeps a replica."""
        return 3 if self.scenario.fsdp is not None and self.zero_stage >= 2 else self.zero_stage

    @cached_property
    def data_parallel(self) -> bool:
        """Whether there is a data-parallel group to reduce gradients over (dp x cp > 1: CP ranks hold the same
        weights and reduce their gradients with the DP ranks, ``grid.dp_group``)."""
        return self.dp * self.cp > 1

    @cached_property
    def gathers_units(self) -> bool:
        """Whether weights are all-gathered per unit before use: ZeRO-3 / FULL_SHARD / HYBRID_SHARD, and FSDP's
        SHARD_GRAD_OP (gathers in the forward, keeps them through the backward)."""
        fsdp = self.scenario.fsdp
        return self.zero_stage >= 3 or (fsdp is not None and fsdp.zero_stage == 2)

    @cached_property
    def pipelined_fsdp(self) -> bool:
        """FSDP with pipeline parallelism (pp > 1), as TorchTitan runs FSDP2 under torch.distributed.pipelining:
        with PP, ``reshard_after_forward`` defaults to False (torchtitan/distributed/fsdp.py
        get_fsdp_reshard_after_forward_policy: "do not reshard after forward to avoid per-microbatch
        all-gathers"), and the pipeline stage runs every backward with ``set_reshard_after_backward(False)`` and
        ``set_requires_gradient_sync(False)``, calling each unit's ``post_backward`` (its gradient reduce-scatter)
        once after the last micro-batch's backward (torch/distributed/pipelining/stage.py
        _backward_maybe_with_nosync). So each unit's weights are all-gathered once per step, in its first
        micro-batch's forward, and stay unsharded until the step's last backward; its gradients accumulate
        unsharded and are reduce-scattered once. Llama 3's FSDP (Llama 3 paper Sec. 3.3.2: model shards are not
        resharded after the forward) has the same once-per-step gather. NO_SHARD (DDP) is unaffected."""
        fsdp = self.scenario.fsdp
        return fsdp is not None and self.pp > 1 and fsdp.zero_stage >= 2

    @cached_property
    def flat_params(self) -> bool:
        """Whether gradients live in flat per-unit parameters (ZeRO-3 and every FSDP strategy): they are reduced
        per unit, and the gathered/unreduced buffers are counted apart, so there are no DDP-style buckets."""
        return self.zero_stage >= 3 or self.scenario.fsdp is not None

    @cached_property
    def hybrid(self) -> bool:
        """FSDP HYBRID_SHARD: shard inside a node, replicate across nodes."""
        fsdp = self.scenario.fsdp
        return fsdp is not None and fsdp.sharding == "HYBRID_SHARD"

    @cached_property
    def unit_layers(self) -> int:
        """Transformer layers per FSDP unit (one per ZeRO-3 'unit' otherwise)."""
        fsdp = self.scenario.fsdp
        return fsdp.unit_layers if fsdp is not None else 1

    @cached_property
    def deepspeed(self) -> DeepSpeedSpec | None:
        """DeepSpeed ZeRO-3's granularity knobs where they apply (a ``zero_optimization`` block at stage 3): the
        weights are gathered module by module and the gradients reduced in buckets (sim.workload.fsdp_units
        gather_calls, reduce_buckets); None for FSDP, lower stages or a bare ``parallel.zero: 3``."""
        return self.scenario.deepspeed if self.zero_stage >= 3 and self.scenario.fsdp is None else None

    @cached_property
    def prefetch(self) -> bool:
        """FSDP's backward prefetch (BACKWARD_PRE); DeepSpeed ZeRO-3 prefetches while fewer than
        ``stage3_max_live_parameters`` elements are gathered and its prefetch bucket is not 0
        (partitioned_param_coordinator.py: max_params_to_prefetch = min(max_live - available, bucket)): after
        fetching a layer's largest module (the full tensor, all TP ranks' shards) there must be room left."""
        fsdp = self.scenario.fsdp
        if fsdp is not None:
            return fsdp.prefetch
        ds = self.deepspeed
        if ds is None:
            return True
        largest = max(sum(m.tensors) for m in layer_modules(self.model))
        return ds.stage3_prefetch_bucket_size > 0 and largest < ds.stage3_max_live_parameters

    @cached_property
    def zero_shards(self) -> int:
        """Ranks that share one copy of the sharded model states: a node's dp ranks under HYBRID_SHARD."""
        return len(self.shard_group(0))

    @cached_property
    def optimizer_shards(self) -> int:
        """Ranks the optimizer step's parameters are split over (1 without ZeRO)."""
        return self.zero_shards if self.zero_stage >= 1 else 1

    def shard_group(self, rank: int) -> tuple[int, ...]:
        """The ranks that shard model states with ``rank``: its DP group, or under HYBRID_SHARD the members of
        it on ``rank``'s node."""
        group = self.grid.dp_group(rank)
        if not self.hybrid:
            return group
        node = self.grid.node(rank)
        return tuple(r for r in group if self.grid.node(r) == node)

    def replica_group(self, rank: int) -> tuple[int, ...]:
        """HYBRID_SHARD: the ranks holding the same shard as ``rank`` on the other nodes (``(rank,)`` otherwise),
        which all-reduce their reduced gradient shards."""
        if not self.hybrid:
            return (rank,)
        group, shard = self.grid.dp_group(rank), self.shard_group(rank)
        local, per_node = shard.index(rank), len(shard)
        return tuple(group[i] for i in range(local, len(group), per_node))

    @cached_property
    def expert_optimizer_shards(self) -> int:
        """Ranks the expert parameters' optimizer step is split over: edp with the distributed optimizer."""
        return self.edp if self.zero_stage >= 1 else 1

    def expert_dp_group(self, rank: int) -> tuple[int, ...]:
        """The expert-data-parallel group of ``rank``, which reduces its expert gradients."""
        return self.grid.edp_group(rank)
