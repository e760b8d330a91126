"""The import order of sim's layers, read from the source (AST), so a deferred import counts as much as a top one.

In: every ``import`` and ``from ... import`` in ``sim/``, including those inside functions, under
``if TYPE_CHECKING:``, and ``importlib.import_module("literal")`` calls (each is an arrow from the importing module's
layer to the imported one's). Out: one line per arrow that points up the order (file:line, both layers), per module
that no layer holds, and per third-party import outside the one layer allowed it.

The order is issue 21's and docs/architecture.md's drawing. Modules on one row may import each other. A module's
layer is its package under ``sim/`` (``sim/engine/event.py`` is ``engine``) or, at the top level, its own name
(``sim/runner.py`` is ``runner``). ``sim/__init__.py`` is the public API and may import anything; a ``__main__.py``
entry point has its package's layer and may also import ``sim.cli``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from conftest import ROOT

# Low to high. ``plan`` is the resolved Plan of issue 21: the package sim/plan/, its fact modules included.
ORDER: tuple[tuple[str, ...], ...] = (
    ("units", "errors"),
    ("hardware",),
    ("model",),
    ("parallel",),
    ("network",),
    ("costs",),
    ("calibrate",),
    ("spec", "interop"),
    ("plan",),
    ("workload",),
    ("engine",),
    ("output",),
    ("runner",),
    ("explore", "validation"),
    ("api",),
    ("cli",),
)
LEVEL = {name: level for level, row in enumerate(ORDER) for name in row}
API = "sim (public API)"  # the layer of sim/__init__.py: above every other, since it re-exports them
# Third-party packages that one layer alone may import: simpy is the event engine's (the other replays need no
# event queue), torch is calibration's (the simulator runs without it; the ``calibrate`` extra installs it).
ONLY_IN = {"simpy": "engine", "torch": "calibrate"}
# analysis imports sim, never the reverse: sim finds analysis's charts through entry points (pyproject.toml).
NEVER = ("analysis",)


@dataclass(frozen=True)
class Arrow:
    """One import: the importing file (relative to the root), its line, its module, and the imported module."""
    path: str
    line: int
    source: str
    target: str


def module_name(root: Path, path: Path) -> str:
    """sim/engine/event.py -> sim.engine.event; sim/engine/__init__.py -> sim.engine."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(root: Path, name: str) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imported(root: Path, source: str, is_package: bool, node: ast.AST) -> list[str]:
    """The module names one import statement (or import_module call) brings in."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: from the importing module's package, one level up per extra dot
            package = source.split(".") if is_package else source.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        names = []
        for alias in node.names:  # ``from sim import runner`` imports the module sim.runner, not the package
            candidate = f"{base}.{alias.name}"
            placed = base == "sim" and alias.name in LEVEL  # a layer whose module is yet to be written (plan)
            names.append(candidate if alias.name != "*" and (placed or _is_module(root, candidate)) else base)
        return names
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if called in ("import_module", "__import__"):
            return [node.args[0].value]
    return []


def arrows(root: Path) -> list[Arrow]:
    """Every import in root/sim, in file and line order."""
    found = []
    for path in sorted((root / "sim").rglob("*.py")):
        source = module_name(root, path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            for target in _imported(root, source, path.name == "__init__.py", node):
                found.append(Arrow(path.relative_to(root).as_posix(), node.lineno, source, target))
    return sorted(found, key=lambda a: (a.path, a.line, a.target))


def layer(module: str) -> str | None:
    """The layer of a sim module (``API`` for the package itself); None for one in no layer, or not sim's."""
    parts = module.split(".")
    if parts[0] != "sim":
        return None
    if len(parts) == 1 or parts[1] == "__main__":  # sim/__main__.py is the API's entry point
        return API
    return parts[1] if parts[1] in LEVEL else None


def _level(name: str) -> int:
    return len(ORDER) if name == API else LEVEL[name]


def violations(root: Path) -> list[str]:
    """One line per broken rule (see the module docstring), in file and line order."""
    problems = []
    for path in sorted((root / "sim").rglob("*.py")):
        source = module_name(root, path)
        if layer(source) is None:
            problems.append(f"{path.relative_to(root).as_posix()}: {source} is in no layer: place it in ORDER "
                            "(tests/test_layering.py) and in docs/architecture.md")
    for arrow in arrows(root):
        where = f"{arrow.path}:{arrow.line}"
        mine, top = layer(arrow.source), arrow.target.split(".")[0]
        if mine is None:
            continue  # reported above
        if top in NEVER:
            problems.append(f"{where}: {mine} imports {arrow.target}; sim never imports {top}")
        elif top in ONLY_IN and mine != ONLY_IN[top]:
            problems.append(f"{where}: {mine} imports {top}; only sim/{ONLY_IN[top]} may")
        elif top == "sim":
            theirs = layer(arrow.target)
            if theirs is None:
                problems.append(f"{where}: {mine} imports {arrow.target}, which is in no layer")
            elif mine == API or (arrow.path.endswith("/__main__.py") and theirs == "cli"):
                continue
            elif _level(theirs) > _level(mine):
                problems.append(f"{where}: {mine} (layer {_level(mine)}) imports {arrow.target} "
                                f"({theirs}, layer {_level(theirs)}), above it")
    return problems


def test_sim_imports_follow_the_layer_order():
    problems = violations(ROOT)
    assert not problems, "\n".join(problems)


def test_the_scan_sees_the_imports_it_must():
    """The real tree: deferred imports are arrows too, and the known ones are found where they are."""
    found = {(a.path, a.target) for a in arrows(ROOT)}
    assert ("sim/engine/event.py", "simpy") in found
    assert ("sim/spec/rules.py", "sim.spec.scenario") in found  # under ``if TYPE_CHECKING:``
    assert ("sim/calibrate/compute.py", "torch") in found  # inside a function
    assert ("sim/validation/validate.py", "sim.runner") in found  # ``from sim import runner``
    assert ("sim/__main__.py", "sim.cli.commands") in found


def test_the_drawing_in_the_architecture_doc_is_this_order():
    """docs/architecture.md's "## Layers" drawing: one row per level, "N   name, name   comment", high to low."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    drawing = doc.split("## Layers", 1)[1].split("```", 2)[1]
    rows = {}
    for line in drawing.splitlines():
        match = re.match(r"\s*(\d+)\s+(.+?)(\s{2,}|$)", line)
        if match:
            rows[int(match.group(1))] = tuple(match.group(2).split(", "))
    assert rows == {**dict(enumerate(ORDER)), len(ORDER): ("sim/__init__.py",)}


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_every_kind_of_upward_arrow_is_reported(tmp_path):
    _write(tmp_path, {
        "sim/__init__.py": "from sim.cli import main\nfrom sim.engine.event import simulate\n",
        "sim/__main__.py": "from sim.cli import main\n",
        "sim/units.py": "",
        "sim/cli/__init__.py": "from sim.explore import search\n",
        "sim/explore/__init__.py": "",
        "sim/explore/search.py": "from ..validation import validate\nfrom . import sweep\n",
        "sim/explore/sweep.py": "",
        "sim/validation/__init__.py": "",
        "sim/validation/validate.py": "",
        "sim/calibrate/__init__.py": "",
        "sim/calibrate/__main__.py": "from sim.cli import main\nimport torch\n",
        "sim/model/__init__.py": "",
        "sim/model/memory.py": (
            "from typing import TYPE_CHECKING\n"
            "from sim import units\n"
            "if TYPE_CHECKING:\n"
            "    from sim.spec.scenario import Scenario\n"
            "def f():\n"
            "    from sim import runner\n"
            "    import importlib\n"
            "    importlib.import_module('sim.engine.event')\n"
            "    from .. import workload\n"
            "    import sim\n"
            "    import simpy, torch\n"
            "    from analysis.gantt import plot_gantt\n"
            "    from sim.config import load\n"),
        "sim/stray.py": "",
    })
    assert violations(tmp_path) == [
        "sim/stray.py: sim.stray is in no layer: place it in ORDER (tests/test_layering.py) "
        "and in docs/architecture.md",
        "sim/model/memory.py:4: model (layer 2) imports sim.spec.scenario (spec, layer 7), above it",
        "sim/model/memory.py:6: model (layer 2) imports sim.runner (runner, layer 12), above it",
        "sim/model/memory.py:8: model (layer 2) imports sim.engine.event (engine, layer 10), above it",
        "sim/model/memory.py:9: model (layer 2) imports sim.workload (workload, layer 9), above it",
        f"sim/model/memory.py:10: model (layer 2) imports sim ({API}, layer 16), above it",
        "sim/model/memory.py:11: model imports simpy; only sim/engine may",
        "sim/model/memory.py:11: model imports torch; only sim/calibrate may",
        "sim/model/memory.py:12: model imports analysis.gantt; sim never imports analysis",
        "sim/model/memory.py:13: model imports sim.config, which is in no layer",
    ]
