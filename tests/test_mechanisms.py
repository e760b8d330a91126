"""The mechanism registry (issue 22, docs/validation.md 'Mechanisms'): each mechanism can be switched off on
every validation scenario, and switching it off changes what it says it changes."""

from __future__ import annotations

import pytest

from sim.spec.scenario import load_scenario
from sim.validation.mechanisms import MECHANISMS
from sim.validation.validate import published, run_validation

from conftest import SCENARIOS

FOLDER = SCENARIOS / "validation"


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.name)
def test_every_mechanism_switches_off_on_every_validation_scenario(mechanism) -> None:
    assert mechanism.knob and mechanism.source and (mechanism.off or mechanism.note)
    for name in published(FOLDER)["scenario"]:
        load_scenario(FOLDER / name, list(mechanism.off))  # a ConfigError here names the field


def test_names_are_unique() -> None:
    assert len({m.name for m in MECHANISMS}) == len(MECHANISMS)


def test_validate_applies_overrides_to_every_row() -> None:
    row = ["korthikanti-22b-full-recompute.yaml"]
    on = run_validation(FOLDER, row)["predicted_iteration_time_s"].iloc[0]
    off = run_validation(FOLDER, row, ["costs.end_to_end_factor=1"])["predicted_iteration_time_s"].iloc[0]
    # tp 8 inside one node, no data parallelism: the step is kernels and TP collectives; the factor (1.23 on
    # A100) scales the kernels only, so the step shrinks by less than 1.23 but by most of it.
    assert 1.15 < on / off < 1.23
