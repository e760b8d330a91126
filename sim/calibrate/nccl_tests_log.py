"""A user's own nccl-tests output, parsed (the first half of ``sim calibrate --from-nccl-tests LOG...``).

In: the stdout of nccl-tests' ``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``, ``alltoall_perf``,
``sendrecv_perf`` or ``broadcast_perf`` (one run per file). Out: ``NcclTestsLog`` per file (ranks, hosts, GPU name,
rows with out-of-place and in-place time, algbw, busbw), whose link tiers ``sim.calibrate.nccl_tests_fit`` fits.

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

A bad file is a ``NcclTestsError`` (a ``ConfigError``): one line naming the file and line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from sim.calibrate.fitting import Measurement
from sim.errors import ConfigError

# nccl-tests binary -> the simulator's collective (sim.network.collectives.OPS).
TESTS = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather", "reduce_scatter_perf": "reduce_scatter",
         "alltoall_perf": "all_to_all", "sendrecv_perf": "send", "broadcast_perf": "broadcast"}
PLACEMENTS = ("out-of-place", "in-place")
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
