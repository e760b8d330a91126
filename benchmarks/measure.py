"""Timing helpers for the benchmarks: a command's wall time and peak memory, medians of repeats.

In: a command line (run as a child process) or a Python callable. Out: wall seconds and the peak resident set
size in bytes. A child's peak is ``os.wait4``'s ``ru_maxrss`` for that child (Linux reports the largest of the
child and the descendants it waited for, e.g. ``sim run``'s chart process), so each command's figure is its
own, not the largest of the benchmark's children so far. In-process figures use ``getrusage(RUSAGE_SELF)``:
the process's peak so far, which only grows, so run the smallest case first.
"""

from __future__ import annotations

import compileall
import functools
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Timed:
    seconds: float  # median wall time
    runs: tuple[float, ...]
    peak_rss: int  # bytes, the largest over the runs
    cpu: float = float("nan")  # median CPU seconds (user + system, the process and its reaped children)

    def __str__(self) -> str:
        spread = ", ".join(f"{s:.3f}" for s in self.runs)
        cpu = f", CPU {self.cpu:.3f} s" if self.cpu == self.cpu else ""
        return f"{self.seconds:.3f} s (median of {len(self.runs)}: {spread}){cpu}, peak RSS {mib(self.peak_rss)}"


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.0f} MiB"


def child_env() -> dict[str, str]:
    """The environment with this checkout first on PYTHONPATH, so ``-m sim`` is the code benchmarked, its
    modules byte-compiled (``byte_compile``)."""
    byte_compile()
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


@functools.cache
def byte_compile() -> None:
    """Write the checkout's ``sim`` and ``analysis`` bytecode (``__pycache__``, git-ignored), as ``pip install``
    does for an installed package and an editable install's first run does, so a timed command reads its modules'
    bytecode as it reads numpy's and pandas'. Where ``PYTHONDONTWRITEBYTECODE`` is set (this project's machine),
    no command writes it, and every ``sim run`` compiled about 60 modules from source: 0.25-0.3 CPU s of each
    run (2026-11-25), a cost no installed copy pays. ``compileall`` writes whatever that variable says and
    leaves a module whose bytecode is current as it is."""
    for package in ("sim", "analysis"):
        compileall.compile_dir(ROOT / package, quiet=1)


def run_once(argv: Sequence[str]) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (bytes) and CPU seconds of one run of ``argv`` (output discarded; a failure
    raises). On a loaded machine the CPU time says what the command costs, the wall time what it waited too."""
    began = time.perf_counter()
    child = subprocess.Popen(list(argv), cwd=ROOT, env=child_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - began
    child.returncode = os.waitstatus_to_exitcode(status)
    err = child.stderr.read().decode() if child.stderr else ""
    if child.returncode:
        raise SystemExit(f"{' '.join(argv)} failed ({child.returncode}): {err.strip()[-500:]}")
    return wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime  # Linux reports KiB


def _summary(runs: list[tuple[float, int, float]]) -> Timed:
    return Timed(statistics.median(w for w, _, _ in runs), tuple(w for w, _, _ in runs), max(r for _, r, _ in runs),
                 statistics.median(c for _, _, c in runs))


def timed_command(argv: Sequence[str], repeat: int) -> Timed:
    return _summary([run_once(argv) for _ in range(repeat)])


def interleaved(commands: dict[str, Sequence[str]], repeat: int) -> dict[str, Timed]:
    """Each command ``repeat`` times, taking turns (so a change in the machine's load hits them alike)."""
    runs: dict[str, list[tuple[float, int, float]]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, argv in commands.items():
            runs[name].append(run_once(argv))
    return {name: _summary(r) for name, r in runs.items()}


def timed_call(function: Callable[[], object], repeat: int) -> Timed:
    """Median wall time of ``function()`` in this process, and the peak RSS after the runs: this process's, or
    the largest of the children it reaped (processes ``function`` forked) where that is larger. CPU: this
    process's and its reaped children's."""
    runs, cpu = [], []
    for _ in range(repeat):
        began, began_cpu = time.perf_counter(), _cpu_with_children()
        function()
        runs.append(time.perf_counter() - began)
        cpu.append(_cpu_with_children() - began_cpu)
    peak = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return Timed(statistics.median(runs), tuple(runs), peak * 1024, statistics.median(cpu))


def _cpu_with_children() -> float:
    """User + system seconds of this process and the children it reaped so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def python() -> str:
    return sys.executable


def machine() -> str:
    """One line naming this machine: CPUs the process may use and the load when measured."""
    load = os.getloadavg()
    return (f"{os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), load average "
            f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}, Python {sys.version.split()[0]}")
