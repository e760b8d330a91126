"""Start-up (issue 25): each command imports only what it needs.

A fresh interpreter runs one command through ``sim.cli.main`` and reports which heavy libraries it loaded
(``sys.modules``). ``sim --help`` needs argparse alone; ``sim check`` validates and plans memory without pandas,
pyarrow, networkx, simpy or matplotlib; ``sim run --no-plot`` writes no chart, so it loads no Matplotlib and no
chart plugin. These are facts about imports, not timings (the times are in ``benchmarks/bench_startup.py``).
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, SCENARIOS

HEAVY = ("pandas", "pyarrow", "networkx", "simpy", "matplotlib", "rich", "pydantic", "analysis")

PROBE = """
import json, sys
from sim.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as done:
    code = done.code
print(json.dumps({"code": code, "loaded": sorted(m for m in HEAVY if m in sys.modules)}))
"""


def loaded_by(*argv: str) -> tuple[int, set[str]]:
    """Run ``sim ARGV`` in a new interpreter; return its exit code and which of ``HEAVY`` it imported."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{PROBE}", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    last = done.stdout.strip().splitlines()[-1]
    report = json.loads(last)
    return report["code"], set(report["loaded"])


def test_help_imports_no_library():
    code, loaded = loaded_by("--help")
    assert code == 0
    assert loaded == set()


@pytest.mark.parametrize("command", ["run", "check", "search", "sweep", "validate", "plot", "calibrate"])
def test_command_help_imports_no_library(command):
    code, loaded = loaded_by(command, "--help")
    assert code == 0
    assert loaded == set()


def test_check_imports_no_table_or_chart_library():
    code, loaded = loaded_by("check", str(SCENARIOS / "gpt3-175b_a100-1024.yaml"))
    assert code == 0
    assert loaded & {"pandas", "pyarrow", "networkx", "simpy", "matplotlib", "analysis"} == set()


def test_run_without_chart_loads_no_matplotlib(tmp_path):
    code, loaded = loaded_by("run", str(SCENARIOS / "tiny.yaml"), "-o", str(tmp_path), "--no-plot")
    assert code == 0
    assert {"pandas", "pyarrow", "simpy"} <= loaded  # the probe does see what a command loads
    assert "matplotlib" not in loaded and "analysis" not in loaded
    assert not (tmp_path / "gantt.png").exists()


def test_bad_scenario_is_one_line_before_any_heavy_import(tmp_path):
    code, loaded = loaded_by("check", str(tmp_path / "missing.yaml"))
    assert code != 0
    assert loaded & {"pandas", "matplotlib", "networkx"} == set()


def test_background_charts_exist_when_run_returns(tmp_path, capsys):
    from sim.cli import main

    assert main(["run", str(SCENARIOS / "tiny.yaml"), "-o", str(tmp_path)], background=True) == 0
    assert (tmp_path / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "gantt.png" in capsys.readouterr().out  # the listing is printed after the chart process exits


def test_background_chart_failure_is_one_line(tmp_path, capsys):
    from sim.cli import main

    (tmp_path / "gantt.png").mkdir()  # the chart cannot be written there
    code = main(["run", str(SCENARIOS / "tiny.yaml"), "-o", str(tmp_path)], background=True)
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert err.startswith("error: cannot write") and "gantt.png" in err
    assert (tmp_path / "summary.json").is_file()  # the rest was written


def test_background_bad_scenario_ends_the_chart_process(tmp_path, capsys):
    from sim.cli import main

    code = main(["run", str(SCENARIOS / "tiny.yaml"), "--set", "parallel.tp=3", "-o", str(tmp_path)],
                background=True)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: ")
    assert not (tmp_path / "gantt.png").exists()
