"""A layer's attention core under context parallelism: its ring steps and the exchanges of each pass.

In: a ``Plan`` with cp > 1 (its attention block from sim.workload.blocks, ``cp_comm_type``, causal attention) or an
attention block's ``Work``. Out: ``ContextAttention`` (``context_attention``): the flash kernel per ring step with
its output correction under p2p, the whole core otherwise, and the forward and backward exchanges
(sim.parallel.context); ``attention_parts``: the block's work before and after its flash kernel.
The emitter's ``cp_emit`` and the estimate read them; docs/mechanisms/context_parallel.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.costs.models import Work
from sim.model.ops import Op
from sim.parallel.context import CpExchange, correction_rows, exchanges, step_shares
from sim.plan import Plan
from sim.workload.blocks import blocks


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
