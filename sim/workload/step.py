"""The structure of one training step, shared by the task-graph emitters and the closed-form estimate.

In: a ``Plan`` (and, for times, a cost model). Out, with no task graph and no clock:
- ``Blocks``: the work of one layer's two blocks (attention, MLP) for one micro-batch on one TP rank, the
  column-parallel GEMMs of each (whose weight gradient hides Megatron's asynchronous input-gradient reduction),
  the attention core selective recomputation replays, and the embedding and head;
- ``tp_ops``: the Megatron TP collectives around each block (Narayanan et al. SC21 Sec. 2.3: all-reduce; with
  sequence parallelism all-gather before and reduce-scatter after, Korthikanti et al. 2022 Sec. 4.2.2);
- ``overlaps_backward``: whether a block's backward runs Megatron's asynchronous reduction under its
  weight-gradient GEMM (LinearWithGradAccumulationAndAsyncCommunication);
- the data-parallel pieces: the parameters of an FSDP/ZeRO-3 unit, the embedding and head gradients that join
  the end-of-step buckets of the stages holding them (or one per model chunk without overlap_grad_reduce), the
  ZeRO-1/2 final weight all-gather or, overlapped with the next forward, its per-bucket all-gathers, and the host Adam
  step with its PCIe copies under CPU offload (ZeRO-Offload, Ren et al. ATC 2021).
The emitters (sim.workload.build, sim.workload.data_parallel) turn these into tasks; the estimate
(sim.explore.estimate) composes makespans over them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from sim.costs import profile as profiles
from sim.costs.models import (
    ADAM_BYTES_PER_PARAM,
    CalibratedCosts,
    CostModel,
    FixedCosts,
    RooflineCosts,
    Work,
    resolve_attention_backend,
)
from sim.hardware.gpus import GpuSpec
from sim.hardware.sms import on_fewer_sms
from sim.model.attention_ops import attention_forward_ops
from sim.model.fp8_casts import Fp8Casts
from sim.model.layer_ops import RECOMPUTE_OPS, layer_forward_ops
from sim.model.layer_shape import LayerShape
from sim.model.moe_ops import moe_forward_ops
from sim.model.ops import COLUMN_PARALLEL, ROW_PARALLEL, Op
from sim.model.params import embedding_params, head_params, layer_modules
from sim.model.peft import adapt_layer_ops, frozen
from sim.model.vocab_ops import embedding_forward_ops, head_forward_ops, loss_tp_collectives
from sim.network import deepep
from sim.network.collectives import p2p_time
from sim.network.models import transfer_time
from sim.parallel.context import CpExchange, correction_rows, exchanges, executed_share, step_shares
from sim.plan import Plan
from sim.spec.scenario import CalibratedCostsSpec, FixedCostsSpec

BLOCKS = ("attention", "mlp")  # a layer's forward order; the backward runs them reversed
# A MoE layer's MLP part, in forward order (sim.model.moe_ops.moe_forward_ops): the dispatch runs between the router
# and the experts (the shared expert beside it), the combine between the experts and moe_combine.
MOE_BLOCKS = ("moe_router", "moe_shared", "moe_experts", "moe_combine")


@dataclass(frozen=True)
class Blocks:
    """One layer's work for one micro-batch on one TP rank, and the pieces priced apart."""

    block: dict[str, Work]  # attention, mlp: the whole block (half a layer each)
    column: dict[str, Work]  # the column-parallel GEMMs of each block (QKV, MLP up)
    row: dict[str, Work]  # the row-parallel GEMM of each block (attention output projection, MLP down)
    # What selective recomputation replays before each block's backward (``replayed``): attention core, input
    # norm, MLA's up projections before attention's; the pre-MLP norm and (module ``mlp``) the MLP before the MLP's
    recompute: dict[str, Work]
    embedding: Work
    head: Work
    # Under TE's userbuffers (``tp_overlap_chunks``): each block's forward with the GEMMs beside its chunked
    # collectives run as one GEMM per chunk (``chunk_gemms``), and its row-parallel GEMM so; empty otherwise
    chunked: dict[str, Work] = field(default_factory=dict)
    chunked_row: dict[str, Work] = field(default_factory=dict)
    chunked_column: dict[str, Work] = field(default_factory=dict)  # its column-parallel GEMMs so (AsyncTP's split)

    @property
    def selective(self) -> Work:
        """The forward work selective recomputation replays before the attention block's backward."""
        return self.recompute["attention"]


def make_costs(plan: Plan, gpu: GpuSpec | None = None) -> CostModel:
    """The plan's cost model, for its GPU or for ``gpu`` (a node of another type in a mixed cluster, priced on
    that GPU's own default profile)."""
    spec, own = plan.scenario.costs, plan.scenario.cluster.gpu
    gpu = gpu or own
    if isinstance(spec, FixedCostsSpec):
        return FixedCosts(spec.forward, spec.backward, spec.weight_grad, spec.optimizer)
    training = plan.scenario.training
    fp8_attention = training.fp8_attention
    # Launch overheads (docs/mechanisms/kernel_launch.md): the CPU launches nothing one by one under CUDA graphs.
    floor, launch = spec.kernel_floor, 0.0 if training.cuda_graphs else spec.launch_overhead
    # None: costs.attention_curves off, the flash kernel on the GEMM curve
    attention = (resolve_attention_backend(training.attention_backend, training.fused_kernels)
                 if spec.attention_curves else None)
    if isinstance(spec, CalibratedCostsSpec):
        return CalibratedCosts(gpu, plan.dtype, plan.profile, fp8_attention,  # type: ignore[arg-type]  # loaded
                               spec.end_to_end_factor, floor, launch, spec.fp8_split_accumulation, attention)
    profile = plan.profile if gpu.name == own.name else profiles.default_for(gpu.name)
    # The GPU type's end-to-end factor comes with its default profile, curve or flat rate alike.
    factor = spec.end_to_end_factor
    if factor is None:
        fitted = profile if profile is not None else profiles.default_for(gpu.name)
        factor = fitted.end_to_end_factor if fitted is not None else 1.0
    return RooflineCosts(gpu, plan.dtype, profile if spec.shape_efficiency else None, fp8_attention, spec.fp8_gemm,
                         factor, floor, launch, spec.fp8_split_accumulation, attention)


def fp8_casts(plan: Plan) -> Fp8Casts | None:
    """FP8's cast kernels under ``plan`` (None: not fp8, or ``training.fp8_cast_kernels`` off). With the weight
    cache (``training.fp8_weight_cache``) each layer casts its weights once per step, in its first micro-batch
    (Megatron-LM core_r0.8 schedules.py set_is_first_microbatch, TE Linear's is_first_microbatch): priced as
    1/m of a cast per micro-batch, the same step total spread over the micro-batches."""
    t = plan.scenario.training
    if plan.dtype != "fp8" or not t.fp8_cast_kernels:
        return None
    return Fp8Casts(1.0 / plan.microbatches if t.fp8_weight_cache else 1.0, t.fp8_recipe == "current")


def layer_shape(plan: Plan) -> LayerShape:
    """What the layer op builders read under ``plan`` (sim.model.layer_shape), built here alone: the model, the
    micro-batch, the rank's s/cp tokens per sequence, tp, sequence parallelism, the compute dtype's bytes and the
    ``training`` section's kernel options (flash attention, fused kernels, causal attention, fused RMSNorm/RoPE),
    with FP8's casts (``fp8_casts``)."""
    t = plan.scenario.training
    return LayerShape(plan.model, plan.micro_batch, plan.local_seq_len, plan.tp,
                      sequence_parallel=plan.sequence_parallel, elem_bytes=plan.elem_bytes,
                      flash_attention=t.flash_attention, fused_kernels=t.fused_kernels, fp8_casts=fp8_casts(plan),
                      causal=t.causal_attention, fused_norm_rope=t.fused_norm_rope)


def frozen_layer_blocks(plan: Plan) -> tuple[dict[str, Work], dict[str, Work]] | None:
    """``training.method: frozen``: (block, column) work of a frozen layer, whose linears run no weight-gradient
    GEMM (sim.model.peft.frozen); None where no layer is frozen that way."""
    if plan.peft.method != "frozen" or not plan.peft.frozen_layers:
        return None
    work = blocks(plan)
    block = {name: Work(tuple(frozen(op) if op.has_weights else op for op in w.ops), w.layer_share)
             for name, w in work.block.items()}
    column = {name: Work(tuple(frozen(op) for op in w.ops), w.layer_share) for name, w in work.column.items()}
    return block, column


def blocks(plan: Plan) -> Blocks:
    """The work of a layer's blocks, the embedding and the head under ``plan``'s shapes and TP split; under
    context parallelism every kernel runs on the rank's s/cp tokens and the attention core on them against all s
    keys (``cp_attention_ops``)."""
    t = plan.scenario.training
    b, s, elem = plan.micro_batch, plan.local_seq_len, plan.elem_bytes
    shape = layer_shape(plan)
    ops = layer_forward_ops(shape)
    if plan.cp > 1:
        ops["attention"] = cp_attention_ops(plan, shape)
    # LoRA/QLoRA: frozen base linears (input gradient only), their dequantisation, the adapters' kernels.
    ops = adapt_layer_ops(ops, shape, plan.peft)
    ops = {name: block_ops + fsdp_grad_ops(plan, block_ops) for name, block_ops in ops.items()}
    if plan.attention_work is not None:  # documents shorter than the row: flash attention per document
        share, causal = plan.attention_work
        ops = {name: tuple(replace(op, flops=op.flops * share, executed=causal if t.causal_attention else 1.0)
                           if op.name == "flash_attention" else op for op in block_ops)
               for name, block_ops in ops.items()}
    chunks = tp_overlap_chunks(plan) if tp_overlap_chunk_gemms(plan) else 0
    overlapped = COLUMN_PARALLEL | ROW_PARALLEL  # the ring exchange's GEMMs (QKV, FC1), the pipelined RS's
    return Blocks(
        block={name: Work(block_ops, 0.5) for name, block_ops in ops.items()},
        column={name: Work(tuple(op for op in block_ops if op.name in COLUMN_PARALLEL), 0.0)
                for name, block_ops in ops.items()},
        row={name: Work(tuple(op for op in block_ops if op.name in ROW_PARALLEL), 0.0)
             for name, block_ops in ops.items()},
        recompute={name: Work(replayed(block_ops, plan.recompute_modules), 0.0) for name, block_ops in ops.items()},
        embedding=Work(embedding_forward_ops(plan.model, b, s, elem), 0.0),
        head=Work(head_forward_ops(plan.model, b, s, plan.tp, elem, t.cross_entropy), 0.0),
        chunked={name: Work(chunk_gemms(block_ops, overlapped, chunks), 0.5) for name, block_ops in ops.items()}
        if chunks else {},
        chunked_row={name: Work(chunk_gemms(block_ops, ROW_PARALLEL, chunks), 0.0) for name, block_ops in ops.items()}
        if chunks else {},
        chunked_column={name: Work(chunk_gemms(block_ops, COLUMN_PARALLEL, chunks), 0.0)
                        for name, block_ops in ops.items()} if chunks else {},
    )


def loss_collectives(plan: Plan) -> tuple[tuple[str, float], ...]:
    """The loss's TP collectives in the head's forward, (op, bytes) in issue order, each blocking the compute that
    follows (the next kernel reads its result): Megatron's unfused loss all-reduces three [tokens] fp32 vectors
    (sim.model.vocab_ops.loss_tp_collectives); none for the other ``training.cross_entropy`` values."""
    return loss_tp_collectives(plan.micro_batch * plan.local_seq_len, plan.tp, plan.scenario.training.cross_entropy)


def chunk_gemms(ops: tuple[Op, ...], names: frozenset[str], chunks: int) -> tuple[Op, ...]:
    """The ops of ``ops`` named in ``names`` (with weights; a block's others dropped where ``names`` is
    ``ROW_PARALLEL`` alone: see below) as ``chunks`` GEMMs of 1/chunks of the rows each, the others as they are.

    Why: beside a chunked TP collective the GEMM is issued once per chunk. Transformer Engine's ring exchange
    (``ub_overlap_ag``) runs one GEMM per received shard and its pipelined reduce-scatter (``split_overlap_rs``,
    ``num_splits``) one per chunk (TE 1.x ``cpp_extensions/gemm.py`` / ``comm_gemm_overlap.h``); PyTorch's
    AsyncTP decomposes the matmul the same way (``torch/distributed/_symmetric_memory/__init__.py``
    ``_fused_all_gather_matmul_impl``: one ``torch.mm`` per shard; ``_fused_matmul_reduce_scatter_impl``: one per
    chunk). Each chunk is priced by the cost model at its own size (the GEMM curve is FLOP-dependent: a smaller
    GEMM runs at a lower rate, and each chunk pays the kernel floor): FLOPs and bytes over ``chunks``, the shape's
    M (tokens) over ``chunks``. Where ``names`` is the row- or the column-parallel set alone, the result is those
    GEMMs alone (the block's row piece, ``Blocks.chunked_row``; its column piece, ``Blocks.chunked_column``);
    otherwise the whole block with those GEMMs split."""
    out: list[Op] = []
    row_only = names in (ROW_PARALLEL, COLUMN_PARALLEL)
    for op in ops:
        if op.name in names and op.matmul and op.has_weights:
            shape = op.shape and (op.shape[0], max(1, op.shape[1] // chunks), op.shape[2], op.shape[3])
            out.extend([replace(op, flops=op.flops / chunks, bytes=op.bytes / chunks, shape=shape)] * chunks)
        elif not row_only:
            out.append(op)
    return tuple(out)


def fsdp_predivide_factor(world_size: int) -> int:
    """FSDP1's gradient pre-division factor: the largest power of two f dividing ``world_size`` with
    world_size / f > f, doubling from 1 (torch/distributed/algorithms/_comm_hooks/default_hooks.py
    DefaultState._get_gradient_predivide_factor; FSDP divides by f before the reduce-scatter, by world_size / f
    after it)."""
    factor = 1
    while world_size % factor == 0 and world_size / factor > factor:
        factor *= 2
    return factor


def fsdp_grad_ops(plan: Plan, block_ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """FSDP1's gradient kernels for a block's trainable weights, per micro-batch, in the backward
    (docs/mechanisms/fsdp_grad_kernels.md). Under ``torch.distributed.fsdp.FullyShardedDataParallel`` a unit's
    parameters are views into its flat parameter (``_flat_param.py`` ``_get_unflat_views_unaligned``:
    ``torch.split`` + ``view``), so autograd concatenates their gradients into the flat gradient
    (split_with_sizes' backward, a copy: read and write the gradient); the post-backward hook then casts the flat
    gradient to the reduce dtype where it differs (``_runtime_utils.py`` ``_post_backward_hook``:
    ``flat_param.grad.to(handle._reduce_dtype)``) and divides it in place by the pre-division factor before the
    reduce-scatter (``_reduce_grad``: ``_div_if_needed``). Each is a memory-bound pass over every gradient element
    of the unit; the hook's two run on FSDP's post-backward stream, beside the next unit's backward, and share its
    HBM: priced on the compute stream. None under FSDP2 (``fsdp.version: 2``), without FSDP, and where FSDP
    reduces once per step under pipeline parallelism (``Plan.pipelined_fsdp``)."""
    fsdp = plan.scenario.fsdp
    if fsdp is None or fsdp.version != 1 or plan.pipelined_fsdp or plan.dp <= 1:
        return ()
    weights = sum(op.shape[0] * op.shape[2] * op.shape[3] for op in block_ops
                  if op.has_weights and op.trainable and op.shape is not None)
    if not weights:
        return ()
    grad, reduce = plan.elem_bytes, plan.grad_bytes_per_param  # autograd's gradient dtype, FSDP's reduce dtype
    ops = [Op("fsdp_grad_flatten", 0.0, weights * 2.0 * grad, False, runs_in="weight_grad")]
    if reduce != grad:
        ops.append(Op("fsdp_grad_cast", 0.0, weights * (grad + reduce), False, runs_in="weight_grad"))
    # The factor of the whole data-parallel world (HYBRID_SHARD: shard x replica groups, _init_utils.py).
    if fsdp_predivide_factor(len(plan.grid.dp_group(0))) > 1:
        ops.append(Op("fsdp_grad_predivide", 0.0, weights * 2.0 * reduce, False, runs_in="weight_grad"))
    return tuple(ops)


def replayed(ops: tuple[Op, ...], modules: frozenset[str]) -> tuple[Op, ...]:
    """The ops of ``ops`` that selective recomputation of ``modules`` runs again, in forward order
    (``sim.model.layer_ops.RECOMPUTE_OPS``)."""
    names = frozenset().union(*(RECOMPUTE_OPS[module] for module in modules))
    return tuple(op for op in ops if op.name in names)


def moe_recompute(plan: Plan) -> dict[str, Work]:
    """Per MoE block (``MOE_BLOCKS``), the forward ops selective recomputation replays before its backward: the
    pre-MLP norm (``layernorm``) in the router's, the activation (``moe_act``) in the experts', the shared expert
    (``shared_experts``). Module ``moe`` reruns the whole MoE forward instead (the emitters' ``_moe_forward``)."""
    modules = frozenset() if "moe" in plan.recompute_modules else plan.recompute_modules
    return {name: Work(replayed(work.ops, modules), 0.0) for name, work in moe_blocks(plan).items()}


def cp_attention_ops(plan: Plan, shape: LayerShape) -> tuple[Op, ...]:
    """A layer's attention block on one CP rank (``shape``: ``layer_shape(plan)``, its s/cp tokens): its s/cp
    queries against all s keys, the flash kernel executing the blocks ``sim.parallel.context.executed_share``
    counts (the causal tile rule per chunk)."""
    share = executed_share(plan.seq_len, plan.cp, plan.cp_comm_type, shape.causal)
    return attention_forward_ops(shape, kv_seq_len=plan.seq_len, executed=share)


@dataclass(frozen=True)
class ContextAttention:
    """A layer's attention core under context parallelism (``steps``: one Work per ring step under p2p, each the
    step's flash kernel and its output correction, ``sim.parallel.context.correction_rows``; the whole core
    otherwise) and the exchanges of each pass (sim.parallel.context.exchanges). The rest of the block runs
    around it (``attention_parts``)."""

    steps: tuple[Work, ...]
    forward: tuple[CpExchange, ...]
    backward: tuple[CpExchange, ...]
    core: Work  # the whole core as one kernel: what the attention block's work prices (and the steps replace)


def attention_parts(work: Work) -> tuple[Work, Work]:
    """An attention block's work before its flash kernel (norm, QKV projection: K and V exist after it; with the
    block's layer share for fixed costs) and after it (output projection, dropout + residual)."""
    core = next(i for i, op in enumerate(work.ops) if op.name == "flash_attention")
    return Work(work.ops[:core], work.layer_share), Work(work.ops[core + 1:], 0.0)


def context_attention(plan: Plan) -> ContextAttention | None:
    """The CP attention core of ``plan`` (None without context parallelism)."""
    if plan.cp == 1:
        return None
    flash = next(op for op in blocks(plan).block["attention"].ops if op.name == "flash_attention")
    m = plan.model
    q_width, kv_width = m.q_dim / plan.tp, m.kv_dim / plan.tp
    if plan.cp_comm_type == "p2p":  # step k runs step_shares[k] of the full matrix, 1/cp of Megatron's count
        cp, causal = plan.cp, plan.scenario.training.causal_attention
        shares = step_shares(plan.seq_len, cp, causal)
        out_bytes = plan.micro_batch * plan.local_seq_len * q_width * plan.elem_bytes
        steps = tuple(Work((replace(flash, flops=flash.flops / cp, bytes=flash.bytes / cp, executed=share * cp),
                            Op("cp_out_correction", 0.0, (2 if k == 0 else 3) * out_bytes * rows, False)), 0.0)
                      for k, (share, rows) in enumerate(zip(shares, correction_rows(cp, causal), strict=True)))
    else:
        steps = (Work((flash,), 0.0),)
    b, s, elem = plan.micro_batch, plan.local_seq_len, plan.elem_bytes
    forward, backward = (exchanges(plan.cp_comm_type, plan.cp, direction, b, s, q_width, kv_width, elem)
                         for direction in ("forward", "backward"))
    return ContextAttention(steps, forward, backward, Work((flash,), 0.0))


def moe_blocks(plan: Plan) -> dict[str, Work]:
    """The work of a MoE layer's MLP part on one rank (``MOE_BLOCKS``): the router, the shared expert (sharded by
    tp), the grouped GEMMs of the local experts over ``plan.routed_tokens`` token-expert pairs (the most loaded
    rank's), the combine. The expert GEMMs stand for the half layer the dense MLP is under fixed costs."""
    ops = moe_forward_ops(layer_shape(plan), plan.etp, plan.local_experts, plan.routed_tokens)
    return {name: Work(ops[name], 0.5 if name == "moe_experts" else 0.0) for name in MOE_BLOCKS}


@dataclass(frozen=True)
class Exchange:
    """One collective of a MoE layer's token dispatch or combine: op, bytes (nccl-tests size), the group it runs
    over (``expert_group``: ``ep``, ``etp`` or ``tp_ep``) and, for the all-to-all, the routing skew the network
    prices (the hottest receiver's bytes / the mean: ``Plan.dispatch_skew``)."""

    op: str
    nbytes: float
    group: str
    skew: float = 1.0  # an all-to-all's max/mean bytes per receiving rank (sim.network.models)
    seconds: float | None = None  # DeepEP's closed form (``Plan.deepep_seconds``): the analytic replay and the
    # estimate take it; the contention replay moves the exchange as flows instead (``task_seconds``)


def task_seconds(plan: Plan, exchange: Exchange) -> float | None:
    """The duration an exchange's task carries (None: the network times it): DeepEP's closed form, except on the
    contention network, which moves DeepEP's exchanges as flows on the links they use (its ``deepep_*`` ops,
    sim.network.deepep.deepep_flows), so they share them with the DP and PP traffic."""
    return None if plan.scenario.network.model == "contention" else exchange.seconds


def exchange_seconds(plan: Plan, network: Any, exchange: Exchange) -> float:
    """One exchange's seconds as both replays price it: DeepEP's closed form where it carries one, else the
    network's time for its op, bytes, group (rank 0's) and skew (sim.network.models.transfer_time)."""
    if exchange.seconds is not None:
        return exchange.seconds
    return transfer_time(network, exchange.op, exchange.nbytes, expert_group(plan, 0, exchange.group), exchange.skew)


def dispatch_exchanges(plan: Plan) -> tuple[Exchange, ...]:
    """The forward dispatch of a MoE layer (Megatron-Core token_dispatcher.py). alltoall: an all-to-all of the
    permuted tokens over the EP group (``Plan.dispatch_bytes``), then with etp > 1 an all-gather of what arrived
    over the etp group (MoEAlltoAllTokenDispatcher: gather_from_sequence_parallel_region over the expert TP group);
    allgather: an all-gather of every token over the etp x ep group (MoEAllGatherTokenDispatcher). The backward
    of the combine runs these same collectives."""
    dispatcher = plan.scenario.moe.token_dispatcher
    if dispatcher == "allgather":
        return (Exchange("all_gather", plan.allgather_dispatch_bytes, "tp_ep"),)
    if dispatcher == "flex":
        return (_deepep_exchange(plan, combine=False),)
    out: tuple[Exchange, ...] = (Exchange("all_to_all", plan.dispatch_bytes, "ep", plan.dispatch_skew),)
    if plan.etp > 1:
        out += (Exchange("all_gather", plan.expert_gather_bytes, "etp"),)
    return out


def combine_exchanges(plan: Plan) -> tuple[Exchange, ...]:
    """The forward combine, the dispatch's mirror: reduce-scatter over etp then all-to-all back (alltoall), or a
    reduce-scatter over the etp x ep group (allgather). The backward of the dispatch runs these."""
    dispatcher = plan.scenario.moe.token_dispatcher
    if dispatcher == "allgather":
        return (Exchange("reduce_scatter", plan.allgather_dispatch_bytes, "tp_ep"),)
    if dispatcher == "flex":
        return (_deepep_exchange(plan, combine=True),)
    out: tuple[Exchange, ...] = (Exchange("reduce_scatter", plan.expert_gather_bytes, "etp"),) if plan.etp > 1 else ()
    return out + (Exchange("all_to_all", plan.dispatch_bytes, "ep", plan.dispatch_skew),)


def _deepep_exchange(plan: Plan, combine: bool) -> Exchange:
    """flex (DeepEP, etp 1): one fused dispatch or combine over the EP group, carrying the bytes of its bottleneck
    (RDMA across nodes, else NVLink; ``Plan.deepep_bytes``) and its closed-form seconds (``Plan.deepep_seconds``).
    The dispatch's backward is a combine and the combine's a dispatch (Megatron-Core fused_a2a.py), priced as
    such by the emitter's reuse of these exchanges."""
    rdma, nvlink = plan.deepep_bytes
    return Exchange(deepep.COMBINE if combine else deepep.DISPATCH, rdma or nvlink, "ep", plan.dispatch_skew,
                    plan.deepep_seconds[int(combine)])


def expert_group(plan: Plan, rank: int, which: str) -> tuple[int, ...]:
    """The ``ep``, ``etp`` or ``tp_ep`` group of ``rank`` (sim.parallel.grid, MoE parallel folding)."""
    grid = plan.grid
    return {"ep": grid.ep_group, "etp": grid.etp_group, "tp_ep": grid.tp_ep_group}[which](rank)


def tp_ops(plan: Plan) -> tuple[str | None, str | None]:
    """(collective before a block, collective after it) of Megatron's TP, each of ``plan.tp_bytes``; None where
    there is none (no TP, or no all-gather without sequence parallelism)."""
    if plan.tp == 1:
        return None, None
    return ("all_gather", "reduce_scatter") if plan.sequence_parallel else (None, "all_reduce")


def tp_overlap_chunks(plan: Plan) -> int:
    """Chunks a block's TP all-gather and reduce-scatter are split into under the GEMM beside them
    (``parallel.tp_comm_overlap`` with sequence parallelism; docs/mechanisms/tp_comm_overlap.md), 0 where they are
    not. Transformer Engine's userbuffers (TE 1.x ``module/base.py`` ``initialize_ub``, ``ub_overlap_ag`` /
    ``ub_overlap_rs``) run the all-gather before QKV and FC1 (forward) and before the output projection's and
    FC2's input-gradient GEMMs (backward) as a ring exchange, one shard per peer, a GEMM chunk per shard; the
    reduce-scatter after the output projection and FC2 pipelined over the GEMM's chunks. Megatron-Core asserts
    sequence parallelism for it (``--tp-comm-overlap``), so without SP nothing is split. Default: tp chunks."""
    parallel = plan.scenario.parallel
    if plan.tp == 1 or not parallel.tp_comm_overlap or not plan.sequence_parallel:
        return 0
    chunks = parallel.tp_comm_overlap_chunks or plan.tp
    return chunks if chunks > 1 else 0  # one chunk: the whole collective, exposed


def async_tp(plan: Plan) -> bool:
    """Whether the chunked TP collectives are PyTorch's AsyncTP (``parallel.tp_comm_overlap_method: async_tp``:
    torch.distributed._symmetric_memory's fused_all_gather_matmul / fused_matmul_reduce_scatter, which Inductor's
    micro-pipeline TP pass puts in place of every all-gather -> matmul and matmul -> reduce-scatter it finds in a
    compiled graph, the backward's included: torch/_inductor/fx_passes/post_grad.py post_grad_passes runs
    micro_pipeline_tp_pass on each graph it compiles)."""
    return bool(tp_overlap_chunks(plan)) and plan.scenario.parallel.tp_comm_overlap_method == "async_tp"


def tp_overlap_chunk_gemms(plan: Plan) -> bool:
    """Whether the GEMMs beside the chunked collectives are priced one per chunk (``chunk_gemms``):
    ``parallel.tp_comm_overlap_chunk_gemms``, by default only under AsyncTP, which issues one ``mm`` per shard
    from Python (_symmetric_memory ``_fused_all_gather_matmul_impl``'s shard_consumer,
    ``_fused_matmul_reduce_scatter_impl``'s chunk_producer: ``mm_out_op(A_shards[rank], B, out=out)``)."""
    flag = plan.scenario.parallel.tp_comm_overlap_chunk_gemms
    return (plan.scenario.parallel.tp_comm_overlap_method == "async_tp") if flag is None else flag


def reduce_partials_bytes(plan: Plan) -> float:
    """HBM bytes of AsyncTP's reduction after a chunked reduce-scatter, 0 where there is none (not AsyncTP).

    PyTorch's ``_fused_matmul_reduce_scatter_impl`` does not reduce while it communicates: each rank's chunk
    GEMMs write the partial products of every shard, ``_pipelined_produce_and_all2all`` copies peer r's partial of
    this rank's shard into ``stacked_partials`` (an all-to-all, one chunk per peer), and one kernel then sums the
    tp partials (``reduce_partials``: ``torch.sum`` over the rank dimension, a Triton kernel accumulating in fp32
    in later versions). That kernel reads the tp partials, tp x (b s h / tp) elements = ``tp_bytes``, and writes
    one shard, ``tp_bytes / tp``: memory-bound, on the SMs, after the last chunk (nothing left to hide it under)."""
    if not async_tp(plan):
        return 0.0
    return plan.tp_bytes * (1 + 1 / plan.tp)


def shard_copy_seconds(plan: Plan, costs: CostModel) -> float:
    """Seconds of AsyncTP's copy of the rank's shard into its symmetric-memory buffer before a chunked all-gather
    (``_pipelined_all_gather_and_consume``: ``copy_shard(dst=local_p2p_bufs, src=shard)`` on the compute stream
    between two barriers, so that the peers can pull it), a device copy reading and writing ``tp_bytes / tp``;
    0 where there is none (not AsyncTP: TE's layer norm writes its output into the userbuffer)."""
    if not async_tp(plan):
        return 0.0
    return costs.memory_time(2 * plan.tp_bytes / plan.tp)


def fused_gather_seconds(copy: float, gemm: float, remote: float, chunks: int) -> float:
    """AsyncTP's all-gather fused with ``gemm`` seconds of GEMM (``fused_all_gather_matmul``): the shard's copy
    into symmetric memory, the GEMM's first n - 1 chunks beside the copies of the n - 1 remote shards
    (``remote`` seconds), its last chunk after both (sim.workload.build ``_fused_gather``)."""
    return copy + max(gemm * (chunks - 1) / chunks, remote) + gemm / chunks


def fused_scatter_seconds(gemm: float, remote: float, reduction: float, chunks: int) -> float:
    """AsyncTP's reduce-scatter fused with ``gemm`` (``fused_matmul_reduce_scatter``): the first chunk, the other
    n - 1 beside the peers' pulls (``remote`` seconds), then the partials' reduction (sim.workload.build
    ``_fused_scatter``)."""
    return gemm / chunks + max(gemm * (chunks - 1) / chunks, remote) + reduction


def reduce_partials_seconds(plan: Plan, costs: CostModel) -> float:
    """Seconds of AsyncTP's reduction after a chunked reduce-scatter (``reduce_partials_bytes`` through the cost
    model's memory-bound kernel rate: one launch); 0 where there is none."""
    nbytes = reduce_partials_bytes(plan)
    return costs.memory_time(nbytes) if nbytes else 0.0


# Transformer Engine's default for the pipelined reduce-scatter after a row-parallel GEMM (proj_fprop, fc2_fprop)
# when no userbuffers config names it: num_sm 16 with set_sm_margin (transformer_engine/pytorch/module/base.py
# initialize_ub, get_default_config, TE 2.0 to d0067d0da). Megatron-LM's --tp-comm-overlap without
# --tp-comm-overlap-cfg hands TE an empty config (megatron/training/initialize.py _initialize_tp_communicators:
# ub_cfgs = {}), so this is what it runs. NeMo's H100 configs differ (bf16 proj_fprop 24 / fc2_fprop 16, fp8 a ring
# exchange on 1; the validation rows set theirs); sim import fills TE's defaults for what a config omits
# (te_userbuffers_default in the Megatron importer).
TE_REDUCE_SCATTER_SMS = 16


def tp_overlap_sms(plan: Plan) -> int:
    """SMs the chunked reduce-scatter after a block's row-parallel GEMM takes from that GEMM
    (``parallel.tp_comm_overlap_sms``; 0 where the collectives are not chunked or the GPU has no SM count).
    Transformer Engine launches a GEMM beside a userbuffers collective with ``set_sm_margin`` on the SMs the
    collective's ``num_sm`` leave (TE ``comm_gemm_overlap.cpp``: ``_math_sms = sm_count - num_comm_sm`` with
    set_sm_margin), for the whole GEMM. Default: TE's own without a config (``TE_REDUCE_SCATTER_SMS``, 16, whatever
    the dtype). PyTorch's AsyncTP takes none: its reduce-scatter (torch/distributed/_symmetric_memory
    ``_pipelined_produce_and_all2all``) pulls each chunk from the peers' symmetric memory with a tensor copy
    between two chunk GEMMs and sums the chunks after, in one kernel, not beside the GEMM (``sim import
    torchtitan`` sets 0)."""
    if not tp_overlap_chunks(plan) or not plan.scenario.cluster.gpu.sms:
        return 0
    sms = plan.scenario.parallel.tp_comm_overlap_sms
    if sms is None and async_tp(plan):
        return 0  # its copies are cudaMemcpy's (copy engines) between chunk GEMMs: no SMs taken
    return TE_REDUCE_SCATTER_SMS if sms is None else sms


def beside_reduce_scatter(plan: Plan, seconds: float) -> float:
    """A block's row-parallel GEMM (``seconds`` on the whole GPU) on the SMs the chunked reduce-scatter beside
    it leaves (``tp_overlap_sms``; sim.hardware.sms.on_fewer_sms)."""
    held = tp_overlap_sms(plan)
    return float(on_fewer_sms(seconds, held, plan.scenario.cluster.gpu.sms or 1)) if held else seconds


def overlapped_collective(head: float, body: float, hidden_under: float) -> float:
    """Seconds a chunked TP collective adds to the compute it overlaps: its exposed first (all-gather) or last
    (reduce-scatter) chunk ``head``, plus whatever of the other chunks (``body`` seconds, run beside the GEMM)
    outlasts the ``hidden_under`` seconds of compute they run under."""
    return head + max(0.0, body - hidden_under)


def overlaps_backward(plan: Plan, column_weight_grad_seconds: float) -> bool:
    """Whether a block's fused backward issues its input-gradient reduction asynchronously under the
    column-parallel GEMM's weight gradient (Megatron-LM, with TP; a split W pass has no weight gradient there:
    under a zero-bubble schedule the B pass runs the input gradients alone and the W pass the weight gradients)."""
    return plan.tp > 1 and column_weight_grad_seconds > 0 and not plan.splits_backward


# ------------------------------------------------------------------------------------------ data parallel
def unit_params(plan: Plan, unit: int) -> float:
    """Parameters (per TP rank) of FSDP / ZeRO-3 unit ``unit`` (``plan.unit_layers`` layers), with the embedding
    in the first unit and the head in the last."""
    layers = plan.unit_layers
    params = layers * plan.dense_layer_params
    first, last = unit * layers, (unit + 1) * layers - 1
    if first == 0:
        params += embedding_params(plan.model) / plan.tp
    if last == plan.model.num_layers - 1:
        params += head_params(plan.model) / plan.tp
    return params


def unit_grad_params(plan: Plan, unit: int) -> float:
    """Parameters of unit ``unit`` that get gradients, per TP rank (what its reduce-scatter carries):
    ``unit_params`` in full training, the trainable ones under a fine-tuning method (sim.model.peft)."""
    if not plan.peft.active:
        return unit_params(plan, unit)
    layers = range(unit * plan.unit_layers, (unit + 1) * plan.unit_layers)
    params = sum(plan.layer_grad_params(layer) for layer in layers)
    if layers[0] == 0:
        params += embedding_params(plan.model) * plan.embedding_trains / plan.tp
    if layers[-1] == plan.model.num_layers - 1:
        params += head_params(plan.model) * plan.head_trains / plan.tp
    return params


def unit_weight_params(plan: Plan, unit: int) -> float:
    """Unit ``unit``'s gathered weights in compute-dtype parameters (bytes / ``plan.weight_bytes_per_param``):
    ``unit_params`` in full training; frozen weights count at their storage size (an NF4 weight ~0.26)."""
    if not plan.peft.active:
        return unit_params(plan, unit)
    layers = range(unit * plan.unit_layers, (unit + 1) * plan.unit_layers)
    params = sum(plan.layer_weight_bytes(layer) for layer in layers) / plan.weight_bytes_per_param
    if layers[0] == 0:
        params += embedding_params(plan.model) / plan.tp
    if layers[-1] == plan.model.num_layers - 1:
        params += head_params(plan.model) / plan.tp
    return params


@dataclass(frozen=True)
class ChunkUnit:
    """An FSDP unit as FSDP + PP places it (``Plan.pipelined_fsdp``): its first layer (-1: a chunk holding only
    the embedding or the head), and the parameters per TP rank its all-gather carries (compute-dtype
    equivalents, ``unit_weight_params``) and its reduce-scatter carries (``unit_grad_params``)."""

    layer: int
    weight_params: float
    grad_params: float


def chunk_units(plan: Plan, chunk: int) -> list[ChunkUnit]:
    """The FSDP units of model ``chunk`` in forward order: ``plan.unit_layers`` of its layers each, the embedding
    in the first unit of chunk 0 and the head in the last unit of the last chunk (their own unit where that
    chunk holds no transformer layer: Megatron-Core's account_for_embedding/loss_in_pipeline_split with one layer
    per chunk, as Llama 3's pipeline). Unlike ``unit_params``, the embedding and head go where their chunk is."""
    model, tp = plan.model, plan.tp
    embedding = embedding_params(model) / tp if chunk == 0 else 0.0
    head = head_params(model) / tp if chunk == plan.chunks - 1 else 0.0
    layers = plan.chunk_layers(chunk)
    if not layers:
        return [ChunkUnit(-1, embedding + head, embedding * plan.embedding_trains + head * plan.head_trains)]
    units = []
    for first in layers[::plan.unit_layers]:
        unit = first // plan.unit_layers
        weights, grads = unit_weight_params(plan, unit), unit_grad_params(plan, unit)
        if first == 0 and chunk != 0:  # the embedding is on chunk 0, which holds no layer
            weights, grads = weights - embedding_params(model) / tp, grads - embedding_params(model) / tp \
                * plan.embedding_trains
        if first + plan.unit_layers == model.num_layers and chunk != plan.chunks - 1:  # the head: the last chunk
            weights, grads = weights - head_params(model) / tp, grads - head_params(model) / tp * plan.head_trains
        units.append(ChunkUnit(first, weights, grads))
    return units


def unit_modules(plan: Plan, unit: int) -> list[tuple[float, ...]]:
    """The parameter tensors (elements per TP rank) of unit ``unit``'s leaf modules, module by module in forward
    order: the embedding in the first unit, each layer's modules (sim.model.params.layer_modules), the final
    norm and LM head in the last. They sum to ``unit_params``."""
    model, tp, layers = plan.model, plan.tp, plan.unit_layers
    first, last = unit * layers, (unit + 1) * layers - 1
    modules: list[tuple[float, ...]] = []
    if first == 0:
        modules.append((embedding_params(model) / tp,))
    modules += [module.tensors for _ in range(layers) for module in layer_modules(model, tp)]
    if last == model.num_layers - 1:
        modules.append((head_params(model) / tp,))
    return modules


def gather_calls(plan: Plan, unit: int) -> tuple[float, ...]:
    """Parameters (per TP rank) of each all-gather that brings unit ``unit``'s weights, in issue order.

    FSDP (and ``parallel.zero: 3`` without a DeepSpeed block): one all-gather of the unit's flat parameter.
    DeepSpeed ZeRO-3 (``plan.deepspeed``): per leaf module, leaving out the parameters of at most
    ``stage3_param_persistence_threshold`` elements (kept whole on every rank), consecutive modules coalesced into
    one all-gather until it holds ``stage3_prefetch_bucket_size`` elements, as the prefetcher fills its bucket
    (partitioned_param_coordinator.py fetch_sub_module; a module is never split, and a bucket of 0 fetches module
    by module). Buckets do not run across units here (DeepSpeed's prefetch queue does)."""
    ds = plan.deepspeed
    if ds is None:
        return (unit_weight_params(plan, unit),)
    calls, pending = [], 0.0
    for tensors in unit_modules(plan, unit):
        gathered = sum(n for n in tensors if n > ds.stage3_param_persistence_threshold)
        if gathered <= 0:
            continue
        pending += gathered
        if pending >= ds.stage3_prefetch_bucket_size:
            calls.append(pending)
            pending = 0.0
    if pending > 0:
        calls.append(pending)
    return tuple(calls)


def reduce_buckets(plan: Plan) -> list[tuple[int, float]]:
    """The gradient reduce-scatters of one micro-batch's backward under ZeRO-3 / FSDP, in issue order: (the layer
    whose backward issues it, parameters per TP rank). FSDP: one per unit, after its first layer's backward.
    DeepSpeed ZeRO-3: gradients join a bucket module by module as the backward produces them (reverse forward
    order), and the bucket is reduced when the next module's gradients would take it past ``reduce_bucket_size``
    elements (stage3.py reduce_independent_p_g_buckets_and_remove_grads: ``elements_in_ipg_bucket + numel >
    reduce_bucket_size``); the rest after the last layer (with the embedding's). Issued at the end of the layer
    whose module overflowed the bucket (the emitters run a layer's backward as one piece)."""
    units = plan.model.num_layers // plan.unit_layers
    ds = plan.deepspeed
    if ds is None:
        return [(unit * plan.unit_layers, unit_grad_params(plan, unit)) for unit in reversed(range(units))]
    buckets, pending = [], 0.0
    for unit in reversed(range(units)):
        for tensors in reversed(unit_modules(plan, unit)):
            numel = sum(tensors)
            if pending > 0 and pending + numel > ds.reduce_bucket_size:
                buckets.append((unit * plan.unit_layers, pending))
                pending = 0.0
            pending += numel
    buckets.append((0, pending))
    return buckets


def head_gradient_params(plan: Plan, stage: int) -> float:
    """Parameters whose gradients become final with the head's on ``stage`` (0 elsewhere): the head and, with
    tied embeddings on another stage, its copy of the word embeddings (both on ``plan.head_stage``)."""
    if not plan.holds_head(stage):
        return 0.0
    tied = plan.model.vocab_size * plan.model.hidden_size if plan.tied_copy(stage) else 0
    return (head_params(plan.model) + tied) / plan.tp * plan.head_trains


def embedding_gradient_params(plan: Plan, stage: int) -> float:
    """Parameters of the input embedding on ``stage`` (0 elsewhere), per TP rank."""
    return embedding_params(plan.model) / plan.tp * plan.embedding_trains if plan.holds_embedding(stage) else 0.0


def stage_layer_ids(plan: Plan, stage: int) -> list[int]:
    """The transformer layers ``stage`` holds, chunk by chunk in model order."""
    return plan.stage_layer_ids(stage)


def gradient_bytes(plan: Plan, stage: int) -> dict[int, float]:
    """Gradient bytes that become final together on a rank of ``stage``, keyed by layer: each layer's, with the
    head's (and a tied-embedding copy's) joining the stage's last layer (the head's backward runs just before
    it), and the input embedding's under key -1 (its backward runs after layer 0's)."""
    layers = stage_layer_ids(plan, stage)
    if plan.is_moe:  # dense parameters only: a MoE layer's routed experts reduce over edp (expert_gradient_bytes)
        sizes = {layer: plan.layer_params(layer) * plan.grad_bytes_per_param for layer in layers}
    else:  # the parameters that train (all of them in full training; sim.model.peft)
        sizes = {layer: plan.layer_grad_params(layer) * plan.grad_bytes_per_param for layer in layers}
    head = head_gradient_params(plan, stage)
    if head:
        sizes[max(layers)] += head * plan.grad_bytes_per_param
    embedding = embedding_gradient_params(plan, stage)
    if embedding:
        sizes[-1] = embedding * plan.grad_bytes_per_param
    return sizes


def expert_gradient_bytes(plan: Plan, stage: int) -> dict[int, float]:
    """Routed-expert gradient bytes of each MoE layer on a rank of ``stage``, keyed by layer (empty for a dense
    model). Megatron-Core keeps them in their own buffer, bucketed and reduced over the expert-data-parallel
    group (distributed_data_parallel.py: expert_parallel_buffers, with the expert DP group)."""
    if not plan.is_moe:
        return {}
    per_layer = plan.expert_params_per_layer * plan.grad_bytes_per_param
    return {layer: per_layer for layer in stage_layer_ids(plan, stage) if plan.moe_layers[layer]}


def expert_reduces(plan: Plan) -> bool:
    """Whether expert gradients are reduced at all: there is more than one expert-data-parallel rank."""
    return plan.is_moe and plan.edp > 1


def bucket_full(plan: Plan, pending_bytes: float) -> bool:
    """Whether a gradient bucket holding ``pending_bytes`` is reduced now: it reached ``parallel.dp_bucket_size``
    (PyTorch DDP's bucket_cap_mb, DeepSpeed's reduce_bucket_size). The last gradients close a bucket anyway."""
    return pending_bytes >= plan.scenario.parallel.dp_bucket_size


def group_buckets(plan: Plan, ready: list[tuple[int, float]]) -> list[tuple[list[int], float]]:
    """(layer, bytes) in the order gradients become final, grouped until a bucket is full (``bucket_full``) or
    the gradients run out. Returns each bucket's layers, in that order, and its bytes."""
    buckets: list[tuple[list[int], float]] = []
    layers: list[int] = []
    pending = 0.0
    for index, (layer, nbytes) in enumerate(ready):
        layers.append(layer)
        pending += nbytes
        if bucket_full(plan, pending) or index == len(ready) - 1:
            buckets.append((layers, pending))
            layers, pending = [], 0.0
    return buckets


def fill_buckets(plan: Plan, ready: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """DDP / ZeRO-1 gradient buckets (``group_buckets``). Returns (the layer that closes each bucket, its bytes)."""
    return [(layers[-1], nbytes) for layers, nbytes in group_buckets(plan, ready)]


def chunk_gradient_bytes(plan: Plan, stage: int) -> list[tuple[list[int], float]]:
    """Megatron-LM without --overlap-grad-reduce (``parallel.overlap_grad_reduce: false``): DDP's bucket_size is
    None, so each model chunk's gradient buffer is one bucket, reduced after the whole backward (core_r0.8
    distributed_data_parallel.py). Returns, per local chunk in order, its layers (-1: the embedding) and bytes."""
    sizes = gradient_bytes(plan, stage)
    out = []
    for chunk in plan.stage_chunks[stage]:
        layers = list(plan.chunk_layers(chunk)) + ([-1] if -1 in sizes and 0 in plan.chunk_layers(chunk) else [])
        out.append((layers, sum(sizes[layer] for layer in layers)))
    return out


def overlaps_param_gather(plan: Plan) -> bool:
    """Whether ZeRO-1/2's weight all-gather runs per bucket under the next step's forward
    (``parallel.overlap_param_gather``: Megatron-LM --overlap-param-gather, NeMo/Apex overlap_param_sync)."""
    return (plan.scenario.parallel.overlap_param_gather and plan.data_parallel and plan.zero_stage in (1, 2)
            and not plan.gathers_units)


@dataclass(frozen=True)
class GatherBucket:
    """One bucket of the distributed optimizer's weight all-gather: its layers in forward order (-1: the input
    embedding; the head's weights go with the last layer), the local model chunk holding them, and its bytes."""

    layers: tuple[int, ...]
    chunk: int
    nbytes: float


def param_gather_buckets(plan: Plan, stage: int) -> list[GatherBucket]:
    """The weight all-gathers of ``stage`` in the order the forward needs them, under ``overlaps_param_gather``
    (else none). Megatron-LM's buckets are the gradient buckets (param_and_grad_buffer.py: one buffer per model
    chunk, parameters taken in reverse order, a bucket closed once it holds bucket_size; Apex
    DistributedFusedAdam the same with bucket_cap_mb), so they are filled in backward order per chunk and
    gathered in reverse (distrib_optimizer.py _get_model_param_buffer_dp_views: "all-gathers to run first for
    the start of the model"): the first bucket the forward reads holds the remainder. Bytes are the updated
    compute-dtype weights of the bucket's parameters, summing to the stage's ``final_weight_gather_bytes``."""
    if not overlaps_param_gather(plan):
        return []
    sizes = gradient_bytes(plan, stage)
    per_grad_byte = plan.weight_bytes_per_param / plan.grad_bytes_per_param
    out = []
    for local, chunk in enumerate(plan.stage_chunks[stage]):
        layers = plan.chunk_layers(chunk)
        ready = [(layer, sizes[layer]) for layer in reversed(layers)]
        if -1 in sizes and 0 in layers:
            ready.append((-1, sizes[-1]))
        out += [GatherBucket(tuple(reversed(members)), local, nbytes * per_grad_byte)
                for members, nbytes in reversed(group_buckets(plan, ready))]
    return out


def final_weight_gather_bytes(plan: Plan, stage: int) -> float:
    """ZeRO-1/2 (Megatron's distributed optimizer, DeepSpeed): after the sharded step every rank all-gathers the
    updated compute-dtype weights of its stage over the DP group; 0 where nothing is gathered, FSDP's
    SHARD_GRAD_OP included (its weights stay sharded at rest; the next forward gathers them unit by unit), and
    under ``overlaps_param_gather`` (the gather moves to the next forward, bucket by bucket:
    ``param_gather_buckets``)."""
    if plan.data_parallel and plan.zero_stage in (1, 2) and not plan.gathers_units and not overlaps_param_gather(plan):
        return plan.stage_trainable_params(stage) * plan.weight_bytes_per_param
    return 0.0


def expert_weight_gather_bytes(plan: Plan, stage: int) -> float:
    """The distributed optimizer's all-gather of the updated expert weights over the expert-data-parallel group
    after the step (0 without ZeRO-1, a dense model or edp = 1, and under ``overlaps_param_gather``: the gather
    moves to the next forward, bucket by bucket: ``expert_param_gather_buckets``)."""
    if expert_reduces(plan) and plan.zero_stage == 1 and not overlaps_param_gather(plan):
        return plan.stage_expert_params(stage) * plan.weight_bytes_per_param
    return 0.0


def expert_param_gather_buckets(plan: Plan, stage: int) -> list[GatherBucket]:
    """The expert weights' all-gathers over the expert-data-parallel group under ``overlaps_param_gather``, in
    the order the forward needs them (else none). Megatron-Core's DDP chains the expert buffers' bucket groups for
    the overlapped gather exactly as the dense ones (distributed_data_parallel.py: ``for all_bgs in
    [self.bucket_groups, self.expert_parallel_bucket_groups]`` sets ``next_param_gather_bucket_group``;
    ``param_to_bucket_group`` maps expert parameters too, so the forward pre-hook waits for their bucket, and
    ``start_param_sync`` dispatches both lists): per model chunk, expert gradients bucketed in backward order
    (``expert_gradient_bytes``, ``group_buckets``), gathered in reverse. Bytes are the updated compute-dtype
    expert weights, summing to what ``expert_weight_gather_bytes`` gathers after the step without the overlap."""
    if not (overlaps_param_gather(plan) and expert_reduces(plan) and plan.zero_stage == 1):
        return []
    sizes = expert_gradient_bytes(plan, stage)
    per_grad_byte = plan.weight_bytes_per_param / plan.grad_bytes_per_param
    out = []
    for local, chunk in enumerate(plan.stage_chunks[stage]):
        ready = [(layer, sizes[layer]) for layer in reversed(plan.chunk_layers(chunk)) if layer in sizes]
        out += [GatherBucket(tuple(reversed(members)), local, nbytes * per_grad_byte)
                for members, nbytes in reversed(group_buckets(plan, ready))]
    return out


def optimizer_params(plan: Plan, stage: int) -> float:
    """Parameters one rank of ``stage`` updates in the optimizer step (its shard under ZeRO; a MoE model's
    expert parameters sharded over the expert-data-parallel group)."""
    if plan.is_moe:
        return (plan.stage_params(stage) / plan.optimizer_shards
                + plan.stage_expert_params(stage) / plan.expert_optimizer_shards)
    return plan.stage_trainable_params(stage) / plan.optimizer_shards


def copy_gradient_reduce(plan: Plan, rank: int) -> tuple[float, tuple[int, ...]] | None:
    """DualPipe's two model copies (the ``dual`` layout): rank i holds chunk i of one copy and chunk p-1-i of the
    other, rank p-1-i (same TP and DP index) the same two chunks the other way round, so the two ranks sum their
    whole gradient buffers before the optimizer step, as DualPipe's example sums each parameter's gradient with
    its copy's (examples/example_dualpipe.py). Returns (bytes, group) of that all-reduce: the gradients the
    optimizer updates (its ZeRO shard); None in the other layouts."""
    if plan.layout != "dual":
        return None
    grid = plan.grid
    here = grid.coord(rank)
    partner = grid.rank(here.tp, here.dp, plan.pp - 1 - here.pp, here.cp)
    return optimizer_params(plan, here.pp) * plan.grad_bytes_per_param, tuple(sorted((rank, partner)))


# One fp32 scalar: the global gradient norm, or the found-inf flag of the loss-scale check.
GRAD_STAT_BYTES = 4.0


def grad_checks(plan: Plan, stage: int) -> list[tuple[str, float]]:
    """(name, HBM bytes) of the kernels Megatron-LM's optimizer runs over the gradients a rank of ``stage``
    updates before its step, each followed by an all-reduce of ``GRAD_STAT_BYTES`` over ``grad_stats_group``
    (megatron/core/optimizer/optimizer.py, MixedPrecisionOptimizer.step; docs/mechanisms/grad_clip.md):
    - fp16: unscale the gradients and check them for inf/nan (torch._amp_foreach_non_finite_check_and_unscale_,
      in place: one read and one write), then all-reduce the found-inf flag (MAX);
    - ``training.clip_grad`` > 0: the global L2 norm (multi_tensor_l2norm: one read), then all-reduce its square
      (SUM). Scaling the gradients by clip/norm happens only on steps whose norm exceeds the threshold, a fact
      of the data, and is left out.
    None under CPU offload (the host owns the optimizer there)."""
    if plan.scenario.offload.optimizer:
        return []
    grads = optimizer_params(plan, stage) * plan.grad_bytes_per_param
    checks = [("grad_unscale_check", 2.0 * grads)] if plan.dtype == "fp16" else []
    if plan.scenario.training.clip_grad > 0:
        checks.append(("grad_norm", grads))
    return checks


def grad_stats_group(plan: Plan, rank: int) -> tuple[int, ...]:
    """The ranks a gradient statistic is all-reduced over (MegatronOptimizer.get_grad_stats_parallel_group): the
    model-parallel group (every TP and PP rank of ``rank``'s data-parallel index), or every rank when the optimizer
    is sharded (the distributed optimizer; ZeRO and FSDP likewise reduce the norm over all shards)."""
    grid = plan.grid
    if plan.optimizer_shards > 1:
        return _every_rank(grid.world_size)
    here = grid.coord(rank)
    return tuple(sorted(grid.rank(t, here.dp, p, here.cp) for p in range(plan.pp) for t in range(plan.tp)))


@lru_cache(maxsize=8)
def _every_rank(world_size: int) -> tuple[int, ...]:
    """``tuple(range(world_size))``, made once: every stage's optimizer step names the whole world (98,304 ranks
    for the frontier scenario: 32 stages each built it anew, about 0.08 of a run's CPU seconds)."""
    return tuple(range(world_size))


def pcie_seconds(plan: Plan, nbytes: float) -> float:
    """A host <-> GPU copy over the node's PCIe link: latency + bytes / effective rate."""
    pcie = plan.scenario.cluster.pcie
    return p2p_time(nbytes, pcie.latency, pcie.effective_bandwidth)


def activation_copy_seconds(plan: Plan, layer: int) -> float:
    """Activation offload: one PCIe copy of ``layer``'s activations of one micro-batch (to the host after its
    forward, back before its backward; Transformer Engine's CPU offload handler copies every saved tensor of the
    layer, which is what the layer stashes)."""
    return pcie_seconds(plan, plan.stash_bytes(layer))


def offload_buffer_copy_seconds(plan: Plan, layer: int, costs: CostModel) -> float:
    """Activation offload: the on-GPU copy of ``layer``'s saved tensors into Transformer Engine's ping-pong buffer
    before the PCIe copy, on the compute stream (TE 1.x ``AsyncDoubleBufferGroupOffloadHandler.tensor_push``:
    ``tensor_buf.copy_(tensor)`` as each tensor is saved): the stash read and written once through HBM, priced as
    one memory-bound kernel (one per saved tensor in TE; their launches overlap the layer's own kernels)."""
    return costs.memory_time(2 * plan.stash_bytes(layer))


def host_adam_seconds(plan: Plan, params: float) -> float:
    """ZeRO-Offload's Adam on the host: the step's bytes per parameter (sim.costs.models) over the host memory
    bandwidth a GPU gets (``offload.host_bandwidth``)."""
    return ADAM_BYTES_PER_PARAM * params / plan.scenario.offload.host_bandwidth


def weights_to_gpu_bytes(plan: Plan, params: float) -> float:
    """Bytes of updated compute-dtype weights copied back to the GPU after the host step."""
    return params * plan.weight_bytes_per_param
