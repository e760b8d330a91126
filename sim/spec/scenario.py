"""Scenario files: the one boundary where YAML becomes typed specs.

In: a scenario YAML path (or a dict) and ``--set a.b=value`` overrides. Out: a frozen ``Scenario`` in SI
units with every default filled (GPU and model presets expanded, link defaults from the node preset), or a
``ConfigError`` whose one-line message names the field and the rule, e.g.
``parallel: tp*pp*dp = 96 but the cluster has 64 GPUs``.

Shorthands: ``model: gpt3-175b`` (preset), ``model: path/config.json`` (Hugging Face config, relative to the
scenario file), ``model: {preset: llama2-7b, num_layers: 4}`` (preset with overrides); the same
``preset`` form for ``cluster.gpu``; ``costs: roofline`` and ``network: analytic`` for ``{model: ...}``.

This module assembles the sections, one module each: ``cluster`` (``sim.spec.cluster``), ``training``
(``sim.spec.training``, with ``sim.spec.sequence`` and ``sim.spec.method``), ``parallel`` (``sim.spec.parallel``),
``moe`` (``sim.spec.moe``), ``fsdp``, ``deepspeed``, ``offload`` and the ``zero_optimization`` block
(``sim.spec.sharding``), ``memory`` (``sim.spec.memory``), ``costs`` (``sim.spec.costs``), ``network``
(``sim.spec.network``) and ``variation`` (``sim.spec.variation``); the file is read by ``sim.spec.files`` and
edited by ``--set`` in ``sim.spec.overrides``. It re-exports their names, so ``from sim.spec.scenario import X``
reaches any of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from sim.errors import ConfigError
from sim.hardware.frozen import FrozenSpec
from sim.model.hf_config import read_hf_config
from sim.model.presets import MODEL_PRESETS
from sim.model.transformer import ModelSpec
from sim.spec.cluster import ClusterSpec, expand_preset
from sim.spec.costs import CalibratedCostsSpec, FixedCostsSpec, KernelCostsSpec, RooflineCostsSpec
from sim.spec.degrees import degrees
from sim.spec.files import MAX_DEPTH, MAX_FILE_BYTES, parse_yaml, read_text
from sim.spec.memory import MemorySpec
from sim.spec.method import LoraSpec, QloraSpec
from sim.spec.moe import MoeSpec
from sim.spec.network import NetworkSpec
from sim.spec.overrides import absolute_override, absolute_paths, apply_overrides, field_name
from sim.spec.parallel import MiB, ParallelSpec
from sim.spec.rules import check_rules
from sim.spec.sequence import SequenceSpec
from sim.spec.sharding import DeepSpeedSpec, FsdpSpec, OffloadSpec, zero_optimization
from sim.spec.training import RecomputeModule, TrainingSpec
from sim.spec.variation import VariationSpec

# The names this module has always exported, now defined beside their sections (imported above).
__all__ = [
    "MAX_DEPTH", "MAX_FILE_BYTES", "MAX_NAME_CHARS", "MiB", "CalibratedCostsSpec", "ClusterSpec", "DeepSpeedSpec",
    "FixedCostsSpec", "FsdpSpec", "KernelCostsSpec", "LoraSpec", "MemorySpec", "MoeSpec", "NetworkSpec",
    "OffloadSpec", "ParallelSpec", "QloraSpec", "RecomputeModule", "RooflineCostsSpec", "Scenario", "SequenceSpec",
    "TrainingSpec", "VariationSpec", "absolute_override", "absolute_paths", "apply_overrides", "check_rules",
    "load_scenario", "parse_yaml", "read_text", "resolved_yaml", "scenario_from_dict",
]

MAX_NAME_CHARS = 200  # names are printed in titles and file headers


def _shorthand(value: Any) -> Any:
    return {"model": value} if isinstance(value, str) else value


class Scenario(FrozenSpec):
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    seed: int = 0
    cluster: ClusterSpec
    model: ModelSpec
    training: TrainingSpec
    parallel: ParallelSpec = ParallelSpec()
    schedule: Literal["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipe", "dualpipev"] = "1f1b"
    costs: Annotated[FixedCostsSpec | RooflineCostsSpec | CalibratedCostsSpec,
                     Field(discriminator="model")] = RooflineCostsSpec()
    network: NetworkSpec = NetworkSpec()
    ranks: Literal["slice", "all"] = Field(default="slice", description="slice: one rank per pipeline stage "
                                           "(symmetric groups costed whole); all: every rank")
    fold_tp: bool = Field(default=True, description="ranks: all: one process per TP group when its ranks are in "
                          "lockstep (same times, 1/tp of the tasks); false keeps every rank in the trace")
    engine: Literal["auto", "event"] = Field(default="auto", description="auto: exact longest-path evaluation "
                                             "when no time depends on contention, else the simpy replay")
    fsdp: FsdpSpec | None = None
    deepspeed: DeepSpeedSpec | None = Field(default=None, description="DeepSpeed ZeRO's communication granularity "
                                            "(set by a zero_optimization block)")
    offload: OffloadSpec = OffloadSpec()
    memory: MemorySpec = MemorySpec()
    moe: MoeSpec = MoeSpec()
    variation: VariationSpec = VariationSpec()

    @model_validator(mode="before")
    @classmethod
    def _deepspeed_block(cls, data: Any) -> Any:
        """A DeepSpeed ``zero_optimization`` block sets parallel.zero and the gradient bucket size
        (``sim.spec.sharding.zero_optimization``)."""
        return zero_optimization(data)

    @field_validator("costs", "network", mode="before")
    @classmethod
    def _model_shorthand(cls, value: Any, info: ValidationInfo) -> Any:
        value = _shorthand(value)
        if info.field_name == "costs" and isinstance(value, dict) and "model" not in value:
            value = {**value, "model": "roofline"}  # the default model, so `--set costs.x=...` needs no tag
        if isinstance(value, dict) and value.get("model") == "calibrated" and isinstance(value.get("profile"), str):
            base_dir = Path((info.context or {}).get("base_dir", "."))
            value = {**value, "profile": str(base_dir / value["profile"])}  # an absolute path stays as it is
        return value

    @field_validator("model", mode="before")
    @classmethod
    def _model_source(cls, value: Any, info: ValidationInfo) -> Any:
        base_dir = Path((info.context or {}).get("base_dir", "."))
        if isinstance(value, str) and value.endswith(".json"):
            value = {"hf_config": value}
        if isinstance(value, dict) and "hf_config" in value:
            overrides = {k: v for k, v in value.items() if k != "hf_config"}
            fields = read_hf_config(str(value["hf_config"]), base_dir)
            fields.update(overrides)
            return fields
        return expand_preset(value, MODEL_PRESETS, "model")

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Scenario:
        check_rules(self)  # sim.spec.rules: the cross-field rules, each naming its field
        return self


def _format_error(error: ValidationError) -> str:
    first = error.errors()[0]
    # "fixed" / "roofline" after a field are a tagged union's tags, not keys; a top-level key of that name is one
    loc = ".".join(field_name(part) for i, part in enumerate(first["loc"])
                   if i == 0 or part not in ("fixed", "roofline"))
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown key"
    more = error.error_count() - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{loc}: {message}{suffix}" if loc else f"{message}{suffix}"


def scenario_from_dict(data: dict[str, Any], base_dir: Path | str = ".") -> Scenario:
    try:
        return Scenario.model_validate(data, context={"base_dir": str(base_dir)})
    except ValidationError as error:
        raise ConfigError(_format_error(error)) from None


def load_scenario(path: Path | str, overrides: list[str] | None = None) -> Scenario:
    path = Path(path)
    data = parse_yaml(read_text(path, "scenario"), f"scenario {path}")
    if not isinstance(data, dict):
        raise ConfigError(f"scenario: {path} must be a mapping of keys (name, cluster, model, ...)")
    return scenario_from_dict(apply_overrides(data, overrides or []), base_dir=path.parent)


def resolved_yaml(scenario: Scenario) -> str:
    """The scenario with every default filled and units written out (the batch and degrees the knobs imply
    included); loading it gives the same Scenario."""
    data = scenario.model_dump(mode="json")
    implied = degrees(scenario)
    data["training"]["seq_len"] = implied.seq_len
    data["training"]["global_batch"] = implied.global_batch
    data["training"]["microbatches"] = implied.microbatches
    data["parallel"]["dp"] = implied.dp
    return yaml.safe_dump(data, sort_keys=False)
