"""The Python API that ``import sim`` exposes (``sim.run``, ``sim.estimate``, ``sim.check``, ``sim.load_scenario``).

In: a scenario as a YAML path (str or Path), a raw dict (the YAML's contents) or a validated ``Scenario``, and
optional overrides ``set``: a mapping ``{"parallel.tp": 2}`` or a list of ``"a.b=value"`` strings, applied
exactly as the command line's ``--set`` (``sim.spec.overrides.apply_overrides``). Out: a ``RunResult`` (``run``),
an ``Estimate`` (``estimate``), a ``Check`` (``check``: what ``sim check`` prints, as data) or a ``Scenario``.
Bad input raises the CLI's one-line ``ConfigError``, naming the field. Nothing here writes files.

This module sits above the runner and ``sim.explore`` (it calls both) and below ``sim.cli``; nothing inside
``sim`` imports the top-level package's API (``sim/__init__.py`` loads this module lazily).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from sim.errors import ConfigError
from sim.model.params import total_params
from sim.model.peft import trainable_params
from sim.plan import resolve
from sim.spec import scenario as spec
from sim.spec.scenario import Scenario
from sim.units import parse_bytes
from sim.workload.footprint import memory_plan
from sim.workload.size import DEFAULT_MAX_TASKS, Limits

if TYPE_CHECKING:  # run and estimate import these when called: check (and ``sim check``) runs without pandas
    from sim.explore.estimate import Estimate
    from sim.runner import RunResult

ScenarioSource = str | Path | Mapping[str, Any] | Scenario
Overrides = Mapping[str, Any] | Iterable[str] | str | None


@dataclass(frozen=True)
class Check:
    """What ``sim check`` prints, as data: the validated scenario, its YAML with every default filled in (the
    run directory's ``scenario.resolved.yaml``), and the memory plan, one row per pipeline stage
    (``sim.workload.footprint.memory_plan``: stage, representative rank, bytes per part, total, host, fits)."""

    scenario: Scenario
    resolved_yaml: str
    memory_plan: list[dict[str, float]]
    trainable_params: float = 0.0  # parameters that train (the whole model in full training; sim.model.peft)
    model_params: float = 0.0  # the base model's parameters

    @property
    def notes(self) -> list[str]:
        """What the scenario left to a default that changes the numbers a lot: ``training.seq_len``."""
        from sim.spec.degrees import DEFAULT_SEQ_LEN, degrees

        if self.scenario.training.seq_len is not None:
            return []
        model, seq_len = self.scenario.model, degrees(self.scenario).seq_len
        why = (f"the default, {DEFAULT_SEQ_LEN}" if seq_len == DEFAULT_SEQ_LEN
               else f"the model's max_seq_len, shorter than the default {DEFAULT_SEQ_LEN}")
        return [f"note: training.seq_len not set: {seq_len} tokens ({why}; {model.name} allows up to "
                f"{model.max_seq_len}); set it to what the run trains at"]

    @property
    def fits_in_memory(self) -> bool:
        """Whether every stage's estimated peak fits in its GPU's HBM."""
        return all(bool(row["fits"]) for row in self.memory_plan)


def override_strings(overrides: Overrides) -> list[str]:
    """``set`` as the CLI's ``a.b=value`` strings. A mapping's values are written as YAML, so that loading them
    back (as ``--set`` does) gives the value passed: ``{"parallel.tp": 2}`` is ``"parallel.tp=2"``. NumPy
    scalars (a row of a sweep's table) become Python numbers and paths strings."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [overrides]
    if isinstance(overrides, Mapping):
        return [f"{key}={_yaml_value(value)}" for key, value in overrides.items()]
    items = list(overrides)
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"set: expected a mapping or 'a.b=value' strings, got {type(item).__name__} {item!r}")
    return items


def _yaml_value(value: Any) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    elif isinstance(value, PurePath):
        value = str(value)
    try:
        return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).removesuffix("\n...\n").strip()
    except yaml.YAMLError:  # an object YAML cannot represent
        raise TypeError(f"set: {type(value).__name__} {value!r} is not a YAML value") from None


def load_scenario(scenario: ScenarioSource, set: Overrides = None) -> Scenario:
    """A validated ``Scenario`` from a YAML path, a raw dict or a ``Scenario``, with ``set`` applied. A dict's
    relative paths (a calibration profile, an HF config) are read from the working directory; a ``Scenario``
    with overrides is re-validated from its own fields, so every cross-field rule holds again. ``set`` is named
    after the CLI's ``--set`` (it shadows the builtin only inside these functions)."""
    overrides = override_strings(set)
    if isinstance(scenario, (str, PurePath)):
        return spec.load_scenario(scenario, overrides)
    if isinstance(scenario, Scenario):
        if not overrides:
            return scenario
        data: dict[str, Any] = scenario.model_dump(mode="json")
    elif isinstance(scenario, Mapping):
        data = copy.deepcopy(dict(scenario))  # apply_overrides edits the dict in place
    else:
        raise TypeError(f"scenario: expected a YAML path, a dict or a Scenario, got {type(scenario).__name__}")
    return spec.scenario_from_dict(spec.apply_overrides(data, overrides))


def run(scenario: ScenarioSource, set: Overrides = None, *, record_links: bool = False,
        max_tasks: int | None = None, max_memory: int | str | None = None) -> RunResult:
    """Simulate one training step in memory (``sim run`` without the files). ``record_links`` keeps each link's
    load over time (``RunResult.link_segments``, contention network only). The result's ``summary`` is a
    ``Summary``, its ``trace`` a DataFrame with one row per executed task. ``max_tasks`` / ``max_memory`` (bytes,
    or a string such as ``"8 GiB"``) are the run's budget, checked against its estimated size before anything is
    built (``sim.workload.size``; defaults ``DEFAULT_MAX_TASKS`` and half the machine's memory): over it,
    ``ResourceLimit`` names the field that makes the run big."""
    from sim import runner

    return runner.run(load_scenario(scenario, set), record_links=record_links,
                      limits=limits(max_tasks, max_memory))


def limits(max_tasks: int | None = None, max_memory: int | str | None = None,
           names: tuple[str, str] = ("max_tasks", "max_memory")) -> Limits:
    """The run budget from the API's keywords (None: the default), each checked: ConfigError naming it as
    ``names`` says (the CLI's ``--max-tasks`` / ``--max-memory``)."""
    tasks = DEFAULT_MAX_TASKS
    if max_tasks is not None:
        if isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or max_tasks < 1:
            raise ConfigError(f"{names[0]}: {max_tasks!r} is not a positive whole number of tasks")
        tasks = max_tasks
    memory: int | None = None
    if max_memory is not None:
        try:
            size = parse_bytes(max_memory)
        except ValueError as error:
            raise ConfigError(f"{names[1]}: {error}") from None
        if not (math.isfinite(size) and size > 0):
            raise ConfigError(f"{names[1]}: {max_memory!r} is not a positive finite size")
        memory = int(size)
    return Limits(tasks, memory)


def estimate(scenario: ScenarioSource, set: Overrides = None) -> Estimate:
    """The closed-form step time, MFU and peak memory of a scenario without simulating it (what ``sim search``
    screens layouts with; within a few percent of ``run``)."""
    from sim.explore import estimate as estimate_module

    return estimate_module.estimate(load_scenario(scenario, set))


def check(scenario: ScenarioSource, set: Overrides = None) -> Check:
    """Validate a scenario and plan its memory per stage, as ``sim check`` does."""
    loaded = load_scenario(scenario, set)
    plan = resolve(loaded)
    return Check(loaded, spec.resolved_yaml(loaded), memory_plan(plan), trainable_params(loaded.model, plan.peft),
                 float(total_params(loaded.model)))
