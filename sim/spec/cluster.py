"""The cluster part of a scenario: GPUs, nodes, NVLink domains, NICs, fabric and links.

In: the ``cluster:`` mapping of a scenario (GPU preset name or fields, node preset, overrides). Out: a frozen
``ClusterSpec`` in SI units with every default taken from the node preset (``dgx-a100``, ``dgx-h100``,
``hgx-h800``, ``dgx-b200``, ``gb200-nvl72``, or the GPU's usual node), and the preset-expansion helpers the
scenario uses for its other presets. Errors are ``ValueError`` with a one-line message naming the field.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from sim.hardware.frozen import FrozenSpec
from sim.hardware.gpus import GPU_PRESETS, GpuSpec
from sim.hardware.links import LinkSpec
from sim.hardware.nodes import DEFAULT_NODE_FOR_GPU, NODE_PRESETS, FabricSpec


def lookup(presets: dict[str, Any], name: str, what: str) -> Any:
    by_lower = {key.lower(): value for key, value in presets.items()}
    if name.lower() not in by_lower:
        raise ValueError(f"unknown {what} preset {name!r} (known: {', '.join(presets)})")
    return by_lower[name.lower()]


def expand_preset(value: Any, presets: dict[str, Any], what: str) -> Any:
    """``"name"`` or ``{preset: name, **overrides}`` -> the preset's fields with the overrides applied."""
    if isinstance(value, str):
        return lookup(presets, value, what).model_dump()
    if isinstance(value, dict) and "preset" in value:
        fields = lookup(presets, str(value["preset"]), what).model_dump()
        fields.update({k: v for k, v in value.items() if k != "preset"})
        return fields
    return value


class ClusterSpec(FrozenSpec):
    """GPUs, how they are packed into nodes and NVLink domains, and the links between them. Everything but
    ``gpu`` and ``nodes`` defaults from the node preset (``node``, or the GPU's usual node)."""

    gpu: GpuSpec
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    node: str | None = Field(default=None, description="node preset (dgx-a100, dgx-h100, hgx-h800, dgx-b200, "
                                   "gb200-nvl72, hgx-h20, gb300-nvl72, amd-mi300x-platform)")
    intra_node: LinkSpec
    inter_node: LinkSpec = Field(description="InfiniBand, per NIC")
    nics_per_node: int = Field(ge=1)
    nvlink_domain: int = Field(ge=1, description="GPUs that share one NVSwitch domain")
    nvls: LinkSpec | None = None
    all_to_all: LinkSpec | None = Field(default=None, description="NVLink under NCCL's all-to-all; None: intra_node")
    pcie: LinkSpec
    fabric: FabricSpec = FabricSpec()
    price_per_gpu_hour: float | None = Field(default=None, ge=0, description=(
        "what one GPU-hour costs (any currency): the summary's cost of a training.train_tokens budget"))

    @model_validator(mode="before")
    @classmethod
    def _link_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        gpu = data.get("gpu")
        if not isinstance(gpu, (str, dict)) or not isinstance(data.get("gpus_per_node", 0), int):
            return data  # a wrongly typed gpu or gpus_per_node: its field's own validation names it
        gpu_name = gpu if isinstance(gpu, str) else (gpu or {}).get("preset") or (gpu or {}).get("name")
        by_lower = {k.lower(): v for k, v in DEFAULT_NODE_FOR_GPU.items()}
        node_name = data.get("node") or by_lower.get(str(gpu_name).lower())
        if node_name is None:
            if isinstance(gpu, str):
                return data  # not a known preset: the gpu field reports it by name
            if not (isinstance(data.get("intra_node"), dict) and isinstance(data.get("inter_node"), dict)):
                raise ValueError(f"no link preset for GPU {gpu_name!r}: give cluster.node or both link tiers")
            data.setdefault("pcie", {"bandwidth": 64e9, "latency": 1e-6, "efficiency": 0.8})
            data.setdefault("nics_per_node", data.get("gpus_per_node"))
            data.setdefault("nvlink_domain", data.get("gpus_per_node"))
            return data
        node = lookup(NODE_PRESETS, str(node_name), "node")
        data["node"] = node.name
        tiers = ("intra_node", "inter_node", "pcie", "nvls", "all_to_all")
        if any(data.get(tier) is not None and not isinstance(data.get(tier), dict) for tier in tiers):
            return data  # a tier given as a scalar or list: its field's own validation names it
        given_all_to_all = dict(data.get("all_to_all") or {})
        for tier in tiers:
            preset = getattr(node, tier)
            if preset is None:
                continue
            fields = preset.model_dump()
            fields.update(data.get(tier) or {})
            data[tier] = fields
        if data.get("all_to_all") is not None and "bandwidth" not in given_all_to_all:
            # The all-to-all tier is the same NVLink: its line rate follows an intra_node override.
            data["all_to_all"] = {**data["all_to_all"], "bandwidth": data["intra_node"]["bandwidth"]}
        data.setdefault("gpus_per_node", node.gpus_per_node)
        data.setdefault("nics_per_node", node.nics_per_node * data["gpus_per_node"] // node.gpus_per_node)
        # A node-sized preset domain follows the node size; a multi-node one (NVL72) is kept.
        node_sized = node.nvlink_domain == node.gpus_per_node
        data.setdefault("nvlink_domain", data["gpus_per_node"] if node_sized else node.nvlink_domain)
        return data

    @model_validator(mode="after")
    def _shape(self) -> ClusterSpec:
        if self.nvlink_domain % self.gpus_per_node:
            raise ValueError(f"nvlink_domain: {self.nvlink_domain} GPUs is not whole nodes of "
                             f"{self.gpus_per_node}")
        # A GPU count that is not a multiple of the domain fills whole domains and a partial last one (whole
        # nodes: 256 GB200 GPUs = 3 NVL72 racks + 10 trays of a fourth, as jobs are placed on NVL72 racks: an
        # NVLink partition is any set of trays of one rack). Rank r is in domain r // nvlink_domain.
        return self

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu_preset(cls, value: Any) -> Any:
        return expand_preset(value, GPU_PRESETS, "GPU")

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node
