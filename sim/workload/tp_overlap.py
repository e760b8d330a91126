"""TP collectives in chunks beside their GEMMs: Transformer Engine's userbuffers and PyTorch's AsyncTP.

In: a ``Plan`` (``parallel.tp_comm_overlap`` and its chunks, method, SMs and chunk-GEMM flag; sequence
parallelism; the GPU's SMs), a block's ops, and for the seconds a cost model or the pieces' seconds. Out: how many
chunks a block's all-gather and reduce-scatter are split into (``tp_overlap_chunks``), whether they are AsyncTP's
(``async_tp``) and its GEMMs issued one per chunk (``tp_overlap_chunk_gemms``, ``chunk_gemms``), AsyncTP's shard
copy and partials' reduction (``shard_copy_seconds``, ``reduce_partials_bytes`` / ``_seconds``), the fused
collectives' closed forms (``fused_gather_seconds``, ``fused_scatter_seconds``), the SMs the chunked
reduce-scatter takes from the GEMM beside it (``tp_overlap_sms``, ``beside_reduce_scatter``) and what a chunked
collective adds to the compute it overlaps (``overlapped_collective``). docs/mechanisms/tp_comm_overlap.md.
"""

from __future__ import annotations

from dataclasses import replace

from sim.costs.models import CostModel
from sim.hardware.sms import on_fewer_sms
from sim.model.ops import COLUMN_PARALLEL, ROW_PARALLEL, Op
from sim.plan import Plan


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
