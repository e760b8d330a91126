"""Megatron's tensor-parallel collectives around a layer's blocks and the loss, and when the backward hides one.

In: a ``Plan`` (tp, sequence parallelism, ``training.cross_entropy``, a split backward) and, for the backward, the
column-parallel GEMM's weight-gradient seconds. Out:
- ``tp_ops``: the collective before and after each block, each of ``Plan.tp_bytes`` (Narayanan et al. SC21 Sec. 2.3:
  all-reduce; with sequence parallelism all-gather before and reduce-scatter after, Korthikanti et al. 2022
  Sec. 4.2.2);
- ``loss_collectives``: the loss's TP collectives in the head's forward (Megatron's unfused cross entropy);
- ``overlaps_backward``: whether a block's backward runs Megatron's asynchronous input-gradient reduction under its
  weight-gradient GEMM (LinearWithGradAccumulationAndAsyncCommunication).
The same collectives split into chunks beside their GEMMs are sim.workload.tp_overlap's.
"""

from __future__ import annotations

from sim.model.vocab_ops import loss_tp_collectives
from sim.plan import Plan


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
    under a zero-bubble schedule the B pass runs the input gradients alone and the W pass the weight gradients)."""
    return plan.tp > 1 and column_weight_grad_seconds > 0 and not plan.splits_backward
