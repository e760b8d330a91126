"""A MoE layer's MLP part: its blocks' work and its token dispatch and combine exchanges.

In: a ``Plan`` of a MoE model (local experts, routed tokens, etp, the token dispatcher, dispatch bytes and skew,
DeepEP's bytes and seconds) and, for seconds, the network. Out: the work of each block (``MOE_BLOCKS``: router,
shared expert, grouped expert GEMMs, combine; ``moe_blocks``) and what selective recomputation replays of them
(``moe_recompute``); the collectives of the dispatch and the combine (``Exchange``: op, bytes, group name, skew,
DeepEP's closed-form seconds; ``dispatch_exchanges``, ``combine_exchanges``), the ranks of a group
(``expert_group``) and an exchange's seconds (``exchange_seconds``, ``task_seconds``). The emitter's ``moe_emit``
and the estimate read them; docs/mechanisms/expert_parallel.md, deepep.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.costs.models import Work
from sim.model.moe_ops import moe_forward_ops
from sim.network import deepep
from sim.network.models import transfer_time
from sim.plan import Plan
from sim.workload.blocks import layer_shape, replayed

# A MoE layer's MLP part, in forward order (sim.model.moe_ops.moe_forward_ops): the dispatch runs between the router
# and the experts (the shared expert beside it), the combine between the experts and moe_combine.
MOE_BLOCKS = ("moe_router", "moe_shared", "moe_experts", "moe_combine")


def moe_recompute(plan: Plan) -> dict[str, Work]:
    """Per MoE block (``MOE_BLOCKS``), the forward ops selective recomputation replays before its backward: the
    pre-MLP norm (``layernorm``) in the router's, the activation (``moe_act``) in the experts', the shared expert
    (``shared_experts``). Module ``moe`` reruns the whole MoE forward instead (sim.workload.moe_emit's
    ``MoeLayerEmitter.forward`` as ``recompute``)."""
    modules = frozenset() if "moe" in plan.recompute_modules else plan.recompute_modules
    return {name: Work(replayed(work.ops, modules), 0.0) for name, work in moe_blocks(plan).items()}


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
