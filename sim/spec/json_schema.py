"""The JSON Schema of a scenario file, for editors (YAML language server) and CI checks.

In: the ``Scenario`` model and the preset tables. Out: ``scenario_schema()``, a JSON Schema (draft 2020-12) that
accepts what ``sim.spec.scenario.load_scenario`` accepts, shorthands included; ``sim schema`` prints it.

The schema pydantic generates from ``Scenario`` describes the *validated* model, so it rejects every bundled
scenario: the loader's ``mode="before"`` validators expand shorthands first. This module widens exactly those
places, each listed with the validator it mirrors:

- unit strings (``"80 GiB"``, ``"400 Gb/s"``, ``"2 us"``, ``"989 TFLOPS"``): ``sim.units`` gives each quantity
  type its input schema (a number or a string matching ``sim.units.UNIT_PATTERNS``);
- ``model``: a preset name (``gpt3-175b``), a Hugging Face ``config.json`` path, ``{preset: name, ...overrides}``,
  ``{hf_config: path, ...overrides}`` or every field (``Scenario._model_source``);
- ``cluster.gpu``: a GPU preset name or ``{preset: name, ...overrides}`` (``ClusterSpec._gpu_preset``); ``cluster.
  node``: a node preset name; the link tiers, ``nics_per_node``, ``nvlink_domain`` and ``gpus_per_node`` come
  from the node preset and a tier may override some fields (``ClusterSpec._link_defaults``);
- ``costs`` and ``network``: the model name alone (``costs: roofline``), and ``costs`` without ``model`` is the
  roofline model (``Scenario._model_shorthand``);
- a top-level DeepSpeed ``zero_optimization`` block (``Scenario._deepspeed_block``).

Preset names are matched case-insensitively by the loader (``sim.spec.cluster.lookup``): the schema lists them
(``enum``, for completion) and also accepts any capitalisation. Because presets and defaults fill sub-sections,
only the scenario's own top-level keys are ``required``; a section's missing field is reported by the loader,
by name. Cross-field rules (``sim.spec.rules``) are the loader's, not the schema's.
"""

from __future__ import annotations

import re
from typing import Any

from sim.hardware.gpus import GPU_PRESETS
from sim.hardware.nodes import NODE_PRESETS
from sim.model.presets import MODEL_PRESETS
from sim.spec.scenario import Scenario

SCHEMA_URL = "https://json-schema.org/draft/2020-12/schema"


def _any_case(name: str) -> str:
    """A regex matching ``name`` in any capitalisation, without the ``(?i)`` flag ECMA-262 lacks."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in name)


def _preset_name(names: list[str], what: str) -> dict[str, Any]:
    return {"anyOf": [{"enum": names}, {"type": "string", "pattern": f"^(?:{'|'.join(map(_any_case, names))})$"}],
            "description": f"a {what} preset name (any capitalisation)"}


def _drop_required(node: Any) -> None:
    if isinstance(node, dict):
        node.pop("required", None)
        for value in node.values():
            _drop_required(value)
    elif isinstance(node, list):
        for value in node:
            _drop_required(value)


def scenario_schema() -> dict[str, Any]:
    """The scenario's JSON Schema (draft 2020-12), shorthands accepted (see the module docstring)."""
    schema = Scenario.model_json_schema(mode="validation")
    defs = schema["$defs"]
    required = schema.get("required", [])
    _drop_required(defs)
    props = schema["properties"]

    models = list(MODEL_PRESETS)
    defs["ModelSpec"]["properties"] = {
        "preset": _preset_name(models, "model"),
        "hf_config": {"type": "string", "description": "a Hugging Face config.json, relative to the scenario"},
        **defs["ModelSpec"]["properties"],
    }
    props["model"] = {"anyOf": [
        _preset_name(models, "model"),
        {"type": "string", "pattern": r"\.json$", "description": "a Hugging Face config.json path"},
        {"$ref": "#/$defs/ModelSpec"},
    ], "description": "a model preset, a config.json path, {preset: name, ...} / {hf_config: path, ...} "
                      "with overrides, or every field"}

    gpus = list(GPU_PRESETS)
    defs["GpuSpec"]["properties"] = {"preset": _preset_name(gpus, "GPU"), **defs["GpuSpec"]["properties"]}
    cluster = defs["ClusterSpec"]["properties"]
    cluster["gpu"] = {"anyOf": [_preset_name(gpus, "GPU"), {"$ref": "#/$defs/GpuSpec"}]}
    cluster["node"] = {"anyOf": [_preset_name(list(NODE_PRESETS), "node"), {"type": "null"}],
                       "description": cluster["node"].get("description", "")}

    costs = props["costs"]
    variants = costs.get("oneOf") or costs["anyOf"]
    names = [ref["$ref"].rsplit("/", 1)[1] for ref in variants]
    cost_models = [defs[name]["properties"]["model"]["const"] for name in names]
    props["costs"] = {"anyOf": [{"enum": cost_models}, *variants],
                      "description": "a cost model name, or its section (model defaults to roofline)"}
    network_models = defs["NetworkSpec"]["properties"]["model"]["enum"]
    props["network"] = {"anyOf": [{"enum": network_models}, {"$ref": "#/$defs/NetworkSpec"}],
                        "description": "a network model name, or its section"}
    props["zero_optimization"] = {
        "type": "object", "description": "a DeepSpeed zero_optimization block (sets parallel.zero, "
                                         "parallel.dp_bucket_size, deepspeed and offload)"}

    schema["required"] = required
    schema["$schema"] = SCHEMA_URL
    schema["title"] = "clustersim scenario"
    return schema
