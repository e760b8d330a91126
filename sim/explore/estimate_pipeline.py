"""The pipeline's makespan by schedule, from its stages' times.

In: ``StagePricing`` and the stages' ``StageTimes`` (F_s, B_s, W_s per stage; c one p2p send). Out:
``PipelineComposition._pipeline``: the makespan and when each stage's gradients are final (its last B, or its last W
under a split backward); ``_after_last_weight``: the passes each stage runs after each local chunk's last W. GPipe /
1F1B sum_s(F_s+B_s) + (m-1) max_s(F_s+B_s) + 2(p-1)c (Narayanan et al. 2021 Sec. 2.2); interleaved with v chunks the
warm-up/cool-down shrink to (p-1)(F+B)/v; ZB-H1 (p-1)(F+B-W) and ZB-H2 max(0,(p-1)(F+B-2W)) of bubble (Qi et al. ICLR
2024 Sec. 3.1); ZB-V the bubble of H2 at chunk granularity; zero-bubble orders with fewer than 2p micro-batches,
DualPipe and Megatron's combined 1F1B replayed at stage level (sim.explore.stage_replay). ``PRICED_AS``: the schedules
priced alike; ``_work_bound``: the slowest stage's work per micro-batch, which m times bounds the step from below.
"""

from __future__ import annotations

from sim.explore.estimate_stages import StagePricing
from sim.explore.stage_replay import StageTimes, after_last_weight, pass_dependencies, stage_level_replay
from sim.parallel.schedules import Action
from sim.plan import Plan

# Schedules whose stage times and makespan the estimate prices alike (``Estimator._pipeline``): GPipe runs 1F1B's
# passes (no split backward, one chunk per stage) and its makespan has the same form, only its memory differs.
PRICED_AS = {"gpipe": "1f1b"}


class PipelineComposition(StagePricing):
    """The pipeline's makespan by schedule (a base of sim.explore.estimate's ``Estimator``)."""

    def _pipeline(self, plan: Plan, stages: list[StageTimes]) -> tuple[float, list[float]]:
        """Makespan of the pipeline and when each stage's last backward pass (its last W, where split) ends."""
        p, v, m = plan.pp, plan.vpp, plan.microbatches
        # With blocking sends (parallel.overlap_p2p_comm: false) each stage's passes already hold their sends
        # (_stages), so the trip of a micro-batch down and back up adds no further hop.
        c = 0.0 if not plan.scenario.parallel.overlap_p2p_comm else self._p2p(plan)
        work = [st.forward + st.backward + st.weight for st in stages]
        slowest = max(work)
        f, b, w = (max(getattr(st, part) for st in stages) for part in ("forward", "backward", "weight"))
        name = plan.scenario.schedule
        if PRICED_AS.get(name, name) == "1f1b":
            total = sum(work) + (m - 1) * slowest + 2 * (p - 1) * c
        elif name == "interleaved":
            total = m * slowest + (p - 1) * (f + b) / v + 2 * (p - 1) * c
        elif name == "zb-h1":
            total = m * slowest + (p - 1) * max(f + b - w, 0.0) + 2 * (p - 1) * c
        elif name == "zb-h2":
            total = m * slowest + (p - 1) * max(f + b - 2 * w, 0.0) + 2 * (p - 1) * c
        else:  # zb-v: two chunks per stage, H2's bubble per chunk
            total = m * slowest + (p - 1) * max(f + b - 2 * w, 0.0) / 2 + 2 * (p - 1) * c
        # Too few micro-batches to fill the pipeline (zero-bubble needs m >= 2p): one micro-batch's trip down
        # and back up bounds the step, and the zero-bubble orders keep bubbles their formulas do not have, so
        # replay those orders at stage level (a few hundred actions at most).
        total = max(total, sum(st.forward + st.backward for st in stages) + w + 2 * (p - 1) * c)
        if name.startswith("zb") and m < 2 * p or name.startswith("dualpipe") or plan.a2a_overlap:
            # DualPipe and Megatron's combined 1F1B (F&B pairs): no formula here
            total, ends = self._replay(plan, (name, p, m, plan.vpp, plan.a2a_overlap), stages, c)
            return total, list(ends)
        if plan.layout == "v" and p > 1:
            # ZB-V's V: the backward turns on the last stage, so a stage's last W does not end one backward
            # after the next stage's, as 1F1B's (and, near enough, ZB-H1's and ZB-H2's: tests/test_estimate.py)
            # do; how much earlier than stage 0 each ends has no simple form: the stage-level replay of the same
            # order at m = 2p gives it (the cool-down is the same for every m >= 2p: _after_last_weight), short,
            # once per stage times. Only the V pays this replay, to keep the screen's zero-bubble layouts cheap.
            short, short_ends = self._replay(plan, (name, p, 2 * p, plan.vpp, plan.a2a_overlap), stages, c)
            return total, [total - (short - end) for end in short_ends]
        ends, behind = [], 0.0
        for st in stages:  # stage 0 ends last; each later stage's last backward left one hop earlier
            ends.append(total - behind)
            behind += st.backward / (v if name == "interleaved" else 1) + c
        return total, ends

    def _after_last_weight(self, plan: Plan) -> tuple[tuple[tuple[int, int, int], ...], ...] | None:
        """Under a split backward, the passes each stage runs after each local chunk's last W
        (``stage_replay.after_last_weight``); None otherwise. The schedules' cool-down orders are the same for
        every m >= 2p (checked for ZB-H1, ZB-H2, ZB-V, DualPipe and DualPipeV at p 2, 4, 8: tests/test_estimate.py),
        so the order is built at m = min(m, 2p), once per (schedule, p, that m, vpp): a short order, not m's."""
        if not plan.splits_backward:
            return None
        p = plan.pp
        m = min(plan.microbatches, 2 * p)
        key = (plan.scenario.schedule, p, m, plan.vpp, plan.a2a_overlap)
        found = self._trailing.get(key)
        if found is None:
            found = self._trailing[key] = after_last_weight(self._actions(plan, key), plan.local_chunks)
        return found

    def _replay(self, plan: Plan, key: tuple[str, int, int, int, bool], stages: list[StageTimes],
                c: float) -> tuple[float, list[float]]:
        """The stage-level replay of the order ``key`` names ((schedule, p, m, vpp, a2a_overlap)) with these stage
        times and hop ``c``: (makespan, each stage's end). Many layouts share an order, built once; layouts that
        differ only where the stages' times do not (ZeRO 0 and 1) replay it once."""
        if key not in self._orders:
            self._orders[key] = pass_dependencies(self._actions(plan, key), plan.layout, plan.chunks - 1)
        replayed = (key, tuple(stages), c)
        if replayed not in self._replays:
            self._replays[replayed] = stage_level_replay(*self._orders[key], stages, c)
        return self._replays[replayed]

    def _actions(self, plan: Plan, key: tuple[str, int, int, int, bool]) -> list[list[Action]]:
        """The schedule's per-stage orders at ``key`` = (schedule, p, m, vpp, a2a_overlap), built once: the
        stage-level replay and ``_after_last_weight`` read the same short orders."""
        found = self._schedule_actions.get(key)
        if found is None:
            found = self._schedule_actions[key] = plan.schedule.actions(key[1], key[2], key[3])
        return found


def _work_bound(stages: list[StageTimes]) -> float:
    """The slowest stage's work per micro-batch (less what a DualPipe F&B pair hides, as if every pass were
    paired): m times it bounds the step from below."""
    return max(st.forward + st.backward + st.weight - st.pair_overlap for st in stages)
