"""The spec package's shape: one module per scenario section, ``sim.spec.scenario`` assembling them.

``sim/spec/scenario.py`` held every section's pydantic model (724 lines) until they moved to a module each
(training, parallel, moe, sharding, memory, costs, network; files and overrides for reading and editing the raw
file). These pin what the move promised: each section model lives outside the assembling module, and every name
``from sim.spec.scenario import X`` reached before still reaches the same object.
"""

from __future__ import annotations

import ast
import importlib
import typing

import pytest
from pydantic import BaseModel

from sim.spec import scenario

from conftest import ROOT

# What ``sim.spec.scenario`` defined (or re-exported for its importers) before the split, by name.
EXPORTED_BEFORE = (
    "MAX_DEPTH", "MAX_FILE_BYTES", "MAX_NAME_CHARS", "MiB", "CalibratedCostsSpec", "ClusterSpec", "DeepSpeedSpec",
    "FixedCostsSpec", "FsdpSpec", "KernelCostsSpec", "LoraSpec", "MemorySpec", "MoeSpec", "NetworkSpec",
    "OffloadSpec", "ParallelSpec", "QloraSpec", "RecomputeModule", "RooflineCostsSpec", "Scenario", "SequenceSpec",
    "TrainingSpec", "VariationSpec", "absolute_override", "absolute_paths", "apply_overrides", "check_rules",
    "load_scenario", "parse_yaml", "read_text", "resolved_yaml", "scenario_from_dict",
)
SPEC_MODULES = sorted(path for path in (ROOT / "sim" / "spec").glob("*.py") if path.name != "__init__.py")


def _section_models() -> dict[str, type[BaseModel]]:
    """Each pydantic model a ``Scenario`` field holds (the costs union's members each), by field name."""
    hints = typing.get_type_hints(scenario.Scenario, include_extras=False)
    found: dict[str, type[BaseModel]] = {}
    for field, hint in hints.items():
        stack = [hint]
        while stack:
            node = stack.pop()
            if isinstance(node, type) and issubclass(node, BaseModel):
                found[f"{field}.{node.__name__}"] = node
            stack.extend(typing.get_args(node))
    return found


def test_every_section_model_lives_in_its_own_module_and_is_reexported():
    sections = _section_models()
    # cluster, model, training, parallel, the three cost models, network, fsdp, deepspeed, offload, memory, moe,
    # variation: a section lost from the walk would make the check below vacuous
    assert len(sections) == 14, sorted(sections)
    for where, model in sections.items():
        assert model.__module__ != "sim.spec.scenario", f"{where}: defined in the assembling module"
        if model.__module__.startswith("sim.spec."):
            assert getattr(scenario, model.__name__) is model, f"{where}: not re-exported by sim.spec.scenario"
            assert model.__name__ in scenario.__all__


@pytest.mark.parametrize("name", EXPORTED_BEFORE)
def test_every_name_imported_from_the_scenario_module_before_still_is(name: str):
    assert name in scenario.__all__
    value = getattr(scenario, name)
    home = getattr(value, "__module__", None)
    if isinstance(value, type) and home and home.startswith("sim."):
        assert getattr(importlib.import_module(home), name) is value  # the same object as at its new home


@pytest.mark.parametrize("path", SPEC_MODULES, ids=[path.stem for path in SPEC_MODULES])
def test_each_spec_module_says_what_goes_in_and_out(path):
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert "In:" in docstring and "Out:" in docstring, f"sim/spec/{path.name}: module docstring without In:/Out:"


def test_the_assembling_module_is_small():
    """The split's point: the sections' fields live beside their concept, not in one 700-line file."""
    lines = len((ROOT / "sim" / "spec" / "scenario.py").read_text().splitlines())
    assert lines < 250, f"sim/spec/scenario.py has {lines} lines: does a section model live there again?"


def test_each_scenario_rule_lives_in_its_concern_module():
    """``sim.spec.rules`` keeps the order and what each rule reads; the checks themselves live by concern
    (rules_layout, rules_training, rules_sharding, rules_moe, rules_cluster). A lambda adapting a one-argument
    check is the table's own."""
    from sim.spec.rules import RULES

    homes = {rule.check.__module__ for rule in RULES if rule.check.__name__ != "<lambda>"}
    assert homes == {f"sim.spec.rules_{concern}" for concern in ("layout", "training", "sharding", "moe", "cluster")}
