"""nccl-tests runs -> the link tiers of a profile (the second half of ``sim calibrate --from-nccl-tests LOG...``).

In: parsed nccl-tests runs (``sim.calibrate.nccl_tests_log``: ranks, hosts, rows), and the profile and node preset
the tiers are fitted against. Out: a ``Profile`` whose ``intra_node`` / ``inter_node`` / ``nvls`` / ``all_to_all``
tiers hold the fitted latency, plateau efficiency and efficiency curve (``sim.calibrate.fitting.fit_link``), and a
``TierFit`` per tier for the report.

Which tier a run describes: the ranks' hosts (the host name of each rank line). One host, or all ranks inside
one NVLink domain of the node preset (GB200 NVL72: 72 GPUs over 18 hosts): NVLink (``intra_node``; all-to-all
rows: ``all_to_all``; all-reduce rows with ``nvls=True``: ``nvls``, NCCL's default on NVSwitch H100 systems,
which nccl-tests does not print: NCCL_ALGO or NCCL_DEBUG=INFO say). More hosts: the NIC tier (``inter_node``),
fitted like scripts/fit_network_defaults.py fits the shipped one: the ring's NVLink steps and network steps pay
the base tiers' alphas (sim.network.collectives.ring_latency), the base latency is fitted on the small
messages, and the line rate is the node's NICs together (NCCL runs one ring per rail, so a node's NICs carry
what one rank's ring moves); all-to-all across hosts is not fitted (the model's all-to-all mixes both tiers).

A bad file is a ``NcclTestsError`` (a ``ConfigError``): one line naming the file and line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from sim.calibrate.fitting import LinkFit, Measurement, fit_latency, fit_link
from sim.calibrate.nccl_tests_log import PLACEMENTS, NcclTestsError, NcclTestsLog, parse
from sim.costs.profile import Profile
from sim.hardware.gpus import GPU_PRESETS
from sim.hardware.links import LinkSpec
from sim.hardware.nodes import NodeSpec
from sim.network.collectives import bus_factor, bytes_moved, latency_steps, ring_latency

TIERS = ("intra_node", "inter_node", "nvls", "all_to_all")
LATENCY_MAX_BYTES = 64 * 1024  # as fit_link: below this the bandwidth term is negligible


@dataclass(frozen=True)
class TierFit:
    """What one tier's fit used and gave, for the report."""

    tier: str
    files: tuple[str, ...]
    ops: tuple[str, ...]
    n: tuple[int, ...]
    hosts: int
    line_rate: float
    fit: LinkFit
    measured_busbw: float  # the largest busbw among the rows fitted
    latency_fitted: bool  # rows <= 64 KiB gave the base latency (else the base tier's)
    plateau_fitted: bool  # rows > 64 KiB gave the plateau and curve (else the base tier's)

    @property
    def plateau_busbw(self) -> float:
        """The fitted plateau as nccl-tests busbw: line rate x efficiency for a ring, whose bytes moved per rank
        are busbw's (doc/PERFORMANCE.md); NVLS moves S per rank, so its busbw is that x 2(n-1)/n."""
        factor = bus_factor("all_reduce", max(self.n)) if self.tier == "nvls" else 1.0
        return self.line_rate * self.fit.efficiency * factor


@dataclass
class ImportResult:
    profile: Profile
    tiers: list[TierFit] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def tier_of(log: NcclTestsLog, node: NodeSpec | None, nvls: bool) -> str | None:
    """The tier a run measures (see the module docstring); None for an all-to-all across NVLink domains."""
    hosts = len(log.hosts)
    domain = node.nvlink_domain if node is not None else 0
    inside = hosts == 1 or (node is not None and domain > node.gpus_per_node and log.n <= domain)
    if not inside:
        return None if log.op == "all_to_all" else "inter_node"
    if log.op == "all_to_all":
        return "all_to_all"
    return "nvls" if nvls and log.op == "all_reduce" else "intra_node"


def _base_link(tier: str, base: Profile | None, node: NodeSpec | None) -> LinkSpec | None:
    preset: LinkSpec | None = None
    if node is not None:
        preset = getattr(node, tier) or (node.intra_node if tier == "all_to_all" else None)
    if base is not None and getattr(base, tier):
        fields: dict[str, Any] = dict(getattr(base, tier))
        if preset is None and "bandwidth" not in fields:
            return None
        return base.link(tier, preset) if preset is not None else LinkSpec.model_validate(
            {"latency": 0.0, **fields})
    return preset


def _row_value(by_row: dict[int, float], row: Measurement) -> float:
    return by_row[id(row)]


CURVE_KNOTS = tuple(2.0 ** e for e in range(17, 35))  # 128 KiB .. 16 GiB: above the latency rows
REFITS = 6  # latency <-> plateau alternations (the small messages' bandwidth term, then the latency again)


def fit_tier(tier: str, logs: Sequence[NcclTestsLog], link: LinkSpec, node: NodeSpec | None,
             placement: str = "out-of-place", intra: LinkSpec | None = None) -> TierFit:
    """Fit one tier's latency, plateau and curve on the rows of ``logs`` (all of this tier) against ``link``
    (the base tier: its line rate, and its latencies where the rows cannot separate them).

    The latency comes from the messages <= 64 KiB less their bandwidth term at the plateau rate (the least a
    message of any size pays), the plateau and curve from ``fit_link`` with that latency held, on knots above
    64 KiB only (the rows the latency was not fitted on: a small message cannot tell latency from a low
    efficiency); the two alternate (``REFITS`` times, from the base tier's plateau). Exact on noise-free
    closed-form times of a flat tier (a test); a plateau reached only at large sizes keeps the small messages'
    extra time in the latency, as fit_link does."""
    rows = [m for log in logs for m in log.measurements(placement)]
    algorithm = "nvls" if tier == "nvls" else "ring"
    steps = np.array([latency_steps(algorithm, r.op, r.n) for r in rows], dtype=float)
    seconds = np.array([r.seconds for r in rows])
    moved = np.array([bytes_moved(algorithm, r.op, r.n, r.nbytes) for r in rows])
    small = np.array([r.nbytes <= LATENCY_MAX_BYTES for r in rows])
    line_rate = link.bandwidth
    # Per row, the alphas it pays beyond the base latency, when alpha is not fitted (None: fit it).
    alphas: np.ndarray | None = steps * link.latency
    if tier == "inter_node":
        # The node's NICs together carry one rank's ring (one ring per rail), as scripts/fit_network_defaults.py;
        # its NVLink steps pay the intra tier's alpha and its network steps this tier's (ring_latency).
        line_rate = link.bandwidth * (node.nics_per_node if node is not None else 1)
        nodes = [min(len(log.hosts), 2) if log.op == "send" else len(log.hosts)  # a pair crosses one boundary
                 for log in logs for _ in log.measurements(placement)]
        alphas = np.array([ring_latency(r.op, r.n, k, (intra or link).latency, link.latency)
                           for r, k in zip(rows, nodes, strict=True)])
    elif small.any() and len(set(steps[small])) >= 2:  # two step counts separate base from alpha: fit both
        alphas = None

    def latency_from(bandwidth_seconds: np.ndarray) -> tuple[float, float]:
        if not small.any():
            return link.base_latency, link.latency
        latency_part = seconds[small] - bandwidth_seconds[small]
        if alphas is None:
            return fit_latency(steps[small], latency_part)
        return max(0.0, float(np.mean(latency_part - alphas[small]))), link.latency  # least squares of the base

    plateau = link.efficiency
    fit = LinkFit(link.base_latency, link.latency, link.efficiency, link.efficiency_curve, len(rows))
    for _ in range(REFITS):
        bandwidth_seconds = moved / (line_rate * plateau)
        base_latency, alpha = latency_from(bandwidth_seconds)
        if small.all():  # latency-bound rows only: they say nothing of the plateau, which stays the base tier's
            fit = LinkFit(base_latency, alpha, link.efficiency, link.efficiency_curve, len(rows))
            break
        fixed = (np.full(len(rows), base_latency) + (steps * alpha if alphas is None else alphas))
        fit = fit_link(rows, line_rate, algorithm=algorithm, knots=CURVE_KNOTS,
                       latency_max_bytes=LATENCY_MAX_BYTES, latency=(base_latency, alpha),
                       latency_of=partial(_row_value, dict(zip(map(id, rows), fixed.tolist(), strict=True))))
        plateau = fit.efficiency
    measured = max(r.busbw[placement] for log in logs for r in log.rows if placement in r.busbw)
    hosts = max(len(log.hosts) for log in logs)
    return TierFit(tier, tuple(log.path for log in logs), tuple(sorted({log.op for log in logs})),
                   tuple(sorted({log.n for log in logs})), hosts, line_rate, fit, measured,
                   latency_fitted=bool(small.any()), plateau_fitted=not small.all())


def node_for(logs: Sequence[NcclTestsLog], node_name: str | None) -> NodeSpec | None:
    """The node preset: ``node_name``, else the default node of the GPU the rank lines name (None if unknown)."""
    from sim.calibrate.run import _gpu_preset
    from sim.hardware.nodes import DEFAULT_NODE_FOR_GPU, NODE_PRESETS

    if node_name is not None:
        if node_name not in NODE_PRESETS:
            raise NcclTestsError(f"--node: {node_name!r} is not a node preset (known: {', '.join(NODE_PRESETS)})")
        return NODE_PRESETS[node_name]
    for log in logs:
        preset = _gpu_preset(log.gpu) if log.gpu else None
        if preset in DEFAULT_NODE_FOR_GPU and preset in GPU_PRESETS:
            return NODE_PRESETS[DEFAULT_NODE_FOR_GPU[preset]]
    return None


def base_profile(logs: Sequence[NcclTestsLog], node_name: str | None = None) -> Profile:
    """The shipped profile (GEMM curves) of the GPU the logs name, or of the GPU whose default node is
    ``node_name``; NcclTestsError when neither names one."""
    from sim.calibrate.run import _gpu_preset
    from sim.costs.profile import default_for
    from sim.hardware.nodes import DEFAULT_NODE_FOR_GPU

    names = [preset for log in logs if log.gpu and (preset := _gpu_preset(log.gpu))]
    names += [gpu for gpu, node in DEFAULT_NODE_FOR_GPU.items() if node == node_name]
    for name in names:
        if (profile := default_for(name)) is not None:
            return profile
    gpus = sorted({log.gpu for log in logs}) or ["(none named)"]
    raise NcclTestsError(f"{logs[0].path}: no shipped profile for GPU {', '.join(map(repr, gpus))}: pass --base "
                         "PROFILE (a profile with GEMM curves, e.g. from sim calibrate) to merge the link tiers into")


def import_logs(logs: Sequence[NcclTestsLog | Path | str], base: Profile, node: NodeSpec | None = None,
                nvls: bool = False, tier: str | None = None, placement: str = "out-of-place") -> ImportResult:
    """Parse every file (or take parsed logs), group the runs by tier (``tier`` forces one for all), fit each
    tier, and return ``base`` with those tiers replaced (its GEMM curves and other tiers kept)."""
    if placement not in PLACEMENTS:
        raise NcclTestsError(f"placement: {placement!r} is not one of {', '.join(PLACEMENTS)}")
    parsed = [log if isinstance(log, NcclTestsLog) else parse(log) for log in logs]
    result = ImportResult(base)
    groups: dict[str, list[NcclTestsLog]] = {}
    for log in parsed:
        which = tier or tier_of(log, node, nvls)
        if which is None:
            result.skipped.append(f"{log.path}: all-to-all across {len(log.hosts)} hosts (not fitted: the model's "
                                  "all-to-all mixes the NVLink and NIC tiers)")
            continue
        if which == "all_to_all" and log.op != "all_to_all" or which != "all_to_all" and log.op == "all_to_all":
            raise NcclTestsError(f"{log.path}: --tier {which} does not fit a {log.test} run")
        groups.setdefault(which, []).append(log)
    updates: dict[str, Any] = {}
    intra = _base_link("intra_node", base, node)
    for name in TIERS:
        if name not in groups:
            continue
        link = _base_link(name, base, node)
        if link is None:
            raise NcclTestsError(f"{groups[name][0].path}: no line rate for the {name} tier: the GPU "
                                 f"{groups[name][0].gpu or '(unnamed)'!r} names no node preset; pass --node PRESET "
                                 "or --base PROFILE with that tier")
        fitted = fit_tier(name, groups[name], link, node, placement, intra)
        result.tiers.append(fitted)
        keep = {"group_efficiency": [list(k) for k in link.group_efficiency]} if link.group_efficiency else {}
        updates[name] = {"bandwidth": link.bandwidth, **fitted.fit.as_link_fields(), **keep}
    sources = "; ".join(f"{t.tier} from {', '.join(Path(f).name for f in t.files)}" for t in result.tiers)
    source = f"{base.source}; link tiers from nccl-tests ({sources})" if base.source else f"nccl-tests: {sources}"
    result.profile = Profile.model_validate({**base.model_dump(), **updates, "source": source})
    return result
