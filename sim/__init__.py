"""clustersim: a discrete-event simulator of GPU clusters training large language models.

The public API (``sim/api.py``; see the README's "From Python / a notebook")::

    import sim
    r = sim.run("scenarios/tiny.yaml", set={"parallel.tp": 2})   # RunResult: .summary, .trace (DataFrame), .plan
    sim.estimate("scenarios/tiny.yaml")                          # Estimate: closed forms, no simulation
    sim.check("scenarios/tiny.yaml")                             # Check: resolved YAML and memory plan per stage
    sim.load_scenario({...} or path, set=[...])                   # Scenario

Bad input raises ``sim.ConfigError`` (a ``SimError``) with a one-line message naming the field.

Data flow (docs/architecture.md): scenario YAML -> ``sim.spec.scenario.load_scenario`` -> ``Scenario`` ->
``sim.plan.resolve`` -> ``Plan`` (every derived fact) -> ``sim.workload.build.build`` -> ``TaskGraph`` ->
``sim.engine.event.simulate`` -> trace DataFrame -> ``sim.output.summary.summarize``. ``sim.runner.run`` does
all of it in memory; ``sim.cli.commands`` is the command line. The names below other than the errors are loaded
on first use, so importing a submodule (``sim.units``) does not import pandas or simpy; nothing inside ``sim``
imports them from here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sim.errors import ConfigError, OutOfMemory, ResourceLimit, ScheduleDeadlock, SimError

__version__ = "0.1.0"

__all__ = [
    "Check", "ConfigError", "Estimate", "OutOfMemory", "Plan", "ResourceLimit", "RunResult", "Scenario",
    "ScheduleDeadlock", "SimError", "Summary", "check", "estimate", "load_scenario", "run",
]

_LAZY = {  # name -> the module that defines it
    "Check": "sim.api", "check": "sim.api", "estimate": "sim.api", "load_scenario": "sim.api", "run": "sim.api",
    "Estimate": "sim.explore.estimate", "RunResult": "sim.runner", "Scenario": "sim.spec.scenario",
    "Summary": "sim.output.summary", "Plan": "sim.plan",
}

if TYPE_CHECKING:
    from sim.api import Check, check, estimate, load_scenario, run
    from sim.explore.estimate import Estimate
    from sim.output.summary import Summary
    from sim.plan import Plan
    from sim.runner import RunResult
    from sim.spec.scenario import Scenario


def __getattr__(name: str) -> Any:
    """PEP 562: import the module behind a public name on first use, and keep the name here."""
    if name not in _LAZY:
        raise AttributeError(f"module 'sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
