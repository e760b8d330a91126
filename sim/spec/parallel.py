"""The ``parallel:`` section of a scenario: the parallel degrees and how their communication is issued.

In: the ``parallel:`` mapping: tp, pp, dp, vpp, cp and its attention exchange, MoE's ep and etp, sequence
parallelism, uneven first and last pipeline stages, the ZeRO stage, DDP's gradient buckets, and the overlap
switches (TP collectives in chunks under their GEMMs, pipeline sends, gradient reduction, the weight all-gather).
Out: a frozen ``ParallelSpec`` with every default filled; ``dp`` left unset is implied by ``sim.spec.degrees``
(GPUs / (tp*cp*pp)), and the rules across fields and sections (degrees dividing the cluster, the layers, the
heads) are ``sim.spec.rules_layout``'. ``MiB``: 2**20 bytes, the unit of DDP's default bucket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from sim.hardware.frozen import FrozenSpec
from sim.units import Bytes

if TYPE_CHECKING:
    from sim.spec.scenario import Scenario

MiB = 2**20
# CUDA_DEVICE_MAX_CONNECTIONS where the scenario leaves it unset: one queue, Megatron-LM's setting under tensor or
# context parallelism (arguments.py asserts it before Blackwell), and 32 under the EP A2A overlap, which needs
# more than one (Megatron-Core's MoE README; the MoE ModelZoo's configs set 32 for it).
ONE_QUEUE, A2A_OVERLAP_QUEUES = 1, 32


class ParallelSpec(FrozenSpec):
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    dp: int | None = Field(default=None, ge=1, description="default: GPUs / (tp*cp*pp)")
    vpp: int = Field(default=1, ge=1, description="model chunks per pipeline stage (interleaved schedule)")
    sequence_parallel: bool = False
    first_stage_layers: int | None = Field(default=None, ge=1, description="layers of the first pipeline stage, "
                                           "when it differs (Megatron's --decoder-first-pipeline-num-layers)")
    last_stage_layers: int | None = Field(default=None, ge=1, description="layers of the last pipeline stage "
                                          "(--decoder-last-pipeline-num-layers); the rest split evenly")
    account_for_embedding_in_pipeline_split: bool = Field(default=False, description=(
        "Megatron-Core's flag of that name: the input embedding counts as one layer when the layers are split "
        "evenly over the pp*vpp model chunks, so the first chunk holds one transformer layer fewer (none if "
        "chunks hold one: the embedding alone, as in Llama 3's pipeline)"))
    account_for_loss_in_pipeline_split: bool = Field(default=False, description=(
        "the same for the output layer and loss: the last model chunk holds one transformer layer fewer"))
    zero: int = Field(default=0, ge=0, le=3, description="ZeRO stage: 1 optimizer, 2 + gradients, 3 + weights")
    ep: int = Field(default=1, ge=1, description=(
        "expert parallelism (Megatron-Core --expert-model-parallel-size): a MoE layer's routed experts split over "
        "ep ranks, folded over the tp x dp ranks of a pipeline stage (MoE parallel folding)"))
    etp: int | None = Field(default=None, ge=1, description=(
        "expert tensor parallelism (--expert-tensor-parallel-size): each expert's FFN split over etp ranks; "
        "default tp, as Megatron-Core (expert_tensor_parallel_size None -> tensor_model_parallel_size)"))
    cp: int = Field(default=1, ge=1, description=(
        "context parallelism (Megatron-LM --context-parallel-size, TorchTitan context_parallel_degree): each "
        "sequence split over cp ranks in 2*cp load-balanced chunks; dp = GPUs / (tp*cp*pp); docs/mechanisms/"
        "context_parallel.md"))
    cp_comm_type: Literal["p2p", "all_gather", "a2a"] = Field(default="p2p", description=(
        "how attention sees the other ranks' keys and values (Megatron-LM --cp-comm-type): p2p, Transformer "
        "Engine's ring attention; all_gather, an all-gather of K and V before attention (Llama 3); a2a, "
        "DeepSpeed Ulysses' all-to-all of q, k, v (heads scattered) and of the output"))
    # PyTorch DDP's default bucket_cap_mb = 25.
    dp_bucket_size: Bytes = Field(default=25 * MiB, gt=0)
    grad_bucket_view: bool = Field(default=False, description="DDP gradient_as_bucket_view: grads live in the "
                                   "buckets (else the buckets are a second copy of the gradients, torch's default)")
    tp_comm_overlap: bool = Field(default=False, description=(
        "false: a TP collective blocks the compute stream in issue order (Megatron-LM's synchronous all-reduce / "
        "reduce-scatter); true: only its consumer waits, and with sequence parallelism each block's all-gather "
        "and reduce-scatter run in chunks under the GEMM beside them (Transformer Engine's userbuffers: NeMo "
        "ub_tp_comm_overlap, Megatron-LM --tp-comm-overlap; TorchTitan's async TP), only one chunk exposed; "
        "docs/mechanisms/tp_comm_overlap.md"))
    tp_comm_overlap_chunks: int | None = Field(default=None, ge=1, description=(
        "with tp_comm_overlap and sequence parallelism: the chunks a TP collective is split into under its GEMM; "
        "default tp (TE's ring exchange moves one shard per peer; the pipelined reduce-scatter's num_splits is 4 "
        "in NeMo's H100 userbuffers configs); 1: not split, the whole collective exposed"))
    tp_comm_overlap_method: Literal["userbuffers", "async_tp"] = Field(default="userbuffers", description=(
        "with chunked TP collectives: whose implementation runs them. userbuffers (default): Transformer Engine's "
        "(NeMo, Megatron-LM); async_tp: PyTorch's micro-pipelined TP (TorchTitan enable_async_tensor_parallel: "
        "torch.distributed._symmetric_memory), whose reduce-scatter leaves the tp partial sums of each shard to one "
        "reduction kernel after its chunks (priced on HBM, exposed), whose GEMMs are issued one per chunk and whose "
        "copies take no SMs (the defaults of tp_comm_overlap_chunk_gemms and tp_comm_overlap_sms follow); "
        "docs/mechanisms/tp_comm_overlap.md"))
    tp_comm_overlap_chunk_gemms: bool | None = Field(default=None, description=(
        "with chunked TP collectives (tp_comm_overlap_chunks > 1): true prices the GEMMs beside them as one GEMM "
        "per chunk, each at its own size on the cost model's GEMM curve (TE's ring exchange and pipelined "
        "reduce-scatter, PyTorch AsyncTP's fused_all_gather_matmul / fused_matmul_reduce_scatter issue one per "
        "chunk); false: priced as one GEMM. Default by tp_comm_overlap_method: false for userbuffers (on the "
        "measured rows the chunk GEMMs made the NeMo rows slower than measured), true for async_tp (one torch.mm "
        "per shard in its Python loop; docs/mechanisms/tp_comm_overlap.md)"))
    tp_comm_overlap_sms: int | None = Field(default=None, ge=0, description=(
        "with chunked TP collectives: SMs the reduce-scatter after a block's row-parallel GEMM takes from that GEMM "
        "(Transformer Engine's num_sm with set_sm_margin: the GEMM runs on the rest; 0 without the margin); default "
        "TE's own when no userbuffers config names it, 16 (what Megatron-LM's --tp-comm-overlap without "
        "--tp-comm-overlap-cfg runs; NeMo's H100 configs take 20 in bf16, proj_fprop 24 / fc2_fprop 16, and 1 in fp8, "
        "a ring exchange); 0 for PyTorch's AsyncTP, whose reduce-scatter copies chunks between GEMMs and sums them "
        "after (sim import torchtitan sets it); needs cluster.gpu.sms; docs/mechanisms/tp_comm_overlap.md"))
    overlap_p2p_comm: bool = Field(default=False, description=(
        "false: a stage's next compute waits for its pipeline send to complete (Megatron-LM's _communicate waits on "
        "every batched isend/irecv request before returning; always so in the non-interleaved 1F1B schedule); "
        "true: only the receiver waits (Megatron's --overlap-p2p-communication, interleaved schedule)"))
    cuda_device_max_connections: int | None = Field(default=None, ge=1, description=(
        "CUDA_DEVICE_MAX_CONNECTIONS: the hardware work queues the process's CUDA streams share. 1 (Megatron-LM's "
        "setting with tp > 1, arguments.py): kernels launch in issue order, so the TP collectives Megatron's "
        "linear backward issues asynchronously (SP's input all-gather before the input-gradient GEMM, the "
        "input-gradient reduce-scatter or all-reduce before the weight-gradient GEMM) start first and run under "
        "those GEMMs; > 1: nothing launches them before the GEMMs ('necessary for a speedup', megatron/core/"
        "tensor_parallel/layers.py), so each runs after the GEMM it would hide under, exposed (before Blackwell, "
        "and not for tp_comm_overlap's chunked collectives, which order their own launches). None: 32 with "
        "moe.a2a_overlap (Megatron-Core's EP A2A overlap needs > 1: its MoE README; the MoE ModelZoo's configs "
        "set 32 for it), else 1. docs/mechanisms/a2a_overlap.md"))
    overlap_grad_reduce: bool = Field(default=True, description=(
        "DDP / ZeRO-1: true: a gradient bucket is reduced as soon as its gradients are final in the last "
        "micro-batch's backward (PyTorch DDP; Megatron-LM --overlap-grad-reduce; NeMo overlap_grad_sync); false: "
        "one reduction per model chunk after the whole backward (Megatron-LM's default: bucket_size None). "
        "ZeRO-2/3: false runs each reduce-scatter on the compute stream, so the backward waits for it (DeepSpeed "
        "overlap_comm false, the default at stages 1-2; a zero_optimization block sets it). "
        "docs/mechanisms/distributed_optimizer.md"))
    overlap_param_gather: bool = Field(default=False, description=(
        "ZeRO-1/2 (Megatron's distributed optimizer): the updated weights are all-gathered per gradient bucket "
        "under the next step's forward, each layer's forward waiting for its bucket (Megatron-LM "
        "--overlap-param-gather, NeMo/Apex overlap_param_sync); false: one all-gather after the optimizer step"))
    align_param_gather: bool = Field(default=False, description=(
        "with overlap_param_gather: every bucket's all-gather is issued at the step start (Megatron-LM core "
        "0.9+'s default, --no-align-param-gather turns it off); false: the next bucket's all-gather is issued when "
        "the forward reaches the previous bucket (Megatron core_r0.8 and Apex DistributedFusedAdam)"))


def cuda_device_max_connections(s: Scenario) -> int:
    """The CUDA_DEVICE_MAX_CONNECTIONS a scenario is priced at: ``parallel.cuda_device_max_connections`` where
    given, else 32 under ``moe.a2a_overlap`` and 1 otherwise (docs/mechanisms/a2a_overlap.md). The one rule the
    Plan (``Plan.cuda_device_max_connections``) and the launch scripts ``sim search --emit megatron`` writes
    (its export) both read. ``moe.a2a_overlap`` alone decides: the rules refuse it on a dense model (a
    ``moe`` section other than the default) and without expert parallelism (sim.spec.rules_moe), so on a valid
    scenario it implies a MoE model with ep > 1."""
    given = s.parallel.cuda_device_max_connections
    if given is not None:
        return given
    return A2A_OVERLAP_QUEUES if s.moe.a2a_overlap else ONE_QUEUE
