"""The scenario rules of where model states live: one sharding framework, FSDP's strategy against
parallel.zero, the pipeline and the schedule, DeepSpeed's pipeline limit, and CPU offload's needs.

In: a ``Scenario`` and its ``Degrees`` (``sim.spec.degrees``; ``zero_stage`` is the stage the knobs amount to).
Out: nothing, or a ``ValueError`` whose one line names the field (``fsdp.unit_layers: 3 does not divide
model.num_layers = 32``). ``sim.spec.rules`` runs them in its order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.parallel.schedules import SCHEDULES
from sim.spec.degrees import Degrees

if TYPE_CHECKING:
    from sim.spec.scenario import Scenario


def one_sharding(s: Scenario, d: Degrees) -> None:
    if s.fsdp is not None and s.deepspeed is not None:
        raise ValueError("deepspeed: a scenario runs either PyTorch FSDP (fsdp) or DeepSpeed ZeRO "
                         "(zero_optimization / deepspeed), not both")


def reshard(s: Scenario, d: Degrees) -> None:
    if s.fsdp is not None and s.fsdp.reshard_after_forward is not None:
        _check_reshard_after_forward(s.fsdp.sharding, s.fsdp.reshard_after_forward, s.parallel.pp)


def fsdp_zero(s: Scenario, d: Degrees) -> None:
    p = s.parallel
    if s.fsdp is not None and p.zero not in (0, s.fsdp.zero_stage):
        raise ValueError(f"fsdp.sharding: {s.fsdp.sharding} is ZeRO-{s.fsdp.zero_stage} but parallel.zero = {p.zero}")


def deepspeed_pipeline(s: Scenario, d: Degrees) -> None:
    p = s.parallel
    if d.zero_stage >= 2 and s.fsdp is None and p.pp > 1:
        # DeepSpeed's PipelineEngine asserts zero_optimization_stage() < ZeroStageEnum.gradients ("ZeRO-2 and
        # ZeRO-3 are incompatible with pipeline parallelism", deepspeed/runtime/pipe/engine.py).
        raise ValueError(f"parallel.zero: ZeRO-{d.zero_stage} with pp = {p.pp}: DeepSpeed's pipeline engine refuses "
                         "ZeRO-2/3 with pipelines; use an fsdp section (FSDP2 + pipelining) or ZeRO-1")


def unit_per_stage(s: Scenario, d: Degrees) -> None:
    if s.fsdp is not None and s.parallel.pp > 1 and any(size % s.fsdp.unit_layers for size in d.chunk_sizes):
        raise ValueError(f"fsdp.unit_layers: {s.fsdp.unit_layers} does not divide the layers of every model chunk "
                         f"({sorted(set(d.chunk_sizes))}); an FSDP unit lives on one pipeline stage")


def sharded_split_backward(s: Scenario, d: Degrees) -> None:
    if d.zero_stage >= 2 and SCHEDULES[s.schedule].splits_backward:
        raise ValueError(f"schedule: {s.schedule} splits the backward; with ZeRO-{d.zero_stage}/FSDP use 1f1b or gpipe")


def unit_layers(s: Scenario, d: Degrees) -> None:
    m = s.model
    if s.fsdp is not None and m.num_layers % s.fsdp.unit_layers:
        raise ValueError(f"fsdp.unit_layers: {s.fsdp.unit_layers} does not divide model.num_layers = {m.num_layers}")


def hybrid_shard(s: Scenario, d: Degrees) -> None:
    p = s.parallel
    if s.fsdp is not None and s.fsdp.sharding == "HYBRID_SHARD":
        # FSDP shards over the gradient group, dp x cp (context parallelism's ranks reduce gradients too)
        per_node = s.cluster.gpus_per_node // p.tp if s.cluster.gpus_per_node % p.tp == 0 else 0
        ranks, what = d.dp * p.cp, f"dp = {d.dp}" if p.cp == 1 else f"dp x cp = {d.dp * p.cp}"
        if per_node < 1 or ranks % per_node or ranks == per_node:
            raise ValueError(f"fsdp.sharding: HYBRID_SHARD needs the {what} ranks to span several whole nodes "
                             f"({max(per_node, 1)} per node)")


def offload(s: Scenario, d: Degrees) -> None:
    p, t = s.parallel, s.training
    if s.offload.params and not s.offload.optimizer:
        raise ValueError("offload.params: the host keeps the master weights only with offload.optimizer: true "
                         "(FSDP's CPUOffload and ZeRO-Infinity offload both)")
    if s.offload.params and d.zero_stage < 3:
        raise ValueError(f"offload.params: offloading the weights needs ZeRO-3/FSDP FULL_SHARD (zero stage is "
                         f"{d.zero_stage})")
    if p.overlap_param_gather and (d.zero_stage not in (1, 2) or s.fsdp is not None):
        raise ValueError(f"parallel.overlap_param_gather: needs the distributed optimizer (parallel.zero 1 or 2 "
                         f"without fsdp; zero stage is {d.zero_stage})")
    if p.overlap_param_gather and s.offload.optimizer:
        raise ValueError("parallel.overlap_param_gather: the weights come back from the host after the step "
                         "(offload.optimizer); set one of them false")
    if s.offload.optimizer and d.zero_stage < 1 and d.dp > 1:
        raise ValueError("offload.optimizer: ZeRO-Offload partitions the optimizer over dp; set parallel.zero >= 1")
    if not t.master_weights and t.dtype in ("fp32", "tf32"):
        raise ValueError(f"training.master_weights: false needs 16-bit weights (training.dtype {t.dtype}: fp32 "
                         "weights are their own master)")
    if s.offload.optimizer and (not t.master_weights or t.optimizer_dtype != "fp32"):
        raise ValueError("offload.optimizer: the host Adam is modelled with an fp32 master and fp32 moments "
                         "(DeepSpeed's CPUAdam); set training.master_weights: true and optimizer_dtype: fp32")


def _check_reshard_after_forward(sharding: str, reshard: bool, pp: int) -> None:
    """``fsdp.reshard_after_forward`` set explicitly: what it contradicts or what is not modelled."""
    if sharding == "NO_SHARD":
        raise ValueError("fsdp.reshard_after_forward: NO_SHARD never shards the weights; leave it unset")
    if sharding == "SHARD_GRAD_OP" and reshard:
        raise ValueError("fsdp.reshard_after_forward: true contradicts fsdp.sharding SHARD_GRAD_OP (FSDP's strategy "
                         "that keeps the weights gathered after the forward); use FULL_SHARD")
    if sharding == "HYBRID_SHARD" and not reshard:
        raise ValueError("fsdp.reshard_after_forward: false with HYBRID_SHARD is not modelled (use FULL_SHARD or "
                         "SHARD_GRAD_OP)")
    if pp > 1 and reshard:
        raise ValueError(f"fsdp.reshard_after_forward: true with parallel.pp = {pp} (gathers per micro-batch under "
                         "pipelining) is not modelled; FSDP + PP keeps each unit gathered for the step, "
                         "TorchTitan's default")
