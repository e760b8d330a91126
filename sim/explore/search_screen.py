"""The screen's pricing loop in one process: each layout's status and estimate columns.

In: a base ``Scenario``, its layouts, an ``Estimator`` (sim.explore.estimate) and the layout columns' codes
(sim.explore.layout_table.columns). Out: ``_screen_columns``: each layout's status (``ok``, ``oom`` over HBM by the
memory bound, ``invalid: <rule>``) and the estimate's columns (``_ESTIMATE_COLUMNS``, NaN where invalid), in the
layouts' order, every rule run once per distinct value of the knobs it reads (layout_table.reasons), each valid layout's
candidate built once and priced with its ``LayoutKeys``; ``on_progress`` every ``SCREEN_PROGRESS_EVERY`` layouts.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from sim.explore import layout_table
from sim.explore.estimate import Estimator
from sim.explore.search_candidate import _DERIVED, Sections, _candidate_scenario, layout_keys
from sim.explore.search_space import LAYOUT_FIELDS, LAYOUT_KEYS, Layout
from sim.spec.degrees import Degrees, degrees
from sim.spec.scenario import Scenario

SCREEN_PROGRESS_EVERY = 1000  # layouts between two calls of screen's on_progress
_ESTIMATE_COLUMNS = ("est_step_time_s", "est_mfu", "est_peak_memory_bytes", "bound_step_time_s", "microbatches",
                     "hbm_capacity_bytes")
_Columns = tuple[list[str], dict[str, list[Any]]]  # each layout's status, and the estimate's columns


def _screen_columns(base: Scenario, space: list[Layout], estimator: Estimator,
                    on_progress: Callable[[int, int], None] | None = None,
                    codes: layout_table.Codes | None = None) -> _Columns:
    """Each layout's status and estimate columns (NaN where it is invalid), in the order of ``space``. ``codes``:
    the layout columns' codes (``layout_table.columns``), where the caller has them."""
    global_batch = degrees(base).global_batch
    hbm = base.cluster.gpu.hbm_capacity
    status: list[str] = []
    # the estimate's columns, NaN where a layout is invalid
    estimates: dict[str, list[Any]] = {name: [] for name in _ESTIMATE_COLUMNS}
    # The pricing allocates millions of short-lived tuples and floats and frees them by reference counting; the
    # cyclic collector, run every 700 allocations, would traverse them and every cached part (10-15% of the 175B
    # screen's CPU, 2026-11-26). It is paused for the loop (the loop's few cycles are collected after it).
    collecting = gc.isenabled()
    gc.disable()
    try:
        if codes is None:
            codes = layout_table.columns(space, LAYOUT_FIELDS)[1]
        _price_layouts(base, space, estimator, on_progress, global_batch, hbm, status, estimates, codes)
    finally:
        if collecting:
            gc.enable()
    if on_progress is not None:
        on_progress(len(space), len(space))
    return status, estimates


def _price_layouts(base: Scenario, space: list[Layout], estimator: Estimator,
                   on_progress: Callable[[int, int], None] | None, global_batch: int, hbm: float, status: list[str],
                   estimates: dict[str, list[Any]], codes: layout_table.Codes) -> None:
    """``_screen_columns``' loop: each layout's status and estimate appended to ``status`` and ``estimates``."""
    nan = float("nan")
    step_s, mfu, peak, bound, microbatches, capacity = estimates.values()
    sections: Sections = {}
    built: dict[int, tuple[Scenario, Degrees]] = {}
    degrees_of: dict[tuple[int, ...], Degrees] = {}  # per what a candidate's degrees read of its layout

    def build(index: int) -> tuple[Scenario, Degrees]:  # a layout's candidate and its degrees, built once
        found = built.get(index)
        if found is None:
            layout = space[index]
            scenario = _candidate_scenario(base, layout, global_batch, sections)
            # sim.spec.degrees reads these of a candidate (fsdp's ZeRO stage from zero and pp), the rest is the base's
            key = (layout.tp, layout.pp, layout.dp, layout.vpp, layout.zero, layout.ep, layout.etp, layout.cp,
                   layout.micro_batch)
            of = degrees_of.get(key)
            if of is None:
                of = degrees_of[key] = degrees(scenario)
            found = built[index] = (scenario, of)
        return found

    # The rules over the layout table: each runs once per distinct value of the knobs it reads (layout_table)
    lines = layout_table.reasons(codes, LAYOUT_KEYS, _DERIVED, build, len(space))
    invalid: dict[str, str] = {}  # one status string per line (the layouts a rule refuses alike share it)
    for index, layout in enumerate(space):
        if on_progress is not None and index and index % SCREEN_PROGRESS_EVERY == 0:
            on_progress(index, len(space))
        line = lines[index]
        if line is not None:
            text = invalid.get(line)
            if text is None:
                text = invalid[line] = f"invalid: {line}"
            status.append(text)
            for column in estimates.values():
                column.append(nan)
            continue
        scenario, implied = build(index)
        est = estimator.estimate(scenario, layout_keys(base, layout), implied)
        status.append("ok" if est.fits_in_memory else "oom")
        step_s.append(est.step_time_s)
        mfu.append(est.mfu)
        peak.append(est.peak_memory_bytes)
        bound.append(est.bound_s)
        # micro-batches per pipeline as degrees() counts them where only the global batch is given (candidate)
        microbatches.append(global_batch // (layout.dp * layout.micro_batch))
        capacity.append(hbm)
