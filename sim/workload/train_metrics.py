"""The trainer's sync of its train metrics after every step: what the host and the network do per metric state.

In: a ``Plan`` (``training.train_metric_states``, the world size). Out: ``metric_sync(plan)``, the ``MetricSync`` one
step ends with (None where there is none), and ``metric_sync_seconds`` for the estimate. Where it comes from
(docs/mechanisms/train_metric_sync.md):

- MosaicML Composer computes its model's train metrics after every batch and counts that time in the next batch's
  wall clock (composer v0.17.2 ``trainer.py`` ``_train_loop``: ``_compute_and_log_metrics(dataloader_label='train')``
  after the loss's ``dist.all_reduce`` and ``.cpu().item()``, a host sync that waits for the optimizer step): the GPU
  is idle while the host syncs them.
- Each ``Metric.compute()`` syncs every state across every rank (torchmetrics ``utilities/distributed.py``
  ``gather_all_tensors``, process group WORLD): ``torch.distributed.barrier``, then for a scalar state
  ``_simple_gather_all_tensors``: ``[torch.zeros_like(result) for _ in range(world_size)]`` (world-size ops on the
  host) and ``torch.distributed.all_gather`` into that list, which PyTorch's ``ProcessGroupNCCL::allgather`` fills
  from the flattened output by one ``copy_`` per rank; the reduction stacks the list and sums it.
- llm-foundry's MPT (``llmfoundry/models/mpt/modeling_mpt.py`` at 5e85bd62d, ``use_train_metrics`` default true)
  trains with ``LanguageCrossEntropy`` and ``LanguagePerplexity`` (composer ``metrics/nlp.py``: states ``sum_loss``
  and ``total_items`` each): 4 states.

So per state, in order: a barrier (a one-element all-reduce over every rank), world x ``ZEROS_LIKE_S`` of host, an
all-gather of world x ``STATE_BYTES`` (a ring: its latency grows with the world), world x (``COPY_S`` +
``STACK_S``) of host. The sum grows linearly with the world: 4 x 512 x 15.2 us = 31 ms of host a step at 512 ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sim.plan import Plan
from sim.workload.optimizer_step import GRAD_STAT_BYTES, every_rank

# One scalar metric state (LanguageCrossEntropy: sum_loss fp32, total_items int64): 8 bytes at most per rank.
STATE_BYTES = 8.0
# The host's seconds per rank of a state's loops, medians of sim/data/reference/metric_sync_host_measurements.csv
# (scripts/measure_metric_sync_host.py: fp32 and int64 scalars, 128-2048 entries, torch 2.11 on the Xeon host of an
# H200 machine): a zeros_like list entry (before the all-gather), a copy_ into it (the Python loop's time, an upper
# bound of c10d's C++ loop) and its share of torch.stack and sum (after). Not costs.eager_op_overhead: that is a
# MoE layer's ops under autograd (26-35 us); these are scalar ops under no_grad.
ZEROS_LIKE_S = 7.775e-6
COPY_S = 6.725e-6
STACK_S = 0.69e-6


@dataclass(frozen=True)
class MetricSync:
    """The train-metric sync one step ends with: ``states`` times, in order, a barrier (``GRAD_STAT_BYTES`` all-reduced
    over ``group``), ``zeros_s`` of host (the world-size ``zeros_like``), an all-gather of ``gather_bytes`` over
    ``group``, ``copies_s`` of host (c10d's world-size output copies, the stack and sum)."""

    states: int
    group: tuple[int, ...]
    zeros_s: float
    copies_s: float
    gather_bytes: float
    barrier_bytes: float = GRAD_STAT_BYTES


def metric_sync(plan: Plan) -> MetricSync | None:
    """The train-metric sync of ``plan``'s step: None without metric states (``training.train_metric_states`` 0) or
    on one rank (nothing to sync)."""
    states = plan.scenario.training.train_metric_states
    world = plan.grid.world_size
    if not states or world <= 1:
        return None
    return MetricSync(states=states, group=every_rank(world), zeros_s=world * ZEROS_LIKE_S,
                      copies_s=world * (COPY_S + STACK_S), gather_bytes=world * STATE_BYTES)


class _Collectives(Protocol):
    def collective_time(self, op: str, nbytes: float, group: tuple[int, ...]) -> float: ...


def metric_sync_seconds(sync: MetricSync, net: _Collectives) -> float:
    """Seconds the sync adds to a step, its collectives priced by ``net`` (a network model): the parts run one
    after another (each collective waits for the host, the host for each collective)."""
    per_state = (net.collective_time("all_reduce", sync.barrier_bytes, sync.group) + sync.zeros_s
                 + net.collective_time("all_gather", sync.gather_bytes, sync.group) + sync.copies_s)
    return sync.states * per_state
