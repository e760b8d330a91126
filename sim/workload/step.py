"""The structure of one training step, shared by the task-graph emitters and the closed-form estimate.

In: a ``Plan`` (and, for times, a cost model). Out, with no task graph and no clock, from one module per concept
(each says what goes in and out), re-exported here under the names the estimate (sim.explore.estimate) reads as
``step.X``; it is this module's only importer (the emitters and the tests import the modules that define the
names), so once the estimate does too this module can go:
- ``cost_model``: the plan's cost model (``make_costs``);
- ``blocks``: the per-rank shape the op builders read and a layer's blocks' work (``layer_shape``, ``Blocks``,
  ``blocks``: attention, MLP, their column- and row-parallel GEMMs, what selective recomputation replays, the
  embedding and head);
- ``tp_collectives``: Megatron's TP collectives around each block and the loss's, and the asynchronous backward
  rule (``tp_ops``, ``loss_collectives``, ``overlaps_backward``);
- ``tp_overlap``: those collectives in chunks beside their GEMMs (TE userbuffers, AsyncTP);
- ``cp_attention``: the attention core under context parallelism and its exchanges;
- ``moe_layer``: a MoE layer's blocks and its dispatch / combine exchanges;
- ``fsdp_units``: FSDP / ZeRO-3 units, their gathers and reduce-scatters, FSDP1's gradient kernels;
- ``grad_buckets``: the gradient bytes that become final together and DDP / ZeRO-1/2 buckets, the embedding and
  head extras and the expert-data-parallel ones;
- ``param_gather``: ZeRO-1/2's weight all-gather, after the step or per bucket under the next forward;
- ``optimizer_step``: the parameters a rank updates, DualPipe's copy reduction, the gradient checks;
- ``host_offload``: the host Adam step (ZeRO-Offload, Ren et al. ATC 2021) and the PCIe copies, activation
  offload's included;
- ``train_metrics``: the trainer's sync of its train metrics after the step (Composer + torchmetrics).
The emitters (sim.workload.build, sim.workload.data_parallel) turn these into tasks; the estimate
(sim.explore.estimate) composes makespans over them.
"""

from __future__ import annotations

from sim.workload.blocks import (
    BLOCKS,
    Blocks,
    blocks,
    cp_attention_ops,
    fp8_casts,
    frozen_layer_blocks,
    layer_shape,
    replayed,
)
from sim.workload.cost_model import make_costs
from sim.workload.cp_attention import ContextAttention, attention_parts, context_attention
from sim.workload.fsdp_units import (
    ChunkUnit,
    chunk_units,
    fsdp_grad_ops,
    fsdp_predivide_factor,
    gather_calls,
    reduce_buckets,
    unit_grad_params,
    unit_modules,
    unit_params,
    unit_weight_params,
)
from sim.workload.grad_buckets import (
    bucket_full,
    chunk_gradient_bytes,
    embedding_gradient_params,
    expert_gradient_bytes,
    expert_reduces,
    fill_buckets,
    gradient_bytes,
    group_buckets,
    head_gradient_params,
    stage_layer_ids,
)
from sim.workload.host_offload import (
    activation_copy_seconds,
    host_adam_seconds,
    offload_buffer_copy_seconds,
    pcie_seconds,
    weights_to_gpu_bytes,
)
from sim.workload.moe_layer import (
    MOE_BLOCKS,
    Exchange,
    combine_exchanges,
    dispatch_exchanges,
    exchange_seconds,
    expert_group,
    moe_blocks,
    moe_recompute,
    task_seconds,
)
from sim.workload.optimizer_step import (
    GRAD_STAT_BYTES,
    copy_gradient_reduce,
    grad_checks,
    grad_stats_group,
    optimizer_params,
)
from sim.workload.param_gather import (
    GatherBucket,
    expert_param_gather_buckets,
    expert_weight_gather_bytes,
    final_weight_gather_bytes,
    overlaps_param_gather,
    param_gather_buckets,
)
from sim.workload.tp_collectives import loss_collectives, overlaps_backward, regathers_after_input_grad, tp_ops
from sim.workload.tp_overlap import (
    TE_REDUCE_SCATTER_SMS,
    async_tp,
    beside_reduce_scatter,
    chunk_gemms,
    fused_gather_seconds,
    fused_scatter_seconds,
    overlapped_collective,
    reduce_partials_bytes,
    reduce_partials_seconds,
    shard_copy_seconds,
    tp_overlap_chunk_gemms,
    tp_overlap_chunks,
    tp_overlap_sms,
)
from sim.workload.train_metrics import MetricSync, metric_sync, metric_sync_seconds

__all__ = [
    "BLOCKS", "Blocks", "ChunkUnit", "ContextAttention", "Exchange", "GRAD_STAT_BYTES", "GatherBucket", "MOE_BLOCKS",
    "MetricSync",
    "TE_REDUCE_SCATTER_SMS", "activation_copy_seconds", "async_tp", "attention_parts", "beside_reduce_scatter",
    "blocks", "bucket_full", "chunk_gemms", "chunk_gradient_bytes", "chunk_units", "combine_exchanges",
    "context_attention", "copy_gradient_reduce", "cp_attention_ops", "dispatch_exchanges", "embedding_gradient_params",
    "exchange_seconds", "expert_gradient_bytes", "expert_group", "expert_param_gather_buckets", "expert_reduces",
    "expert_weight_gather_bytes", "fill_buckets", "final_weight_gather_bytes", "fp8_casts", "frozen_layer_blocks",
    "fsdp_grad_ops", "fsdp_predivide_factor", "fused_gather_seconds", "fused_scatter_seconds", "gather_calls",
    "grad_checks", "grad_stats_group", "gradient_bytes", "group_buckets", "head_gradient_params", "host_adam_seconds",
    "layer_shape", "loss_collectives", "make_costs", "metric_sync", "metric_sync_seconds", "moe_blocks",
    "moe_recompute", "offload_buffer_copy_seconds",
    "optimizer_params", "overlapped_collective", "overlaps_backward", "overlaps_param_gather", "param_gather_buckets",
    "pcie_seconds", "reduce_buckets", "reduce_partials_bytes", "reduce_partials_seconds", "regathers_after_input_grad",
    "replayed",
    "shard_copy_seconds", "stage_layer_ids", "task_seconds", "tp_ops", "tp_overlap_chunk_gemms", "tp_overlap_chunks",
    "tp_overlap_sms", "unit_grad_params", "unit_modules", "unit_params", "unit_weight_params", "weights_to_gpu_bytes",
]
