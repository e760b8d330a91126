"""The estimate's cache keys: what a layout's parts depend on, so that screened layouts share them.

In: a ``Scenario`` (a search candidate shares every object but ``parallel`` and ``training`` with its base) or a
``Plan``. Out: ``LayoutKeys`` (sim.explore.search builds them from its layouts); ``_shape_key``, a scenario without the
fields of ``_SHAPE_FREE``, ``_STAGES_FREE`` or ``_MEMORY_FREE``; ``_fsdp_grad_key``, what FSDP1's gradient kernels read
beyond a layer's shape. A key names all that the part it keeps reads, so a cached float is the one a fresh Estimator
gives the scenario alone (tests/test_search_cache.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sim.plan import Plan
from sim.spec.scenario import FsdpSpec, Scenario


class LayoutKeys(NamedTuple):
    """Cache keys of a scenario for ``Estimator.estimate``: ``stages`` names everything but the ZeRO stage
    (``_STAGES_FREE``), ``shape`` everything but the micro-batch size, recomputation and SP (``_SHAPE_FREE``),
    ``activations`` everything but the ZeRO stage and the FSDP section (``_MEMORY_FREE``); ``owner`` is kept
    with the cached parts so that the objects the keys name by identity stay alive. sim.explore.search builds
    them from its layouts (``search.layout_keys``)."""

    stages: tuple[Any, ...]
    shape: tuple[Any, ...]
    activations: tuple[Any, ...]
    structure: tuple[Any, ...]  # the pipeline's structure: what each stage holds and recomputes (_stage_shapes)
    layer: tuple[Any, ...]  # what one layer's times depend on (_layer_times)
    base: tuple[Any, ...]  # the base without the layout (its global batch, sequence, model: the step's FLOPs)
    owner: Any
    # what a stage's largest chunk stashes depends on (footprint.largest_chunk_stash): ``activations`` with the
    # schedule's chunk placement for its name; None: ``activations``
    stash: tuple[Any, ...] | None = None


# Fields of a layout that change what a stage computes per micro-batch but not its parameters, gradients,
# groups or optimizer: layouts differing only in these share a tail shape.
_SHAPE_FREE = {"parallel": ("sequence_parallel",), "training": ("micro_batch", "recompute")}


# The ZeRO stage changes a stage's per-micro-batch times only where weights are gathered per unit
# (Estimator._sharded_unit_overhead): otherwise layouts differing only in it share their stage times.
_STAGES_FREE: dict[str, tuple[str, ...]] = {"parallel": ("zero",), "training": ()}


# A stage's activations do not depend on how its weights, gradients and optimizer states are sharded: layouts
# differing only in the ZeRO stage (and the FSDP section it implies) share them (Estimator._peak_memory).
_MEMORY_FREE: dict[str, tuple[str, ...]] = {"parallel": ("zero",), "training": (), "scenario": ("fsdp",)}


def _shape_key(sc: Scenario, free: dict[str, tuple[str, ...]] = _SHAPE_FREE) -> tuple[Any, ...]:
    """A scenario without the ``free`` fields, cheaply: values of the parallel and training fields, the
    schedule and names, and the identity of every other part (search candidates share those objects with their
    base: sim.explore.search.candidate copies only ``parallel`` and ``training``)."""
    skip = ("parallel", "training", *free.get("scenario", ()))
    return tuple(tuple(_token(v) for k, v in getattr(sc, part).__dict__.items() if k not in free[part])
                 for part in ("parallel", "training")) \
        + tuple(_token(v) for k, v in sc.__dict__.items() if k not in skip)


def _token(value: Any) -> Any:
    """A field's value as a key: itself for a plain value, a tuple for a list, the fields of an ``FsdpSpec``
    (sim.explore.search.candidate builds one per FSDP layout), else the object's identity."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, list):
        return tuple(_token(v) for v in value)
    if isinstance(value, FsdpSpec):
        return ("fsdp", *(_token(v) for v in value.__dict__.values()))
    return id(value)


def _fsdp_grad_key(plan: Plan) -> tuple[Any, ...] | None:
    """What FSDP1's per-micro-batch gradient kernels (``step.fsdp_grad_ops``, inside ``step.blocks``) read beyond
    ``Estimator._price``'s shape: None where there are none, else the gradient and reduce bytes and the
    data-parallel world (its pre-division factor)."""
    fsdp = plan.scenario.fsdp
    if fsdp is None or fsdp.version != 1 or plan.pipelined_fsdp or plan.dp <= 1:
        return None
    return plan.elem_bytes, plan.grad_bytes_per_param, len(plan.grid.dp_group(0))
