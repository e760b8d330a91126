"""A layout's scenario and the estimator's cache keys for it.

In: a base ``Scenario`` and a ``Layout`` (sim.explore.search_space). Out: ``candidate``, the base with the layout's
parallel and training sections, schedule and fsdp section (copied without re-validating what is unchanged, frozen
sections shared between layouts that set them alike: ``Sections``), its rules checked (ValueError naming the rule);
``layout_fsdp``, the fsdp section a layout implies (FSDP + PP for ZeRO-2/3 under a pipeline, the base's knobs kept);
``layout_keys``, the ``LayoutKeys`` the estimate shares its parts by (sim.explore.estimate_keys); ``_DERIVED``, the
scenario fields a layout sets from some of its knobs (for sim.explore.layout_table's rules).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

from sim.explore.estimate import PRICED_AS, LayoutKeys
from sim.explore.search_space import _SHARDING, Layout
from sim.parallel.schedules import SCHEDULES
from sim.spec.degrees import Degrees, degrees
from sim.spec.scenario import FsdpSpec, Scenario, check_rules


def candidate(base: Scenario, layout: Layout, global_batch: int | None = None,
              sections: Sections | None = None) -> Scenario:
    """The base scenario with this layout (no re-validation of the unchanged fields); ValueError if a rule fails.
    ``global_batch``: the base's (``degrees(base).global_batch``), where the caller has it. ``sections``: where
    the caller screens many layouts of this base, a dict in which the parallel and training sections (frozen)
    are kept for the layouts that set them alike (one parallel section serves every micro-batch size, schedule
    and recomputation)."""
    return _checked_candidate(base, layout, global_batch, sections)[0]


def _checked_candidate(base: Scenario, layout: Layout, global_batch: int | None = None,
                       sections: Sections | None = None) -> tuple[Scenario, Degrees]:
    """``candidate``'s scenario and the degrees its rules checked (``check_rules``), which its plan keeps."""
    scenario = _candidate_scenario(base, layout, global_batch, sections)
    return scenario, check_rules(scenario)


def _candidate_scenario(base: Scenario, layout: Layout, global_batch: int | None = None,
                        sections: Sections | None = None) -> Scenario:
    """``candidate``'s scenario, its rules not checked."""
    degrees_ = (layout.tp, layout.pp, layout.dp, layout.vpp, layout.zero, layout.sequence_parallel, layout.ep,
                layout.etp, layout.cp, layout.cp_comm_type)
    parallel = _section(base, "parallel", degrees_, lambda: {
        "tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "vpp": layout.vpp, "zero": layout.zero,
        "sequence_parallel": layout.sequence_parallel, "ep": layout.ep, "etp": layout.etp, "cp": layout.cp,
        "cp_comm_type": layout.cp_comm_type}, sections)
    batch = degrees(base).global_batch if global_batch is None else global_batch
    training = _section(base, "training", (layout.micro_batch, layout.recompute, batch), lambda: {
        "micro_batch": layout.micro_batch, "recompute": layout.recompute, "microbatches": None,
        "global_batch": batch}, sections)
    return _updated(base, {"parallel": parallel, "training": training, "schedule": layout.schedule,
                           "fsdp": layout_fsdp(base, layout)})


_Spec = TypeVar("_Spec", bound=BaseModel)
Sections = dict[tuple[str, tuple[Any, ...]], Any]  # a base's sections copied for layouts (candidate's sections)


def _section(base: Scenario, name: str, key: tuple[Any, ...], update: Callable[[], dict[str, Any]],
             sections: Sections | None) -> Any:
    """``base``'s section ``name`` with ``update()``; with ``sections``, one copy per ``key`` (what the update
    sets) kept there."""
    if sections is None:
        return _updated(getattr(base, name), update())
    found = sections.get((name, key))
    if found is None:
        found = sections[name, key] = _updated(getattr(base, name), update())
    return found


def _updated(spec: _Spec, update: dict[str, Any]) -> _Spec:
    """``spec.model_copy(update=update)`` (no validation) without pydantic's generic copy, for the specs of a
    candidate: frozen, so the copy may share the unchanged values; the fields set gain the update's names.
    The generic copy where a spec carries extra or private state."""
    if spec.__pydantic_extra__ is not None or spec.__pydantic_private__ is not None:
        return spec.model_copy(update=update)
    copied = object.__new__(type(spec))
    object.__setattr__(copied, "__dict__", spec.__dict__ | update)
    object.__setattr__(copied, "__pydantic_extra__", None)
    object.__setattr__(copied, "__pydantic_private__", None)
    object.__setattr__(copied, "__pydantic_fields_set__", spec.__pydantic_fields_set__ | update.keys())
    return copied


_FSDP: dict[str, FsdpSpec] = {}
_FSDP_LIKE: dict[tuple[int, str], tuple[FsdpSpec, FsdpSpec]] = {}


def layout_fsdp(base: Scenario, layout: Layout) -> FsdpSpec | None:
    """The fsdp section of ``candidate(base, layout)``. Without one in the base: ZeRO-2/3 under a pipeline is FSDP
    (``Layout.fsdp_sharding``), else none. With one, its knobs (version, prefetch, reshard_after_forward,
    unit_layers) are what the user runs, so they stay: the base's section where its ZeRO stage is the layout's
    (HYBRID_SHARD included), its sharding replaced by the layout's ZeRO stage's otherwise (reshard_after_forward
    back to its default under SHARD_GRAD_OP, which refuses true), none below ZeRO-2 (a candidate's rules then
    refuse what contradicts, e.g. FULL_SHARD without resharding at ZeRO-3)."""
    sharding = _SHARDING.get(layout.zero)
    if sharding is None:
        return None
    if base.fsdp is None:
        return _fsdp(sharding) if layout.pp > 1 else None
    if base.fsdp.zero_stage == layout.zero:
        return base.fsdp
    key = (id(base.fsdp), sharding)
    found = _FSDP_LIKE.get(key)
    if found is None or found[0] is not base.fsdp:  # the base kept beside its copy, so its id stays its own
        update: dict[str, Any] = {"sharding": sharding}
        if sharding == "SHARD_GRAD_OP":
            update["reshard_after_forward"] = None
        found = _FSDP_LIKE[key] = (base.fsdp, FsdpSpec.model_validate(base.fsdp.model_dump() | update))
    return found[1]


def _fsdp(sharding: str) -> FsdpSpec:
    """The FSDP section of a layout with this sharding (a frozen spec, so its candidates share one)."""
    if sharding not in _FSDP:
        _FSDP[sharding] = FsdpSpec.model_validate({"sharding": sharding})
    return _FSDP[sharding]


def layout_keys(base: Scenario, layout: Layout) -> LayoutKeys:
    """The estimator's cache keys of ``candidate(base, layout)``, from the layout's fields (a candidate differs from
    its base in them alone, so the base's identity stands for the rest; the base, kept with the cached parts,
    stays alive): ``stages`` without the ZeRO stage but with the FSDP section it implies (none under a pipeline)
    and with the schedule the estimate prices it as (``PRICED_AS``: GPipe as 1F1B), ``activations`` without
    the ZeRO stage and FSDP, ``structure`` the pipeline's alone (what each stage holds, recomputes, offloads and
    sends does not depend on tp, cp, dp, the micro-batch size, SP or ZeRO), ``shape`` without the micro-batch size,
    recomputation and SP, and with the schedule's chunk placement (``Schedule.layout``) for its name: a stage's
    gradients, buckets, optimizer and resident memory follow from which layers it holds, not from the order its
    passes run in (GPipe, 1F1B, ZB-H1 and ZB-H2 share them), ``layer`` what one layer's times depend on: its work
    and its TP, CP and expert collectives (on rank 0's groups, whatever pp), whether the schedule splits the
    backward, and the micro-batches (dp, through MoE's token counts), ``stash`` ``activations`` with the chunk
    placement for the schedule's name (a chunk's stash does not depend on the order its passes run in)."""
    degrees_ = (layout.tp, layout.pp, layout.dp, layout.vpp)
    rest = (layout.ep, layout.etp, layout.cp, layout.cp_comm_type)
    activations = (id(base), *degrees_, layout.schedule, *rest, layout.micro_batch, layout.recompute,
                   layout.sequence_parallel)
    shape = (id(base), *degrees_, SCHEDULES[layout.schedule].layout, *rest, layout.zero)
    structure = (id(base), layout.pp, layout.vpp, layout.schedule, layout.recompute)
    layer = (id(base), layout.tp, layout.dp, *rest, layout.micro_batch, layout.recompute, layout.sequence_parallel,
             SCHEDULES[layout.schedule].splits_backward)
    # FSDP's gathers, and FSDP1's gradient kernels in a layer's times; but under a pipeline a layout's FSDP section
    # is FSDP + PP (Plan.pipelined_fsdp: gathered once per step, no per-micro-batch gradient kernels), which
    # changes neither a layer's times nor a stage's per micro-batch, so ZeRO-2/3 share ZeRO-0/1's
    fsdp = id(layout_fsdp(base, layout)) if layout.pp == 1 else None
    stash = (id(base), *degrees_, SCHEDULES[layout.schedule].layout, *rest, layout.micro_batch, layout.recompute,
             layout.sequence_parallel)
    times = (id(base), *degrees_, PRICED_AS.get(layout.schedule, layout.schedule), *rest, layout.micro_batch,
             layout.recompute, layout.sequence_parallel, fsdp)  # GPipe's stage times and pipeline are 1F1B's
    return LayoutKeys(times, shape, activations, structure, layer + (fsdp,), (id(base),), base,
                      stash)


# A scenario field a layout sets from some of its knobs -> those knobs: the fsdp section (``layout_fsdp``)
_DERIVED = {"fsdp": ("zero", "pp")}
