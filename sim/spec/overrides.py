"""Edits of a raw scenario mapping before it is validated: ``--set`` overrides, and file paths made absolute.

In: a scenario mapping as parsed from YAML (or a fragment of one) and ``--set a.b=value`` strings (each value parsed
as YAML), or a base directory. Out: the mapping with the overrides applied (``apply_overrides``; a shorthand such
as ``costs: roofline`` becomes a mapping when a key below it is set), the mapping or an override with its file
fields absolute (``absolute_paths``, ``absolute_override``: for a run in another directory), or one
``ConfigError`` naming the override. ``field_name``: a key as printed in an error line (quoted when odd).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sim.errors import ConfigError
from sim.model.hf_config import find_hf_config
from sim.spec.files import parse_yaml


def field_name(part: int | str) -> str:
    """A location part as printed: a key that is empty, padded or unprintable (a newline) is quoted, so the
    message stays on one line and still names it."""
    text = str(part)
    return text if text.isprintable() and text.strip() == text and text else repr(text)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` overrides (value parsed as YAML) to a raw scenario dict."""
    shorthand_key = {("costs",): "model", ("network",): "model", ("model",): "preset", ("cluster", "gpu"): "preset"}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected a.b=value")
        path_text, value_text = item.split("=", 1)
        keys = path_text.strip().split(".")
        path_text = ".".join(field_name(key) for key in keys)  # as printed in errors: one line, quoted if odd
        node: dict[str, Any] = data
        for depth, key in enumerate(keys[:-1]):
            child = node.get(key)
            if isinstance(child, str) and tuple(keys[: depth + 1]) in shorthand_key:
                child = {shorthand_key[tuple(keys[: depth + 1])]: child}
            if child is None:
                child = {}
            if not isinstance(child, dict):
                where = ".".join(map(field_name, keys[: depth + 1]))
                raise ConfigError(f"--set {path_text}: {where} is not a mapping")
            node[key] = child
            node = child
        node[keys[-1]] = parse_yaml(value_text, f"--set {path_text}")
    return data


def absolute_paths(data: dict[str, Any], base_dir: Path | str) -> dict[str, Any]:
    """A copy of a raw scenario mapping (or a fragment of one) whose file fields are absolute paths, resolved as
    validation resolves them: ``model`` (a ``config.json`` path or ``{hf_config: path, ...}``, found by
    ``find_hf_config``: the scenario's directory, then the working directory; left as written when neither has
    it, so the error stays the same) and ``costs.profile`` (against ``base_dir``, as
    ``Scenario._model_shorthand`` does). For a run elsewhere: a Dask worker started in another directory reads
    the same files (issue 26)."""
    base = Path(base_dir)
    data = dict(data)
    model = data.get("model")
    if isinstance(model, str) and model.endswith(".json"):
        found = find_hf_config(model, base)
        if found is not None:
            data["model"] = str(found.absolute())
    elif isinstance(model, dict) and isinstance(model.get("hf_config"), str):
        found = find_hf_config(model["hf_config"], base)
        if found is not None:
            data["model"] = {**model, "hf_config": str(found.absolute())}
    costs = data.get("costs")
    if isinstance(costs, dict) and isinstance(costs.get("profile"), str):
        data["costs"] = {**costs, "profile": str((base / costs["profile"]).absolute())}
    return data


def absolute_override(item: str, base_dir: Path | str) -> str:
    """A ``--set a.b=value`` override with a file value made absolute (``absolute_paths``); any other override,
    or one that does not parse (its error is the run's to report), as given."""
    try:
        fragment = apply_overrides({}, [item])
    except ConfigError:
        return item
    resolved = absolute_paths(fragment, base_dir)
    if resolved == fragment:
        return item
    key = item.split("=", 1)[0].strip()
    value: Any = resolved
    for part in key.split("."):
        value = value[part]
    return f"{key}={json.dumps(value)}"  # JSON is YAML: reads back as the same value
