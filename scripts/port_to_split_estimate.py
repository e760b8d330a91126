"""Port a change made to the single-module sim/explore/estimate.py (before it was split) onto the split modules.

Usage, in a checkout whose sim/explore/estimate*.py are the split modules:
    git show BRANCH:sim/explore/estimate.py > /tmp/changed.py
    git show $(git merge-base main BRANCH):sim/explore/estimate.py > /tmp/before.py
    python scripts/port_to_split_estimate.py /tmp/changed.py /tmp/before.py

Every top-level definition of CHANGED (and every method or class attribute of its ``Estimator``) whose text
differs from BEFORE's replaces the definition of the same name in sim/explore/estimate*.py, with the comment
lines right above it; the single module's imports are added to each module it rewrote and ``ruff --fix`` keeps
those it uses. A definition new in CHANGED, or gone from it, is listed to be placed or removed by hand; so is
a change to its module docstring. Without BEFORE every definition is copied. The split itself moved each
definition's text unchanged (the zero1 branch's estimate changes, ported so, give its estimates bit for bit).
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from pathlib import Path

SPLIT = Path(__file__).resolve().parent.parent / "sim" / "explore"


def spans(text: str) -> dict[str, tuple[int, int]]:
    """Each definition's name -> (first line index, with its decorators and the comment lines above it; end
    index). A method or class attribute of a class whose name ends the ``Estimator`` stack's is ``.name``."""
    lines = text.splitlines(keepends=True)

    def start(node: ast.stmt) -> int:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        while first > 0 and lines[first - 1].lstrip().startswith("#") \
                and not lines[first - 1].lstrip().startswith("# ---"):  # a section rule is not the method's
            first -= 1
        return first

    found: dict[str, tuple[int, int]] = {}
    for node in ast.parse(text).body:
        name = _name(node)
        if isinstance(node, ast.ClassDef) and any(node.name == base or node.name.endswith(base) for base in
                                                  ("Estimator", "Pricing", "Composition", "Tail", "Gathers",
                                                   "Bound")):
            for item in node.body:
                if _name(item) is not None:
                    found["." + str(_name(item))] = (start(item), item.end_lineno or item.lineno)
        elif name is not None:
            found[name] = (start(node), node.end_lineno or node.lineno)
    return found


def _name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
        return node.name
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def _text(text: str, span: tuple[int, int]) -> str:
    return "".join(text.splitlines(keepends=True)[span[0]:span[1]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("changed", type=Path, help="the changed single-module estimate.py")
    parser.add_argument("before", type=Path, nargs="?", help="the estimate.py the change was made to")
    args = parser.parse_args()
    changed = args.changed.read_text()
    before = args.before.read_text() if args.before else None
    new, old = spans(changed), spans(before) if before else {}
    modules = sorted(SPLIT.glob("estimate*.py"))
    where = {name: module for module in modules for name in spans(module.read_text())}
    rewritten: set[Path] = set()
    unplaced = []
    for name, span in new.items():
        body = _text(changed, span)
        if before is not None and name in old and _text(before, old[name]) == body:
            continue
        if name not in where:
            unplaced.append(name.lstrip("."))
            continue
        module = where[name]
        text = module.read_text()
        first, end = spans(text)[name]
        lines = text.splitlines(keepends=True)
        if "".join(lines[first:end]) != body:
            module.write_text("".join(lines[:first]) + body + "".join(lines[end:]))
            rewritten.add(module)
            print(f"{name.lstrip('.')} -> {module.relative_to(SPLIT.parent.parent)}")
    imports = [ast.get_source_segment(changed, node) or "" for node in ast.parse(changed).body
               if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "module", None) != "__future__"]
    anchor = "from __future__ import annotations\n"
    for module in rewritten:
        module.write_text(module.read_text().replace(anchor, anchor + "\n" + "\n".join(imports) + "\n", 1))
    if rewritten:
        subprocess.run(["ruff", "check", "--fix", "--quiet", *map(str, sorted(rewritten))], check=False)
    if unplaced:
        print("new in the single module, to place by hand:", ", ".join(unplaced))
    gone = [name.lstrip(".") for name in old if name not in new]
    if gone:
        print("gone from the single module, to remove by hand:", ", ".join(gone))
    if before is not None and ast.get_docstring(ast.parse(changed)) != ast.get_docstring(ast.parse(before)):
        print("the module docstring changed: carry it into sim/explore/estimate.py's (or a part's) by hand")


if __name__ == "__main__":
    main()
