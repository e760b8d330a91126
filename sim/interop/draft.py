"""A scenario being built from a launch configuration, and the report of where each field came from.

In: scenario fields set one by one by an importer (``Draft.put``), each with the flag or key it came from, and the
rows for what was not mapped (``Draft.row``); the cluster and model options the configuration does not carry
(``Options``). Out: the scenario dict, the validated ``Scenario`` (a rule it breaks is reported naming the flag
that set the field, ``Draft.scenario``), and the report rows (``Row``), one per flag or key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sim.errors import ConfigError
from sim.hardware.gpus import GPU_PRESETS
from sim.hardware.nodes import DEFAULT_NODE_FOR_GPU, NODE_PRESETS
from sim.model.hf_config import read_hf_config
from sim.model.presets import MODEL_PRESETS
from sim.spec.scenario import Scenario, scenario_from_dict

# mapped: the value sets a scenario field; default: the framework's default, written out where it differs from
# the scenario's; unmapped: it changes the step but is not modelled (the note says how it is approximated);
# ignored: it does not change one step's time or memory (paths, logging, learning rate, data); unknown: not
# recognised (listed so the user can judge).
Status = Literal["mapped", "default", "unmapped", "ignored", "unknown"]
STATUSES: tuple[Status, ...] = ("mapped", "default", "unmapped", "ignored", "unknown")


@dataclass(frozen=True)
class Row:
    """One flag or key of the input: as written (``source``, ``value``), what became of it and why."""

    source: str
    value: str
    status: Status
    target: str = ""
    note: str = ""


@dataclass(frozen=True)
class Options:
    """What the command line adds to the file: the GPU preset, the cluster size (``gpus`` in all, or ``nodes``
    x ``gpus_per_node``), the model (a preset name or an HF ``config.json`` path: the shape the flags do not
    give, e.g. the vocabulary, which comes from the tokenizer) and the scenario's name."""

    gpu: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    gpus: int | None = None
    model: str | None = None
    name: str | None = None


def text(value: Any) -> str:
    """A value as the report prints it (a long list cut to 60 characters)."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    shown = "" if value is None else str(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


@dataclass
class Draft:
    framework: str
    data: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    origin: dict[str, str] = field(default_factory=dict)  # scenario field -> the flag that set it

    def put(self, target: str, value: Any, source: str, raw: Any = None, note: str = "",
            status: Status = "mapped") -> None:
        """Set scenario field ``target`` (dotted) to ``value``, reporting ``source`` (as written: ``raw``)."""
        node = self.data
        keys = target.split(".")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
        if status == "mapped":  # what a broken rule is blamed on: the user's own flags
            self.origin.setdefault(target, source)
        shown = text(raw if raw is not None else value)
        self.rows.append(Row(source, shown, status, f"{target} = {text(value)}", note))

    def row(self, source: str, raw: Any, status: Status, note: str = "", target: str = "") -> None:
        self.rows.append(Row(source, text(raw), status, target, note))

    def get(self, target: str) -> Any:
        node: Any = self.data
        for key in target.split("."):
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node

    def scenario(self) -> Scenario:
        """The scenario, validated; a rule it breaks is one line naming the flag that set the field."""
        try:
            return scenario_from_dict(self.data)
        except ConfigError as error:
            message = str(error)
            field_name = message.split(":", 1)[0]
            sources = [source for target, source in self.origin.items()
                       if target == field_name or target.startswith(field_name + ".")
                       or field_name.startswith(target + ".")]
            if sources:
                raise ConfigError(f"{message} (set by {', '.join(dict.fromkeys(sources))})") from None
            raise


def refuse(message: str) -> ConfigError:
    """A contradictory or unusable input: one line, naming the flag first."""
    return ConfigError(message)


def cluster(draft: Draft, options: Options, nodes: tuple[int, str] | None = None,
            per_node: tuple[int, str] | None = None, world: tuple[int, str] | None = None) -> int:
    """cluster.gpu / nodes / gpus_per_node from the options, else from what the file says (``nodes``,
    ``per_node``, ``world``: value and the flag that gave it). Returns the GPU count."""
    if not options.gpu:
        raise refuse(f"--gpu: the {draft.framework} configuration does not say which GPU; give --gpu "
                     f"(a preset: {', '.join(GPU_PRESETS)})")
    by_lower = {name.lower(): name for name in GPU_PRESETS}
    starting = [name for name in GPU_PRESETS if name.lower().startswith(options.gpu.lower())]
    if options.gpu.lower() not in by_lower and len(starting) != 1:  # "h100" is H100-SXM; "a100" is ambiguous
        raise refuse(f"--gpu: unknown GPU preset {options.gpu!r} (known: {', '.join(GPU_PRESETS)})")
    gpu = by_lower.get(options.gpu.lower()) or starting[0]
    draft.put("cluster.gpu", gpu, "--gpu")
    preset_per_node = NODE_PRESETS[DEFAULT_NODE_FOR_GPU[gpu]].gpus_per_node
    if options.gpus_per_node:
        gpn, gpn_source = options.gpus_per_node, "--gpus-per-node"
    elif per_node is not None:
        gpn, gpn_source = per_node
    else:
        gpn, gpn_source = preset_per_node, f"(the {DEFAULT_NODE_FOR_GPU[gpu]} node)"
    if options.gpus:
        total, total_source = options.gpus, "--gpus"
    elif options.nodes:
        total, total_source = options.nodes * gpn, "--nodes"
    elif nodes is not None and per_node is not None and not options.gpus_per_node:
        total, total_source = nodes[0] * gpn, f"{nodes[1]} x {per_node[1]}"
    elif nodes is not None:
        total, total_source = nodes[0] * gpn, nodes[1]
    elif world is not None:
        total, total_source = world
    else:
        raise refuse(f"--gpus: the {draft.framework} configuration does not say how many GPUs; give --gpus "
                     "(or --nodes)")
    if total < 1 or gpn < 1:
        raise refuse(f"{total_source}: needs at least one GPU (got {total})")
    gpn = min(gpn, total)
    if total % gpn:
        raise refuse(f"{total_source}: {total} GPUs are not whole nodes of {gpn} ({gpn_source})")
    raw = options.nodes if total_source == "--nodes" else total
    draft.put("cluster.nodes", total // gpn, total_source, raw)
    draft.put("cluster.gpus_per_node", gpn, gpn_source)
    return total


def base_model(options: Options) -> tuple[dict[str, Any], str]:
    """The model the flags start from: ``--model`` as a preset's fields or an HF config's, and its label."""
    if not options.model:
        return {}, ""
    if options.model.endswith(".json"):
        path = Path(options.model).resolve()
        try:
            return read_hf_config(str(path), Path(".")), f"--model {options.model}"
        except ValueError as error:
            raise refuse(f"--model: {error}") from None
    by_lower = {name.lower(): spec for name, spec in MODEL_PRESETS.items()}
    if options.model.lower() not in by_lower:
        raise refuse(f"--model: unknown model preset {options.model!r} (known: {', '.join(MODEL_PRESETS)}; or a "
                     "Hugging Face config.json path)")
    return by_lower[options.model.lower()].model_dump(), f"--model {options.model}"


class ModelDraft:
    """The model's fields: the base (``--model``) overridden by the configuration's shape flags, each override
    reported. The scenario's ``model`` is the preset's name with the fields that differ from it, or every field
    (flags alone, or an HF config's fields)."""

    def __init__(self, draft: Draft, options: Options) -> None:
        self.draft = draft
        self.base, self.base_label = base_model(options)
        self.fields: dict[str, Any] = dict(self.base)

    def set(self, key: str, value: Any, source: str, raw: Any = None, note: str = "",
            status: Status = "mapped") -> None:
        self.fields[key] = value
        self.draft.row(source, raw if raw is not None else value, status, note, f"model.{key} = {text(value)}")
        self.draft.origin.setdefault(f"model.{key}", source)

    def finish(self, required: tuple[str, ...] = ("num_layers", "hidden_size", "num_attention_heads",
                                                  "vocab_size", "max_seq_len")) -> None:
        missing = [key for key in required if self.fields.get(key) is None]
        if missing:
            raise refuse(f"model.{missing[0]}: the {self.draft.framework} configuration does not give it; pass "
                         "--model PRESET or --model config.json (a Hugging Face config)")
        if self.base:
            self.draft.row(self.base_label, "", "mapped", "the shape the configuration does not set",
                           f"model = {self.base.get('name', '')}")
        self.fields.setdefault("name", "imported")
        name = str(self.base.get("name", ""))
        if self.base and not self.base_label.endswith(".json") and name in MODEL_PRESETS:
            changed = {key: value for key, value in self.fields.items() if self.base.get(key) != value}
            self.draft.data["model"] = {"preset": name, **changed} if changed else name
        else:
            self.draft.data["model"] = dict(self.fields)
