"""Megatron's tensor-parallel collectives around a layer's blocks and the loss, and when the backward hides one.

In: a ``Plan`` (tp, sequence parallelism, ``training.cross_entropy``, a split backward) and, for the backward, the
column-parallel GEMM's weight-gradient seconds. Out:
- ``tp_ops``: the collective before and after each block, each of ``Plan.tp_bytes`` (Narayanan et al. SC21 Sec. 2.3:
  all-reduce; with sequence parallelism all-gather before and reduce-scatter after, Korthikanti et al. 2022
  Sec. 4.2.2);
- ``loss_collectives``: the loss's TP collectives in the head's forward (Megatron's unfused cross entropy);
- ``overlaps_backward``: whether a block's backward runs Megatron's asynchronous input-gradient reduction under its
  weight-gradient GEMM (LinearWithGradAccumulationAndAsyncCommunication);
- ``regathers_after_input_grad``: whether, instead, SP's second all-gather of the block's input runs exposed between
  its input- and weight-gradient GEMMs (more than one CUDA hardware queue).
The same collectives split into chunks beside their GEMMs are sim.workload.tp_overlap's.
"""

from __future__ import annotations

from sim.hardware.gpus import BLACKWELL
from sim.model.vocab_ops import loss_tp_collectives
from sim.plan import Plan
from sim.workload.tp_overlap import tp_overlap_chunks


def loss_collectives(plan: Plan) -> tuple[tuple[str, float], ...]:
    """The loss's TP collectives in the head's forward, (op, bytes) in issue order, each blocking the compute that
    follows (the next kernel reads its result): Megatron's unfused loss all-reduces three [tokens] fp32 vectors
    (sim.model.vocab_ops.loss_tp_collectives); none for the other ``training.cross_entropy`` values."""
    return loss_tp_collectives(plan.micro_batch * plan.local_seq_len, plan.tp, plan.scenario.training.cross_entropy)


def tp_ops(plan: Plan) -> tuple[str | None, str | None]:
    """(collective before a block, collective after it) of Megatron's TP, each of ``plan.tp_bytes``; None where
    there is none (no TP, or no all-gather without sequence parallelism)."""
    if plan.tp == 1:
        return None, None
    return ("all_gather", "reduce_scatter") if plan.sequence_parallel else (None, "all_reduce")


def overlaps_backward(plan: Plan, column_weight_grad_seconds: float) -> bool:
    """Whether a block's fused backward issues its input-gradient reduction asynchronously under the
    column-parallel GEMM's weight gradient (Megatron-LM, with TP; a split W pass has no weight gradient there:
    under a zero-bubble schedule the B pass runs the input gradients alone and the W pass the weight gradients).
    Only with CUDA_DEVICE_MAX_CONNECTIONS = 1 (``Plan.cuda_device_max_connections``): Megatron relies on the one
    hardware queue to launch the asynchronous collective before the GEMM it hides under (tensor_parallel/layers.py:
    "Here we rely on CUDA_DEVICE_MAX_CONNECTIONS=1 to ensure that the reduce scatter is scheduled before the weight
    gradient computation"); with more queues the GEMM, issued after it, takes the SMs first and the collective runs
    after it (``_launch_ordered``)."""
    return (plan.tp > 1 and column_weight_grad_seconds > 0 and not plan.splits_backward
            and _launch_ordered(plan))


def regathers_after_input_grad(plan: Plan, column_weight_grad_seconds: float) -> bool:
    """Whether a block's backward runs serially, input-gradient GEMM -> SP's second all-gather of the block's input
    -> weight-gradient GEMM -> the input-gradient reduce-scatter: Megatron's linear backward issues the same
    collectives asynchronously (the gather before the input-gradient GEMM, the reduce-scatter before the weight
    gradient), but with more than one hardware queue nothing launches them before the GEMMs (``overlaps_backward``
    false for that reason alone), so each runs after the GEMM it would have hidden under. Without sequence
    parallelism there is no second gather and the all-reduce simply follows the block."""
    return (plan.tp > 1 and plan.sequence_parallel and column_weight_grad_seconds > 0 and not plan.splits_backward
            and not _launch_ordered(plan))


def _launch_ordered(plan: Plan) -> bool:
    """Whether a backward's TP collectives start before the GEMMs issued after them: with one CUDA hardware queue
    (Megatron's NCCL collectives, ``overlaps_backward``); whatever the queues on Blackwell (``BLACKWELL``, where
    Megatron-LM drops the one-queue requirement and TE orders no launches: that ordering is "only for Hopper, which
    uses persistent CTA execution"); or whatever the queues under chunked TP collectives
    (``tp_overlap_chunks`` > 0), which order their own launches: TE's userbuffers make the comm kernel wait on
    ``_comm_launch_event`` when CUDA_DEVICE_MAX_CONNECTIONS > 1 so that it is scheduled before the GEMM
    (TransformerEngine common/comm_gemm_overlap/comm_gemm_overlap.cpp, "Fast Dependent Launch"; Hopper, CUDA >=
    12.3; tests/pytorch/distributed/test_comm_gemm_overlap.py runs the bulk overlaps at 8 queues), and AsyncTP's
    fused ops move the shards with copy engines, not SMs."""
    return (plan.cuda_device_max_connections == 1 or plan.scenario.cluster.gpu.name in BLACKWELL
            or tp_overlap_chunks(plan) > 0)
