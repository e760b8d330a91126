"""The code the documentation points at exists: every ``sim/...`` path named in README.md and docs/**/*.md is a
file or folder of the repository, and every dotted ``sim.package.module.name`` resolves (the module imports, each
name after it is an attribute, a method or a dataclass field). Module splits (sim/plan.py into the sim/plan/
package; sim/workload/build.py into task_emit, block_emit, chain_emit, layer_emit, pair_interleave, moe_emit,
cp_emit) left docs naming code that had moved; this keeps the next split from doing so silently."""

from __future__ import annotations

import importlib
import re
from functools import cache
from typing import Any

import pytest

from conftest import ROOT

DOCS = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
# a path inside the package: sim/ then names with /, ending in a file name with its extension or a folder's /
PATH = re.compile(r"(?<![\w/.])sim/(?:[A-Za-z0-9_]+/)*(?:[A-Za-z0-9_.-]+\.[a-z]+|[A-Za-z0-9_]+/)")
DOTTED = re.compile(r"(?<![\w./])sim(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _named(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    """(doc, reference) for each distinct reference of ``pattern`` in each doc."""
    return sorted({(str(doc.relative_to(ROOT)), match.group().rstrip("."))
                   for doc in DOCS for match in pattern.finditer(doc.read_text())})


PATHS = _named(PATH)
NAMES = _named(DOTTED)


def resolve(reference: str) -> Any:
    """The object a dotted ``sim.`` reference names: the longest prefix that imports as a module, then each
    further name as an attribute (a dataclass field without a default counts); raises LookupError naming the
    first part that is missing."""
    parts = reference.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:cut]))
            break
        except ModuleNotFoundError:
            continue
    for name in parts[cut:]:
        if hasattr(target, name):
            target = getattr(target, name)
        elif name in getattr(target, "__dataclass_fields__", {}):
            target = target.__dataclass_fields__[name]
        else:
            raise LookupError(f"{'.'.join(parts[:parts.index(name)])} has no {name!r}")
    return target


@cache
def _exists(path: str) -> bool:
    return (ROOT / path).exists()


def test_the_docs_name_paths_and_modules_at_all() -> None:
    """The patterns find what the docs cite (so the checks below check something): architecture.md's runner and
    engine, summary.md's module, and more than a few dozen of each."""
    assert ("docs/architecture.md", "sim/runner.py") in PATHS
    assert ("docs/summary.md", "sim.output.summary") in NAMES
    assert len(PATHS) > 50 and len(NAMES) > 50


@pytest.mark.parametrize(("doc", "path"), PATHS, ids=[f"{doc}:{path}" for doc, path in PATHS])
def test_every_sim_path_in_the_docs_exists(doc: str, path: str) -> None:
    assert _exists(path), f"{doc} names {path}, which is not in the repository (moved or renamed?)"


@pytest.mark.parametrize(("doc", "name"), NAMES, ids=[f"{doc}:{name}" for doc, name in NAMES])
def test_every_dotted_sim_name_in_the_docs_resolves(doc: str, name: str) -> None:
    try:
        resolve(name)
    except LookupError as error:
        pytest.fail(f"{doc} names {name}: {error} (moved or renamed?)")


@pytest.mark.parametrize("stale", ["sim/plan.py", "sim.workload.build._moe_forward",
                                   "sim.workload.build._StageEmitter._cp_block", "sim.plan.nothing"])
def test_a_stale_reference_is_seen(stale: str) -> None:
    """What the splits left behind fails the checks: the module sim/plan.py became a package, and the MoE and CP
    emitters left build.py for moe_emit / cp_emit."""
    if "/" in stale:
        assert PATH.fullmatch(stale) and not _exists(stale)
    else:
        assert DOTTED.fullmatch(stale)
        with pytest.raises(LookupError):
            resolve(stale)
