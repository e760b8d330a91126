"""``sim schema``: the scenario's JSON Schema accepts what the loader accepts, shorthands included, and every
bundled scenario names it in its YAML language-server header."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest
import yaml

from sim.errors import ConfigError
from sim.spec.json_schema import scenario_schema
from sim.spec.scenario import load_scenario, scenario_from_dict

from conftest import SCENARIOS

SCHEMA_FILE = SCENARIOS / "scenario.schema.json"
# Sweep files (base + grid) are not scenarios: sim sweep reads them.
BUNDLED = sorted(p for p in SCENARIOS.rglob("*.yaml") if "sweeps" not in p.relative_to(SCENARIOS).parts)


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = scenario_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_bundled_schema_file_is_the_generated_one_and_every_scenario_names_it():
    assert json.loads(SCHEMA_FILE.read_text()) == scenario_schema(), \
        "scenarios/scenario.schema.json is stale: python -m sim schema > scenarios/scenario.schema.json"
    assert len(BUNDLED) > 80
    for path in BUNDLED:
        first = path.read_text().splitlines()[0]
        rel = os.path.relpath(SCHEMA_FILE, path.parent)
        assert first == f"# yaml-language-server: $schema={rel}", path


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: str(p.relative_to(SCENARIOS)))
def test_every_bundled_scenario_the_loader_accepts_validates(path: Path, validator):
    data = yaml.safe_load(path.read_text())
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(data)]
    try:
        load_scenario(path)
    except ConfigError as error:  # scenarios waiting for a knob this branch lacks: the schema refuses them too
        if "not modelled" in str(error):  # a knob the schema has, whose mechanism a rule refuses (moe.a2a_overlap)
            assert errors == [], errors
            return
        assert "unknown key" in str(error), str(error)
        assert any("Additional properties" in e for e in errors), errors
        return
    assert errors == []


SHORTHANDS = {
    "model preset": {"model": "gpt3-175b"},
    "model preset, other case": {"model": "GPT3-175B"},
    "preset with overrides": {"model": {"preset": "llama2-7b", "num_layers": 4}},
    "gpu preset with overrides": {"cluster": {"gpu": {"preset": "H100-SXM", "hbm_capacity": "96 GiB"},
                                              "nodes": 1, "gpus_per_node": 8}},
    "link override with units": {"cluster": {"gpu": "H100-SXM", "nodes": 1, "intra_node": {"bandwidth": "450 GB/s"},
                                             "inter_node": {"bandwidth": "400 Gb/s", "latency": "5 us"}}},
    "costs name": {"costs": "roofline"},
    "costs without model": {"costs": {"launch_overhead": "4 us"}},
    "network name": {"network": "contention"},
    "deepspeed block": {"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}},
    "bytes number": {"parallel": {"dp_bucket_size": 26214400}},
}
BASE = {"name": "t", "cluster": {"gpu": "H100-SXM", "nodes": 1}, "model": "llama2-7b",
        "training": {"global_batch": 8, "seq_len": 1024}}


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            and key not in ("model",) else value
    return out


@pytest.mark.parametrize("name", sorted(SHORTHANDS))
def test_each_shorthand_is_accepted_by_both(name: str, validator):
    data = _merge(BASE, SHORTHANDS[name])
    scenario_from_dict(data)  # the loader accepts it
    assert [e.message for e in validator.iter_errors(data)] == []


@pytest.mark.parametrize("extra, where", [
    ({"parallel": {"tpp": 2}}, "parallel"),  # a typo
    ({"cluster": {"gpu": "H100-SXM", "nodes": 1, "intra_node": {"bandwidth": "450 GB"}}}, "bandwidth"),  # no /s
    ({"costs": "rooflin"}, "costs"),
    ({"training": {"global_batch": 8, "dtype": "bf17"}}, "dtype"),
    ({"model": "gpt3-176b"}, "model"),
])
def test_what_the_loader_refuses_the_schema_refuses(extra, where, validator):
    data = _merge(BASE, extra)
    with pytest.raises(ConfigError):
        scenario_from_dict(data)
    errors = list(validator.iter_errors(data))
    assert errors and any(where in ".".join(map(str, e.absolute_path)) + e.message for e in errors)
