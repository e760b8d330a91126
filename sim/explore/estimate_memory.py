"""The estimate's memory bound: the largest stage's (sim.workload.footprint), its parts shared by layouts.

In: ``WeightGathers`` (the caches), a ``Plan`` and its ``LayoutKeys``. Out: ``MemoryBound._peak_memory``: the largest
bound of the stages that may peak (``_peak_stage_list``: an end of an even pipe, any stage of an uneven one), their
resident states and sharded buffers kept per ``LayoutKeys.shape``, their activations per ``LayoutKeys.activations``
(``_stage_activations``, the largest chunk's stash per ``LayoutKeys.stash``).
"""

from __future__ import annotations

from sim.explore.estimate_gathers import WeightGathers
from sim.explore.estimate_keys import LayoutKeys
from sim.plan import Plan
from sim.workload import footprint


class MemoryBound(WeightGathers):
    """A layout's per-rank memory bound (a base of sim.explore.estimate's ``Estimator``)."""

    def _peak_memory(self, plan: Plan, keys: LayoutKeys) -> float:
        """The largest stage's memory bound (``sim.workload.footprint``): even stages peak at an end of the pipe
        (most in flight, or the head's); uneven ones may peak anywhere. The stages' resident states and sharded
        buffers are kept per tail shape (they do not depend on the micro-batch size, recomputation or SP), their
        activations per layout without the ZeRO stage: each a list over the stages that may peak."""
        found = self._memory_states.get(keys.shape)
        if found is None:
            found = self._memory_states[keys.shape] = (
                [(s, sum(footprint.states_and_buffers(plan, s)[0].values()), *footprint.sharded_buffers(plan, s))
                 for s in self._peak_stage_list(plan, keys)], keys.owner)  # the owner keeps the key's objects
        states = found[0]
        activations = self._activations.get(keys.activations)
        if activations is None:
            activations = self._activations[keys.activations] = [self._stage_activations(plan, keys, s)
                                                                  for s, _, _, _ in states]
        peak = None
        for (_, resident, gathered, unreduced), stashed in zip(states, activations, strict=True):
            total = footprint.parts_total(plan, resident, stashed, gathered, unreduced)
            if peak is None or total > peak:
                peak = total
        assert peak is not None
        return peak

    def _peak_stage_list(self, plan: Plan, keys: LayoutKeys) -> list[int]:
        """The stages that may peak (``_peak_memory``), per pipeline structure."""
        found = self._peak_stages.get(keys.structure)  # what the pipeline's structure decides
        if found is None:
            uneven = len(set(plan.chunk_sizes)) > 1
            stages = list(range(plan.pp)) if uneven else sorted({0, plan.head_stage, plan.pp - 1})
            found = self._peak_stages[keys.structure] = (stages, keys.owner)  # the owner keeps the key's objects
        return found[0]

    def _stage_activations(self, plan: Plan, keys: LayoutKeys, s: int) -> float:
        """A stage's activations at its peak (``footprint.stage_activations``), its largest chunk's stash kept per
        ``keys.stash`` (the chunk placement, not the schedule's name)."""
        stash_key = (keys.activations if keys.stash is None else keys.stash, s)
        stash = self._stashes.get(stash_key)
        if stash is None:
            stash = self._stashes[stash_key] = footprint.largest_chunk_stash(plan, s)
        return footprint.stage_activations(plan, s, stash)[0]
