"""Reading a configuration file at the input boundary, bounded: its size, encoding and YAML nesting.

In: a path or YAML text and ``what`` (the name printed in errors: ``scenario``, ``--set a.b``, an imported
launch file). Out: the text (``read_text``) or the parsed data (``parse_yaml``), or one ``ConfigError`` naming
``what`` and the rule: not found, a directory, larger than ``MAX_FILE_BYTES``, not UTF-8, not YAML, nested deeper
than ``MAX_DEPTH``. ``sim.spec.scenario`` reads scenarios with it, and ``sim import`` the launch files it reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sim.errors import ConfigError

# Input bounds (issue 27): a scenario is a few kB; these keep a malformed or hostile file from exhausting time or
# memory, and each is reported as one line naming what was exceeded.
# A scenario larger than this is refused unread: the largest bundled one is 2.4 kB, and PyYAML's pure-Python safe
# loader parses about 150 kB/s of a flow list (benchmarks/bench_loader.py), so this bounds a load near 2 s.
# (libyaml's CSafeLoader is faster but crashes the process on deep nesting: not used.)
MAX_FILE_BYTES = 256 * 1024
MAX_DEPTH = 32  # nesting of mappings/lists; the deepest bundled scenario nests 4 levels


def _depth(value: Any) -> int:
    """Nesting depth of parsed YAML (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if level > MAX_DEPTH:
            break
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, level + 1) for child in children)
    return deepest


def parse_yaml(text: str, what: str) -> Any:
    """YAML text -> data, with every failure one ``ConfigError`` naming ``what``: syntax, tags the safe loader
    refuses (``!!python/...``), and nesting deeper than ``MAX_DEPTH`` (PyYAML's composer recurses per level)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{what}: not valid YAML{where} ({getattr(error, 'problem', None) or 'syntax'})") from None
    except RecursionError:
        raise ConfigError(f"{what}: nested deeper than {MAX_DEPTH} levels") from None
    if _depth(data) > MAX_DEPTH:
        raise ConfigError(f"{what}: nested deeper than {MAX_DEPTH} levels")
    return data


def read_text(path: Path, what: str) -> str:
    """A UTF-8 text file (a BOM is allowed), read no further than ``MAX_FILE_BYTES``; every failure is one
    ``ConfigError`` naming ``what``."""
    if path.is_dir():
        raise ConfigError(f"{what}: {str(path)!r} is a directory, not a file")
    if not path.is_file():
        raise ConfigError(f"{what}: file {str(path)!r} not found")
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"{what}: cannot read {str(path)!r}: {error.strerror or error}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{what}: {str(path)!r} is larger than {MAX_FILE_BYTES // 1024} KiB")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{what}: {str(path)!r} is not UTF-8 text (byte {error.start})") from None
