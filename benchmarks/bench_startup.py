"""Benchmark: ``sim`` as the user feels it, whole processes (issue 25, must-show 1).

1. ``sim run scenarios/gpt3-175b_a100-1024.yaml -o DIR`` (summary, trace and Gantt chart) against
   ``python -c "import numpy, pandas"``, taking turns in the same run: medians, the ratio, peak RSS.
2. ``sim --help`` and ``sim check`` on the same scenario.
Commands run as ``python -m sim`` with this checkout first on PYTHONPATH (``measure.child_env``), so the
installed console script's launcher is not part of the figure.
Run: python benchmarks/bench_startup.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from measure import ROOT, interleaved, machine, python

SCENARIO = ROOT / "scenarios" / "gpt3-175b_a100-1024.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as out:
        run_dir = Path(out) / "run"
        times = interleaved({
            "sim run 175B": [python(), "-m", "sim", "run", str(SCENARIO), "-o", str(run_dir)],
            "import numpy, pandas": [python(), "-c", "import numpy, pandas"],
            "sim --help": [python(), "-m", "sim", "--help"],
            "sim check 175B": [python(), "-m", "sim", "check", str(SCENARIO)],
        }, args.repeat)
        written = sorted(p.name for p in run_dir.iterdir())
    for name, timed in times.items():
        print(f"[startup] {name}: {timed}")
    run, floor = times["sim run 175B"], times["import numpy, pandas"]
    print(f"[startup] sim run 175B / import numpy, pandas = {run.seconds / floor.seconds:.2f}x wall, "
          f"{run.cpu / floor.cpu:.2f}x CPU (wrote {', '.join(written)})")


if __name__ == "__main__":
    main()
