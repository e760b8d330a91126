"""The entry-point groups through which installed packages extend ``sim`` (``sim`` never imports ``analysis``).

In: an entry-point group name (pyproject.toml's ``[project.entry-points]``), or a command's name. Out: the
callables registered under the group, loaded in name order; the command plugin of that name, or a one-line
ConfigError saying what provides it.

Charts live in the ``analysis`` package: ``analysis`` registers its writers under the ``clustersim.outputs``
(after ``sim run``), ``clustersim.plot`` (``sim plot``), ``clustersim.sweep_outputs`` (after ``sim sweep``),
``clustersim.search_outputs`` and ``clustersim.validate_outputs`` groups, and the commands call whatever is
registered. A whole command can live there too (``clustersim.commands``: ``sim compare-trace``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.errors import ConfigError

OUTPUT_PLUGINS = "clustersim.outputs"
PLOT_PLUGINS = "clustersim.plot"
SWEEP_PLUGINS = "clustersim.sweep_outputs"
SEARCH_PLUGINS = "clustersim.search_outputs"
VALIDATE_PLUGINS = "clustersim.validate_outputs"
# Commands another installed package provides (sim never imports analysis): each entry point's name is the sim
# command it implements; analysis registers ``compare-trace`` (pyproject.toml).
COMMAND_PLUGINS = "clustersim.commands"


def plugins(group: str) -> list[Callable[..., Any]]:
    """Every callable registered under the entry-point group ``group``, loaded, in the order of their names."""
    from importlib.metadata import entry_points

    return [entry.load() for entry in sorted(entry_points(group=group), key=lambda e: e.name)]


def command_plugin(name: str) -> Callable[..., Any]:
    """The ``clustersim.commands`` entry point named ``name``, or a one-line ConfigError saying what provides it."""
    from importlib.metadata import entry_points

    found = [entry for entry in entry_points(group=COMMAND_PLUGINS) if entry.name == name]
    if not found:
        raise ConfigError(f"{name}: needs clustersim's analysis package, which registers the {COMMAND_PLUGINS!r} "
                          f"entry point {name!r} (pip install clustersim, or pip install -e . in a checkout)")
    try:
        function: Callable[..., Any] = found[0].load()
    except ImportError as error:
        raise ConfigError(f"{name}: its {COMMAND_PLUGINS} entry point {found[0].value!r} does not load: "
                          f"{error}") from None
    return function
