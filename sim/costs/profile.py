"""Calibration profiles: what a device measured, in the form the cost model and the network use.

In: a profile file (JSON, written by ``sim calibrate`` or by ``scripts/fit_default_profiles.py``), or a GPU
preset name for the shipped default profiles. Out: a frozen ``Profile``: per dtype, the achieved GEMM FLOP/s
as a curve over the GEMM's FLOPs (``gemm_rate``: knots interpolated linearly in log2-log2 space, clamped at
both ends); the achieved device-copy bandwidth; the end-to-end factor on every kernel's time (one per GPU type,
fitted on named rows; 1 for a measured profile); and optional link tiers (``intra_node`` / ``inter_node`` /
``nvls`` / ``all_to_all`` fields of ``sim.hardware.links.LinkSpec``: latencies, plateau efficiency, efficiency curve,
line rate).
``ProfileError`` (a ``ValueError``) says in one line what a profile lacks.

Why FLOPs as the shape axis: on OpenXLA's H100 table a GEMM's efficiency is set mostly by its size (for m, n,
k >= 1024 the spread at equal FLOPs is under 10%), and a single axis interpolates without holes.
"""

from __future__ import annotations

import json
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveFloat, ValidationError

from sim.hardware.frozen import FrozenSpec
from sim.hardware.links import LinkSpec, interpolate_log2

FORMAT = "clustersim-profile"
VERSION = 1
# Which shipped profile stands in for a GPU preset (same chip, or the closest measured one).
DEFAULT_PROFILE_FOR_GPU = {"H100-SXM": "H100", "H800-SXM": "H100", "H200": "H100", "B200": "B200",
                           "GB200": "B200", "A100-40GB-SXM": "A100", "A100-80GB-SXM": "A100"}


class ProfileError(ValueError):
    pass


class DeviceInfo(FrozenSpec):
    kind: str = Field(description="cuda or cpu")
    name: str
    versions: dict[str, str] = {}
    date: str = ""
    host: str = ""


class GemmCurve(FrozenSpec):
    rate: tuple[tuple[float, float], ...] = Field(description="knots (GEMM FLOPs, achieved FLOP/s)")
    peak_flops: float | None = Field(default=None, description="the device's dense peak, when known")


class AttentionCurves(FrozenSpec):
    """One attention kernel's achieved rate per pass, as knots over the forward's FLOPs as the simulator prices
    them (``Op.executed_flops``; causal: 4 b h s^2 d x causal_fraction, ``sim.calibrate.compute.attention_flops``).
    The backward's rate is its counted FLOPs
    (twice the forward's) over its measured time: whatever the kernel recomputes (FlashAttention's backward
    recomputes the scores: 2.5x the forward's multiply-adds, Dao et al. 2022 Sec. 3.1) lands in that rate."""
    # At least one knot of positive numbers each: an empty curve read 1 FLOP/s (interpolate_log2), a day per GFLOP.
    forward: tuple[tuple[PositiveFloat, PositiveFloat], ...] = Field(
        min_length=1, description="knots (forward FLOPs, achieved FLOP/s)")
    backward: tuple[tuple[PositiveFloat, PositiveFloat], ...] = Field(
        min_length=1, description="knots (forward FLOPs, backward FLOPs / s)")
    head_dim: int = Field(default=128, description="the head dimension measured")

    def rate(self, phase: str, forward_flops: float) -> float:
        knots = self.forward if phase == "forward" else self.backward
        return interpolate_log2(knots, forward_flops, log_y=True)


class Profile(FrozenSpec):
    format: str = FORMAT
    version: int = VERSION
    device: DeviceInfo
    gemm: dict[str, GemmCurve] = Field(description="per dtype (fp32, tf32, fp16, bf16, fp8)")
    copy_bandwidth: float | None = Field(default=None, description="achieved device-copy bytes/s")
    # The backends sim calibrate measures (sim.calibrate.compute.ATTENTION_BACKENDS): a misspelt one was ignored,
    # its kernel priced on the GEMM curve without a word.
    attention: dict[Literal["fused", "flash", "math"], AttentionCurves] = Field(default_factory=dict, description=(
        "causal bf16 attention kernels per backend (fused: cuDNN / Transformer Engine FusedAttention; flash: "
        "FlashAttention-2), measured by sim calibrate; a backend without curves prices on the GEMM curve"))
    end_to_end_factor: float = Field(default=1.0, gt=0, description=(
        "every kernel's time x this: the GPU type's one end-to-end calibration (what a burst microbenchmark does "
        "not see in a training run: sustained clocks, kernel gaps, shapes off the benchmark's best), fitted by "
        "scripts/fit_default_profiles.py on named 'fit' rows; 1 = the measured curves as they are"))
    end_to_end_source: str = Field(default="", description="the rows the factor was fitted on")
    intra_node: dict[str, Any] | None = None
    inter_node: dict[str, Any] | None = None
    nvls: dict[str, Any] | None = Field(default=None, description="NVLink SHARP all-reduce (nccl-tests import)")
    all_to_all: dict[str, Any] | None = Field(default=None, description="NVLink under NCCL's all-to-all")
    source: str = ""

    def gemm_rate(self, dtype: str, flops: float) -> float:
        if dtype not in self.gemm:
            raise ProfileError(f"profile ({self.device.name}) has no {dtype} GEMM measurements "
                               f"(it has: {', '.join(sorted(self.gemm)) or 'none'})")
        return interpolate_log2(self.gemm[dtype].rate, flops, log_y=True)

    def link(self, tier: str, base: LinkSpec) -> LinkSpec:
        """``base`` with the fields this profile measured for ``tier`` (intra_node / inter_node / nvls /
        all_to_all) replaced."""
        fields = getattr(self, tier)
        return base if not fields else LinkSpec.model_validate({**base.model_dump(), **fields})


def load(path: Path | str) -> Profile:
    """A measured profile from its JSON file, validated; ``ProfileError`` (one line naming the file) otherwise.
    Loaded once per version of the file (its path, size and modification time): the rules validate it when the
    scenario loads, and the plan then reads the same object."""
    path = Path(path)
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise ProfileError(f"costs.profile: no such file {str(path)!r}") from None
    return _load(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


MAX_PROFILE_BYTES = 16 << 20  # the largest shipped profile is a few hundred kB


@lru_cache(maxsize=16)
def _load(path_text: str, size: int, mtime_ns: int) -> Profile:
    """``load`` for one version of a file (``size`` and ``mtime_ns`` only key the cache)."""
    path = Path(path_text)
    try:
        with path.open("rb") as handle:  # bounded: a profile is kB; /dev/zero or a huge file is refused, not read
            raw = handle.read(MAX_PROFILE_BYTES + 1)
        if len(raw) > MAX_PROFILE_BYTES:
            raise ProfileError(f"costs.profile: {str(path)!r} is larger than {MAX_PROFILE_BYTES >> 20} MiB")
        data = json.loads(raw.decode("utf-8-sig"))
    except FileNotFoundError:
        raise ProfileError(f"costs.profile: no such file {str(path)!r}") from None
    except UnicodeDecodeError as error:
        raise ProfileError(f"costs.profile: {str(path)!r} is not UTF-8 text (byte {error.start})") from None
    except OSError as error:  # a directory, no permission
        raise ProfileError(f"costs.profile: cannot read {str(path)!r}: {error.strerror or error}") from None
    except json.JSONDecodeError as error:
        raise ProfileError(f"costs.profile: {str(path)!r} is not JSON ({error.msg}, line {error.lineno})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProfileError(f"costs.profile: {str(path)!r} is not a clustersim profile (format: {FORMAT})")
    if data.get("version") != VERSION:
        raise ProfileError(f"costs.profile: {str(path)!r} has version {data.get('version')}, expected {VERSION}")
    try:
        return Profile.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ProfileError(f"costs.profile: {str(path)!r}: {where}: {first['msg']}") from None


@cache
def default_for(gpu_name: str) -> Profile | None:
    """The shipped profile for a GPU preset, or None when there is none."""
    name = DEFAULT_PROFILE_FOR_GPU.get(gpu_name)
    if name is None:
        return None
    return Profile.model_validate_json(resources.files("sim").joinpath(f"data/profiles/{name}.json").read_text())
