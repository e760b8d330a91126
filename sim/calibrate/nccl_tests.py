"""A user's own nccl-tests output -> the link tiers of a profile (``sim calibrate --from-nccl-tests LOG...``).

In: the stdout of nccl-tests' ``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``, ``alltoall_perf``,
``sendrecv_perf`` or ``broadcast_perf`` (one run per file), and the profile and node preset the tiers are fitted
against. Out: ``NcclTestsLog`` per file (ranks, hosts, GPU name, rows with out-of-place and in-place time, algbw,
busbw), and a ``Profile`` whose ``intra_node`` / ``inter_node`` / ``nvls`` / ``all_to_all`` tiers hold the
fitted latency, plateau efficiency and efficiency curve (``sim.calibrate.fitting.fit_link``).

The format, from nccl-tests' own source (github.com/NVIDIA/nccl-tests):
- 2.13 and later (src/common.cu; from v2.17, late 2025, src/util.cu ``writeDeviceReport`` / ``writeResultHeader``):
  ``# nThread 1 nGpus 1 minBytes ...``, one line per rank ``#  Rank %2d Group %2d Pid %6d on %10s device %2d
  [%04x:%02x:%02x] %s`` (host name, then the device name), a header ``size count type redop root time algbw
  busbw #wrong`` twice (out-of-place, in-place), optionally per-iteration columns (``-I 1``: i_min i_max i_p99
  i_cv% after each #wrong) and a timestamp; ``cputime`` instead of ``time`` with ``-C 1``; ``#wrong`` is
  ``N/A`` without validation. From v2.17 also ``# nccl-tests version ...`` and ``# Collective test starting:
  all_reduce_perf`` (the program name; ``_mpi`` builds end in ``_mpi``).
- before 2.13 (v2.0-v2.12, src/<test>.cu ``print_header``): ``#   Rank %2d Pid %6d on %10s device %2d [0x%02x]
  %s`` (no Group), the header ``size count type redop time algbw busbw error`` per test (no ``root`` column,
  and no ``redop`` for all-gather / all-to-all / send-recv), ``error`` a float such as ``0e+00``.
- both end with ``# Out of bounds values : N OK`` and ``# Avg bus bandwidth    : X``.
Columns are read by their header names, so both layouts and the optional columns parse the same way.
Sizes follow the nccl-tests convention the simulator uses (sim.network.collectives): the gathered size for
all-gather / reduce-scatter, the per-rank buffer for all-to-all.

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

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from sim.calibrate.fitting import LinkFit, Measurement, fit_latency, fit_link
from sim.costs.profile import Profile
from sim.errors import ConfigError
from sim.hardware.gpus import GPU_PRESETS
from sim.hardware.links import LinkSpec
from sim.hardware.nodes import NodeSpec
from sim.network.collectives import bus_factor, bytes_moved, latency_steps, ring_latency

# nccl-tests binary -> the simulator's collective (sim.network.collectives.OPS).
TESTS = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather", "reduce_scatter_perf": "reduce_scatter",
         "alltoall_perf": "all_to_all", "sendrecv_perf": "send", "broadcast_perf": "broadcast"}
TIERS = ("intra_node", "inter_node", "nvls", "all_to_all")
PLACEMENTS = ("out-of-place", "in-place")
LATENCY_MAX_BYTES = 64 * 1024  # as fit_link: below this the bandwidth term is negligible
MAX_LOG_BYTES = 64 << 20

# "#  Rank  0 Group  0 Pid 895544 on     h100-2 device  0 [0002:00:01] NVIDIA H100 80GB HBM3" (2.13+) and
# "#   Rank  0 Pid 1821213 on host device  0 [0x00] NVIDIA A100-SXM4-40GB" (before); '#' may be lost in a paste.
_RANK = re.compile(r"^#?\s*Rank\s+(?P<rank>\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(?P<host>\S+)\s+"
                   r"device\s+(?P<device>\d+)\s+\[[^\]]*\]\s*(?P<gpu>.*?)\s*$")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_NTHREAD = re.compile(r"^#?\s*nThread\s+(\d+)\s+nGpus\s+(\d+)")


class NcclTestsError(ConfigError):
    pass


@dataclass(frozen=True)
class Rank:
    rank: int
    host: str
    device: int
    gpu: str


@dataclass(frozen=True)
class Row:
    """One size of the table: bytes, dtype, and per placement (time in seconds, algbw and busbw in bytes/s)."""

    nbytes: int
    dtype: str
    line: int
    seconds: dict[str, float]
    algbw: dict[str, float]
    busbw: dict[str, float]


@dataclass(frozen=True)
class NcclTestsLog:
    path: str
    test: str
    ranks: tuple[Rank, ...]
    rows: tuple[Row, ...]
    avg_busbw: float | None = None  # the "# Avg bus bandwidth" line, GB/s as printed -> bytes/s

    @property
    def op(self) -> str:
        return TESTS[self.test]

    @property
    def n(self) -> int:
        return len(self.ranks)

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.host for r in self.ranks))

    @property
    def gpu(self) -> str:
        return self.ranks[0].gpu if self.ranks else ""

    def measurements(self, placement: str = "out-of-place") -> list[Measurement]:
        members = 2 if self.op == "send" else self.n  # sendrecv: each rank sends to one peer
        return [Measurement(self.op, members, float(r.nbytes), r.seconds[placement]) for r in self.rows
                if placement in r.seconds]


def _fail(path: str, line: int | None, message: str) -> NcclTestsError:
    return NcclTestsError(f"{path}:{line}: {message}" if line else f"{path}: {message}")


def _test_name(path: str, declared: str | None) -> str:
    """The nccl-tests binary: its own '# Collective test starting' line, else the one the file name names."""
    if declared:
        name = Path(declared).name.removesuffix("_mpi")
        if name in TESTS:
            return name
        raise _fail(path, None, f"test {declared!r} is not one of {', '.join(TESTS)}")
    stem = Path(path).name.lower().replace("-", "_")
    found = [test for test in TESTS if test.removesuffix("_perf") in stem]
    if len(found) == 1:
        return found[0]
    raise _fail(path, None, "cannot tell which nccl-tests binary wrote it (no '# Collective test starting' line, "
                f"and the file name names none of {', '.join(TESTS)}): name the file after it, e.g. "
                "all_reduce_perf.log")


def _number(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise ValueError(token)
    return value


def parse(path: Path | str, text: str | None = None) -> NcclTestsLog:
    """One nccl-tests output file -> ``NcclTestsLog``; NcclTestsError naming the file and line otherwise."""
    name = str(path)
    if text is None:
        try:
            with Path(path).open("rb") as handle:
                raw = handle.read(MAX_LOG_BYTES + 1)
        except OSError as error:
            raise _fail(name, None, f"cannot read: {error.strerror or error}") from None
        if len(raw) > MAX_LOG_BYTES:
            raise _fail(name, None, f"larger than {MAX_LOG_BYTES >> 20} MiB: not an nccl-tests output")
        text = raw.decode("utf-8", errors="replace")
    ranks: list[Rank] = []
    rows: list[Row] = []
    columns: list[str] | None = None
    declared = avg = None
    per_process = 1
    for number, raw_line in enumerate(text.splitlines(), start=1):
        line = re.sub(r"^\[\d+\]\s?", "", raw_line.rstrip())  # mpirun --tag-output prefixes "[0]"
        if match := _NTHREAD.match(line):
            per_process = int(match[1]) * int(match[2])
        elif match := _STARTING.match(line):
            declared = match[1]
        elif match := _RANK.match(line):
            ranks.append(Rank(int(match["rank"]), match["host"], int(match["device"]), match["gpu"]))
        elif match := _AVG.match(line):
            try:
                avg = _number(match[1]) * 1e9
            except ValueError:
                raise _fail(name, number, f"'Avg bus bandwidth' is not a number: {match[1]!r}") from None
        elif re.match(r"^#?\s*size\s+count\s+type\b", line):
            columns = line.lstrip("#").split()
        elif columns and re.match(r"^\s*\d+\s+\d+\s+\S", line):
            rows.append(_row(name, number, line, columns))
    if not rows:
        raise _fail(name, None, "no result rows (expected an nccl-tests table: 'size count type ... time algbw "
                    "busbw')")
    if not ranks:
        raise _fail(name, None, "no '#  Rank N ... on HOST device D [...] GPU' lines: the ranks and hosts the run "
                    "used are unknown (keep the whole nccl-tests output)")
    if per_process > 1 and len({r.host for r in ranks}) == 1 and len(ranks) % per_process:
        raise _fail(name, None, f"{len(ranks)} rank lines but nThread x nGpus = {per_process} per process")
    return NcclTestsLog(name, _test_name(name, declared), tuple(ranks), tuple(rows), avg)


def _row(path: str, number: int, line: str, columns: list[str]) -> Row:
    """A result row read by the header's column names: the first time/algbw/busbw triple is out-of-place, the
    second in-place (the per-iteration and timestamp columns, if any, are skipped)."""
    tokens = line.split()
    time_name = "cputime" if "cputime" in columns else "time"
    starts = [i for i, column in enumerate(columns) if column == time_name]
    if len(starts) != 2 or len(tokens) < starts[1] + 3:
        raise _fail(path, number, f"expected at least {starts[1] + 3 if len(starts) == 2 else len(columns)} columns "
                    f"({' '.join(columns)}), got {len(tokens)}")
    try:
        nbytes = int(tokens[0])
        seconds, alg, bus = {}, {}, {}
        for placement, start in zip(PLACEMENTS, starts, strict=True):
            time_us, algbw, busbw = (_number(tokens[start + k]) for k in range(3))
            if time_us <= 0:
                raise ValueError(f"time {tokens[start]}")
            seconds[placement], alg[placement], bus[placement] = time_us * 1e-6, algbw * 1e9, busbw * 1e9
    except ValueError as error:
        raise _fail(path, number, f"not a number in a result row ({error})") from None
    if nbytes <= 0:
        raise _fail(path, number, f"size {nbytes} B: must be positive")
    return Row(nbytes, tokens[2], number, seconds, alg, bus)


# ---------------------------------------------------------------------------------------------- fitting


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
