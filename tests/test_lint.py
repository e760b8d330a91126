"""Lint and static types as tests, so the README's test command (and CI's ``.ci/run``) runs them.

In: ruff over sim, analysis, tests, scripts and benchmarks (rules and the few per-file exceptions: pyproject.toml's
``[tool.ruff]``), and mypy over sim (``[tool.mypy]``: Python 3.11, default strictness). Out: a failure whose message
is the tool's own report. Both come with the ``test`` extra (``pip install -e ".[test]"``), pinned there.
"""

import subprocess
import sys
import tempfile

from conftest import ROOT

LINTED = ["sim", "analysis", "tests", "scripts", "benchmarks"]
INSTALL = "\n(ruff and mypy come with the test extra: pip install -e '.[test]')"

# mypy needs about 20 s of CPU from a cold cache (CI's fresh clone), ruff well under one. mypy is therefore started
# when pytest collects this module: it checks on the second core while the tests before this file run, and
# test_mypy only waits for it. (A run that collects but deselects test_mypy leaves it to finish on its own.)
# Under pytest-xdist every worker collects this module, so two mypy processes run at once: with a shared
# .mypy_cache they race on a cold cache (a fresh clone: "INTERNAL ERROR" seen in CI), so neither writes one.
_mypy_report = tempfile.TemporaryFile(mode="w+")
_mypy = subprocess.Popen([sys.executable, "-m", "mypy", "--cache-dir", "/dev/null"], cwd=ROOT,
                         stdout=_mypy_report, stderr=subprocess.STDOUT, text=True)


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", *LINTED], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr + INSTALL


def test_mypy_finds_nothing():
    code = _mypy.wait(timeout=600)
    _mypy_report.seek(0)
    report = _mypy_report.read()
    assert code == 0, report + INSTALL
    assert report.startswith("Success: no issues found"), report


def test_interop_takes_no_unused_arguments():
    # ruff's ARG001 over sim/interop, where the importers pass the layout between mappers: an argument a mapper
    # never reads (apply_model's gpus was one) hides which facts it depends on. Not project-wide: the schedule
    # rules share one (p, m, v) signature on purpose.
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "ARG001", "sim/interop"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr + INSTALL
