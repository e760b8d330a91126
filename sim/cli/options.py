"""The options several commands share, and what they are read into.

In: a command's ``argparse`` parser (to add the options to) or its parsed arguments. Out: the scenario file with
``--set`` overrides (``run``, ``check``, ``search``, ``compare-trace``); the run budget ``--max-tasks`` /
``--max-memory`` as a ``sim.workload.size.Limits``; the executor options of ``sweep`` and ``search`` (``-j``,
``--executor``, ``--scheduler``, ``--dask-timeout``, ``--dask-dashboard``) and the dashboard-link callback.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sim.errors import ConfigError
from sim.explore.executors import DASK_TIMEOUT_S  # a light module: the parser's default

if TYPE_CHECKING:
    from rich.console import Console


def scenario_args(cmd: argparse.ArgumentParser) -> None:
    """The scenario YAML file and its ``--set a.b=value`` overrides."""
    cmd.add_argument("scenario", help="scenario YAML file")
    cmd.add_argument("--set", action="append", default=[], metavar="a.b=value",
                     help="override a scenario field (repeatable)")


def run_limits(args: argparse.Namespace) -> Any:
    """The run budget of ``--max-tasks`` / ``--max-memory`` (sim.workload.size.Limits)."""
    from sim.api import limits

    return limits(args.max_tasks, args.max_memory, ("--max-tasks", "--max-memory"))


def limit_args(cmd: argparse.ArgumentParser) -> None:
    """``--max-tasks`` / ``--max-memory``: a run's budget, checked against its estimated size before it is built
    (sim.workload.size; docs/reliability.md)."""
    cmd.add_argument("--max-tasks", type=int, metavar="N", help="refuse a run estimated above N tasks (default "
                     "10,000,000)")
    cmd.add_argument("--max-memory", metavar="SIZE", help="refuse a run estimated above SIZE, e.g. '8 GiB' "
                     "(default: half the machine's memory)")


def executor_args(cmd: argparse.ArgumentParser) -> None:
    """Where a sweep's points or a search's layouts run: ``-j``, ``--executor``, ``--scheduler``, ``--dask-timeout``,
    ``--dask-dashboard`` (sim.explore.executors)."""
    cmd.add_argument("-j", "--jobs", type=int, default=1, help="points run in parallel (processes or Dask workers); "
                     "search also screens its layouts in this many local processes (at most the CPUs)")
    cmd.add_argument("--executor", choices=("process", "dask"), default="process",
                     help="process: local worker processes; dask: a Dask cluster (local unless --scheduler)")
    cmd.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address, e.g. tcp://host:8786")
    cmd.add_argument("--dask-timeout", type=float, default=DASK_TIMEOUT_S, metavar="SECONDS",
                     help=f"how long to wait to connect to the Dask scheduler (default {DASK_TIMEOUT_S:g})")
    cmd.add_argument("--dask-dashboard", action="store_true",
                     help="serve the Dask dashboard (a local cluster's on 127.0.0.1) and print its link (default: off)")


def dashboard(args: argparse.Namespace, console: Console) -> Callable[[str], None] | None:
    """With ``--dask-dashboard``: a callback printing the dashboard's link once; ConfigError without Dask."""
    if not args.dask_dashboard:
        return None
    if args.executor != "dask":
        raise ConfigError("--dask-dashboard: needs --executor dask")
    shown: set[str] = set()

    def show(link: str) -> None:
        if link not in shown:
            shown.add(link)
            console.print(f"Dask dashboard: {link}", markup=False, highlight=False)
    return show

