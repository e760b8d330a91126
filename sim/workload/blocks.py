"""A layer's work on one TP rank for one micro-batch: its blocks' op tuples, shared by the emitters and the estimate.

In: a ``Plan``. Out, with no task graph and no clock:
- ``layer_shape``: the per-rank shape and kernel options every layer op builder reads (sim.model.layer_shape), with
  FP8's cast kernels (``fp8_casts``);
- ``Blocks`` (``blocks``): the work of one layer's two blocks (``BLOCKS``: attention, MLP), the column-parallel GEMMs
  of each (whose weight gradient hides Megatron's asynchronous input-gradient reduction), the row-parallel GEMM, what
  selective recomputation replays before each block's backward (``replayed``), the embedding and head, and under
  TE's userbuffers / AsyncTP each block with the GEMMs beside its chunked collectives split per chunk
  (sim.workload.tp_overlap); under context parallelism the attention block on the rank's s/cp tokens
  (``cp_attention_ops``); LoRA/QLoRA's adapters and FSDP1's gradient kernels (sim.workload.fsdp_units) included;
- ``frozen_layer_blocks``: the same blocks of a frozen layer (``training.method: frozen``).
The emitters (sim.workload.task_emit and the modules above it) turn them into tasks; the estimate
(sim.explore.estimate) prices them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sim.costs.models import Work
from sim.model.attention_ops import attention_forward_ops
from sim.model.fp8_casts import Fp8Casts
from sim.model.layer_ops import RECOMPUTE_OPS, layer_forward_ops
from sim.model.layer_shape import LayerShape
from sim.model.ops import COLUMN_PARALLEL, ROW_PARALLEL, Op
from sim.model.peft import adapt_layer_ops, frozen
from sim.model.vocab_ops import embedding_forward_ops, head_forward_ops
from sim.parallel.context import executed_share
from sim.plan import Plan
from sim.workload.fsdp_units import fsdp_grad_ops
from sim.workload.tp_overlap import chunk_gemms, tp_overlap_chunk_gemms, tp_overlap_chunks

BLOCKS = ("attention", "mlp")  # a layer's forward order; the backward runs them reversed


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


def replayed(ops: tuple[Op, ...], modules: frozenset[str]) -> tuple[Op, ...]:
    """The ops of ``ops`` that selective recomputation of ``modules`` runs again, in forward order
    (``sim.model.layer_ops.RECOMPUTE_OPS``)."""
    names = frozenset().union(*(RECOMPUTE_OPS[module] for module in modules))
    return tuple(op for op in ops if op.name in names)


def cp_attention_ops(plan: Plan, shape: LayerShape) -> tuple[Op, ...]:
    """A layer's attention block on one CP rank (``shape``: ``layer_shape(plan)``, its s/cp tokens): its s/cp
    queries against all s keys, the flash kernel executing the blocks ``sim.parallel.context.executed_share``
    counts (the causal tile rule per chunk)."""
    share = executed_share(plan.seq_len, plan.cp, plan.cp_comm_type, shape.causal)
    return attention_forward_ops(shape, kv_seq_len=plan.seq_len, executed=share)
