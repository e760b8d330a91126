"""The search's layouts as a table of columns, and the scenario rules checked over the table, not layout by layout.

In: a list of layouts (sim.explore.search.Layout: one field per knob), the scenario path each knob sets, and a
function that builds one layout's candidate scenario with its degrees. Out: ``columns``: each knob's values as a
list and as compact integer codes (numpy); ``reasons``: each layout's first failing cross-field rule as the
one line ``sim.spec.rules.check_rules`` gives for its candidate, or None where every rule holds.

How: the rules run in ``RULES``' order, each over the layouts that passed every earlier rule. A rule reads a few
of the fields a layout sets (``Rule.reads``), so its outcome is one per distinct value of those knobs' columns:
it runs once on the first such layout (a candidate where every earlier rule held, as ``check_rules`` would run it),
and its outcome is spread over every layout with that value (numpy's ``unique`` over the knobs' codes). The
first failing rule of a layout, and so its line, is the one ``check_rules`` raises on its candidate: the same
code on the same values (tests/test_search.py compares both on whole spaces).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from sim.spec.degrees import Degrees
from sim.spec.rules import RULES, Rule
from sim.spec.scenario import Scenario

Build = Callable[[int], tuple[Scenario, Degrees]]  # a layout's index -> its candidate scenario and degrees
Codes = dict[str, np.ndarray]  # a knob -> its column's codes


def columns(space: Sequence[Any], fields: Sequence[str]) -> tuple[dict[str, list[Any]], Codes]:
    """Each field's values over ``space`` (lists, for the screen's table) and their codes: 0, 1, ... in the
    order each value first appears (int64 arrays)."""
    values = {name: [getattr(layout, name) for layout in space] for name in fields}
    codes = {}
    for name, column in values.items():
        seen: dict[Any, int] = {}
        codes[name] = np.fromiter((seen.setdefault(v, len(seen)) for v in column), dtype=np.int64, count=len(column))
    return values, codes


def _key(codes: Mapping[str, np.ndarray], knobs: Sequence[str], rows: np.ndarray) -> np.ndarray:
    """One int64 per row of ``rows`` naming its values of ``knobs`` (mixed radix over the codes), or the rows'
    index into the distinct combinations where the radix would not fit 62 bits."""
    key = np.zeros(len(rows), dtype=np.int64)
    radix = 1
    for knob in knobs:
        column = codes[knob][rows]
        size = int(column.max()) + 1 if len(column) else 1
        radix *= size
        if radix >= 2 ** 62:
            stacked = np.stack([codes[k][rows] for k in knobs], axis=1)
            return np.unique(stacked, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)
        key = key * size + column
    return key


def _reads(rule: Rule, path: str) -> bool:
    """Whether ``rule`` reads the field at ``path`` (a section's name in its reads stands for all its fields)."""
    return any(path == read or path.startswith(read + ".") for read in rule.reads)


def reasons(codes: Mapping[str, np.ndarray], paths: Mapping[str, str], derived: Mapping[str, tuple[str, ...]],
            build: Build, count: int, rules: Sequence[Rule] = RULES) -> list[str | None]:
    """Each of ``count`` layouts' first failing rule's line (``str`` of its ValueError) or None. ``codes``: the
    knobs' columns (``columns``); ``paths``: the scenario field each knob sets; ``derived``: a scenario field a
    layout sets from some of its knobs (the search's ``fsdp`` section, from the ZeRO stage and pp) -> those knobs;
    ``build(i)``: layout i's candidate and its degrees, called only for the layouts a rule runs on."""
    lines: list[str] = []
    failed = np.full(count, -1, dtype=np.int64)  # each layout's index into lines, -1 while every rule held
    alive = np.arange(count)
    for rule in rules:
        if not len(alive):
            break
        knobs = [knob for knob, path in paths.items() if _reads(rule, path)]
        knobs += [knob for field, of in derived.items() if _reads(rule, field) for knob in of if knob not in knobs]
        if knobs:
            _, first, inverse = np.unique(_key(codes, knobs, alive), return_index=True, return_inverse=True)
        else:
            first, inverse = np.zeros(1, dtype=np.int64), np.zeros(len(alive), dtype=np.int64)
        outcome = np.full(len(first), -1, dtype=np.int64)
        for value, row in enumerate(first.tolist()):
            scenario, implied = build(int(alive[row]))
            try:
                rule.check(scenario, implied)
            except ValueError as error:
                outcome[value] = len(lines)
                lines.append(str(error))
        spread = outcome[inverse.reshape(-1)]
        fails = spread >= 0
        failed[alive[fails]] = spread[fails]
        alive = alive[~fails]
    return [lines[i] if i >= 0 else None for i in failed.tolist()]
