"""summary.json: a ``schema_version`` and the same key set in every mode (optional figures null), valid against
the JSON Schema generated from ``Summary`` (docs/summary.schema.json, kept in step with the code)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

import sim
from sim.output.summary import OPTIONAL_FIELDS, SCHEMA_VERSION, Summary, json_schema

from conftest import SCENARIOS

ROOT = Path(__file__).resolve().parents[1]
MODES = {
    "plain": [],
    "all-ranks": ["ranks=all"],
    "contention": ["network.model=contention", "ranks=all", "network.nccl_sms=8"],
}


@pytest.fixture(scope="module")
def summaries() -> dict[str, dict]:
    return {mode: json.loads(json.dumps(sim.run(SCENARIOS / "tiny.yaml", overrides).summary.to_dict()))
            for mode, overrides in MODES.items()}


def test_every_mode_has_the_same_keys_and_a_schema_version(summaries):
    keys = {mode: list(data) for mode, data in summaries.items()}
    assert keys["plain"] == keys["all-ranks"] == keys["contention"]
    assert keys["plain"][0] == "schema_version" and summaries["plain"]["schema_version"] == SCHEMA_VERSION
    plain = summaries["plain"]
    # in the plain mode every optional figure is null; the contention mode fills the network's ones
    assert {name for name in OPTIONAL_FIELDS if plain[name] is not None} == set()
    assert summaries["contention"]["busiest_links"] and summaries["contention"]["critical_rank"] is not None


def test_every_mode_validates_against_the_generated_schema(summaries):
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    for data in summaries.values():
        jsonschema.validate(data, schema, cls=jsonschema.Draft202012Validator)
    broken = {k: v for k, v in summaries["plain"].items() if k != "step_time_s"}
    with pytest.raises(jsonschema.ValidationError, match="step_time_s"):
        jsonschema.validate(broken, schema, cls=jsonschema.Draft202012Validator)


def test_the_documented_schema_is_the_generated_one():
    written = json.loads((ROOT / "docs" / "summary.schema.json").read_text())
    assert written == json_schema(), "docs/summary.schema.json is stale: python -m sim schema summary > it"
    documented = (ROOT / "docs" / "summary.md").read_text()
    missing = [key for key in json_schema()["properties"] if f"`{key}`" not in documented]
    assert not missing, f"docs/summary.md does not describe {missing}"


def test_another_schema_version_is_refused(summaries):
    assert Summary.from_dict(summaries["plain"]).to_dict()["schema_version"] == SCHEMA_VERSION
    with pytest.raises(TypeError, match="schema_version 99"):
        Summary.from_dict({**summaries["plain"], "schema_version": 99})


def test_parameters_are_reported_total_and_active_for_moe(summaries):
    from sim.cli.tables import parameters_line
    from sim.model.presets import MODEL_PRESETS

    assert summaries["plain"]["parameters_total"] == 103_864_320  # tiny.yaml's model, as sim check prints it
    assert summaries["plain"]["parameters_active"] is None  # dense
    # Mixtral 8x7B's model card: 46.7B parameters, 12.9B used per token
    line = parameters_line(MODEL_PRESETS["mixtral-8x7b"])
    assert line.startswith("parameters: 46.7 B (") and ", 12.9 B active per token (" in line
