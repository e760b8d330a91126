"""Where a scenario's model states live: sharded over the data-parallel ranks, or offloaded to the host.

In: the ``fsdp:``, ``deepspeed:`` and ``offload:`` mappings, and a top-level DeepSpeed ``zero_optimization``
block. Out: a frozen ``FsdpSpec`` (PyTorch FSDP's sharding strategy, units, prefetch and version, and the ZeRO
stage it amounts to), ``DeepSpeedSpec`` (what DeepSpeed ZeRO-3 gathers and reduces at once, by its config names)
and ``OffloadSpec`` (ZeRO-Offload / FSDP CPUOffload: optimizer states and weights in host memory); and
``zero_optimization(data)``, which writes a ``zero_optimization`` block into the scenario sections it sets
(``parallel.zero``, the gradient bucket and its overlap, ``deepspeed``, ``training.grad_dtype``, ``offload``).
ZeRO-1/2 without FSDP or DeepSpeed is ``parallel.zero`` (``sim.spec.parallel``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from sim.hardware.dtypes import parameter_dtype
from sim.hardware.frozen import FrozenSpec
from sim.spec.training import TrainingSpec
from sim.units import BytesPerSecond


class FsdpSpec(FrozenSpec):
    """PyTorch FSDP (Zhao et al. VLDB 2023): FULL_SHARD is ZeRO-3, SHARD_GRAD_OP ZeRO-2, HYBRID_SHARD shards
    inside a node and replicates across nodes, NO_SHARD is DDP."""

    sharding: Literal["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"] = "FULL_SHARD"
    unit_layers: int = Field(default=1, ge=1, description="transformer layers per FSDP unit")
    prefetch: bool = Field(default=True, description="backward prefetch (FSDP BACKWARD_PRE): issue the next unit's "
                           "gather before this unit's reduce-scatter; false = backward_prefetch=None")
    version: Literal[1, 2] = Field(default=1, description=(
        "1: torch.distributed.fsdp.FullyShardedDataParallel (flat parameters): each micro-batch's backward also "
        "runs its gradient kernels, the copy of the parameters' gradients into the flat gradient, the cast to the "
        "reduce dtype and the pre-division (docs/mechanisms/fsdp_grad_kernels.md); 2: fully_shard (FSDP2, "
        "TorchTitan), per-parameter sharding, those kernels not priced"))
    reshard_after_forward: bool | None = Field(default=None, description=(
        "FSDP2's fully_shard(reshard_after_forward=...), TorchTitan's parallelism.fsdp_reshard_after_forward: "
        "true frees each unit's gathered weights after its forward and gathers them again for its backward "
        "(FULL_SHARD); false keeps them to the backward (SHARD_GRAD_OP: FULL_SHARD with false is the same; the "
        "Llama 3 paper's 'no reshard after forward', Sec. 3.3.2). null: the framework's default, true with pp = 1 "
        "and false with pp > 1 (TorchTitan's get_fsdp_reshard_after_forward_policy 'default': 'do not reshard "
        "after forward to avoid per-microbatch all-gathers')"))

    @property
    def zero_stage(self) -> int:
        """ZeRO stage the strategy amounts to: FULL_SHARD / HYBRID_SHARD 3, SHARD_GRAD_OP (or FULL_SHARD kept
        gathered after the forward, ``reshard_after_forward: false``) 2, NO_SHARD 0."""
        if self.sharding == "FULL_SHARD" and self.reshard_after_forward is False:
            return 2
        return {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "HYBRID_SHARD": 3, "NO_SHARD": 0}[self.sharding]


class DeepSpeedSpec(FrozenSpec):
    """What DeepSpeed ZeRO-3 issues, by DeepSpeed's own config names and defaults (deepspeed/runtime/zero/config.py;
    counts are parameter elements, not bytes). Set from a scenario's ``zero_optimization`` block. With ZeRO-3,
    every leaf module's parameters are all-gathered when its pre-forward/pre-backward hook fetches them
    (partitioned_param_coordinator.py fetch_sub_module): parameters of at most
    ``stage3_param_persistence_threshold`` elements stay whole on every rank and are never gathered
    (partition_parameters.py: ds_numel <= threshold); the next modules' parameters are prefetched in one coalesced
    all-gather of at least ``stage3_prefetch_bucket_size`` elements (a module is never split), as long as fewer
    than ``stage3_max_live_parameters`` are gathered (0: no prefetch); gradients are reduce-scattered in buckets of
    ``reduce_bucket_size`` elements, a bucket being reduced when the next gradient would overflow it
    (stage3.py reduce_independent_p_g_buckets_and_remove_grads). See docs/mechanisms/zero3_granularity.md."""

    stage3_prefetch_bucket_size: float = Field(default=5e7, ge=0, description="elements per prefetch all-gather")
    stage3_param_persistence_threshold: float = Field(default=1e5, ge=0, description="parameters of at most this "
                                                      "many elements are not partitioned (never gathered)")
    stage3_max_live_parameters: float = Field(default=1e9, ge=0, description="elements gathered at once before "
                                              "prefetching stops")
    reduce_bucket_size: float = Field(default=5e8, gt=0, description="elements per gradient reduce-scatter")


class OffloadSpec(FrozenSpec):
    """CPU offload (ZeRO-Offload, Ren et al. ATC 2021; ZeRO-Infinity; FSDP CPUOffload). ``optimizer``: the fp32
    master weights and Adam states live in host memory; each rank copies its reduced gradient shard to the host
    over PCIe, the host runs Adam, and the updated 16-bit weights come back. ``params``: the 16-bit weight shards
    live on the host too (ZeRO-3/FSDP), copied to the GPU before each all-gather."""

    optimizer: bool = False
    params: bool = False
    # Host memory bandwidth per GPU for the host Adam step: a DGX H100's two Xeon 8480C have 16 DDR5-4800
    # channels (614 GB/s) for 8 GPUs, 77 GB/s each; we assume Adam's mixed read/write stream reaches half of that
    # (an assumption, not a measurement: set it from a STREAM run on the host).
    host_bandwidth: BytesPerSecond = Field(default=38e9, gt=0, description="per GPU, for the host Adam step")


def zero_optimization(data: Any) -> Any:
    """A DeepSpeed ``zero_optimization`` block sets parallel.zero and the gradient bucket size.

    In: a raw scenario mapping (anything else, or a mapping without the block, is returned as it is). Out: a copy
    without the block, its keys written into ``parallel`` (``zero``, ``dp_bucket_size``; ``overlap_grad_reduce``
    unless set), ``deepspeed`` (the scenario's own keys win), ``training.grad_dtype`` (unless set) and ``offload``;
    or a ``ValueError`` naming the key it cannot read (raised inside ``Scenario``'s validator: one line)."""
    if not isinstance(data, dict) or "zero_optimization" not in data:
        return data
    data = dict(data)
    block = data.pop("zero_optimization")
    if not isinstance(block, dict):
        raise ValueError("zero_optimization: expected a mapping like {stage: 2, reduce_bucket_size: 5e8}")
    known = {"stage", "reduce_bucket_size", "overlap_comm", "contiguous_gradients", "reduce_scatter",
             "allgather_partitions", "allgather_bucket_size", "stage3_prefetch_bucket_size",
             "stage3_param_persistence_threshold", "stage3_max_live_parameters", "offload_optimizer",
             "offload_param"}
    unknown = sorted(set(block) - known)
    if unknown:
        raise ValueError(f"zero_optimization: unsupported key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    parallel = dict(data.get("parallel") or {})
    if "stage" in block:
        parallel["zero"] = block["stage"]
    # overlap_comm: whether gradient reductions run on their own stream (under the backward) or on the compute
    # stream (stage_1_and_2.py reduce_ipg_grads / stage3.py: ``self.reduction_stream`` only with overlap_comm).
    # DeepSpeed's default is true at stage 3 and false at stages 1-2 (zero/config.py overlap_comm_valid).
    overlap = block.get("overlap_comm", block.get("stage", 0) == 3)
    if not isinstance(overlap, bool):
        raise ValueError(f"zero_optimization.overlap_comm: expected true or false (got {overlap!r})")
    parallel.setdefault("overlap_grad_reduce", overlap)
    if "reduce_bucket_size" in block:  # DeepSpeed counts elements; 2 bytes each in mixed precision
        parallel["dp_bucket_size"] = float(block["reduce_bucket_size"]) * 2
    data["parallel"] = parallel
    data["deepspeed"] = {**{key: block[key] for key in DeepSpeedSpec.model_fields if key in block},
                         **dict(data.get("deepspeed") or {})}
    training = dict(data.get("training") or {})  # DeepSpeed reduces in the parameters' dtype by default
    dtype = training.get("dtype", TrainingSpec.model_fields["dtype"].default)
    training.setdefault("grad_dtype", parameter_dtype(dtype) if isinstance(dtype, str) else dtype)
    data["training"] = training
    offload = dict(data.get("offload") or {})
    for key, field in (("offload_optimizer", "optimizer"), ("offload_param", "params")):
        device = (block.get(key) or {}).get("device", "none") if isinstance(block.get(key), dict) else "none"
        if device not in ("cpu", "none"):
            raise ValueError(f"zero_optimization.{key}.device: {device!r} is not modelled (cpu or none)")
        if device == "cpu":
            offload[field] = True
    if offload:
        data["offload"] = offload
    return data
