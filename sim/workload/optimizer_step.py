"""The optimizer step on the GPU: the parameters a rank updates and the gradient checks before it.

In: a ``Plan`` (ZeRO / expert optimizer shards, the layout, dtype, ``training.clip_grad``, CPU offload) and a stage
or rank. Out: the parameters one rank updates (``optimizer_params``), DualPipe's all-reduce of its two model copies'
gradients (``copy_gradient_reduce``, docs/mechanisms/dualpipe.md), the fp16 unscale / inf check and the gradient
norm with the one-float all-reduce each issues (``grad_checks``, ``GRAD_STAT_BYTES``) and the group it spans
(``grad_stats_group``; docs/mechanisms/grad_clip.md). The data-parallel emitter and the estimate read them.
"""

from __future__ import annotations

from functools import lru_cache

from sim.plan import Plan


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
        return every_rank(grid.world_size)
    here = grid.coord(rank)
    return tuple(sorted(grid.rank(t, here.dp, p, here.cp) for p in range(plan.pp) for t in range(plan.tp)))


@lru_cache(maxsize=8)
def every_rank(world_size: int) -> tuple[int, ...]:
    """``tuple(range(world_size))``, made once: every stage's optimizer step names the whole world (98,304 ranks
    for the frontier scenario: 32 stages each built it anew, about 0.08 of a run's CPU seconds)."""
    return tuple(range(world_size))
