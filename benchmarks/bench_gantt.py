"""Benchmark: the Gantt writer's blocks per second, and that its time grows linearly with tasks (issue 25,
must-show 2).

The bundled GPT-3 175B scenario at global batch 384, 768 and 1536 (24, 48 and 96 micro-batches: about 40k,
80k and 159k tasks), each simulated once; then ``write_run_chart`` (what ``sim run`` calls: the chart of the
default ranks, saved as PNG) timed ``--repeat`` times. Blocks/s = the trace's tasks / the median time; the last
line fits CPU time = fixed + per-task cost over the three sizes (time linear in tasks).
Run: python benchmarks/bench_gantt.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from measure import ROOT, machine, mib, timed_call

from analysis.gantt import write_run_chart
from sim import runner
from sim.spec.scenario import load_scenario

SCENARIO = ROOT / "scenarios" / "gpt3-175b_a100-1024.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    rates, points = [], []
    with tempfile.TemporaryDirectory() as out:
        for batch in (384, 768, 1536):
            result = runner.run(load_scenario(SCENARIO, [f"training.global_batch={batch}"]))
            tasks = len(result.trace)
            timed = timed_call(lambda r=result: write_run_chart(Path(out), r.trace, r.summary), args.repeat)
            rates.append(tasks / timed.seconds)
            points.append((tasks, timed.cpu))
            print(f"[gantt] 175B, global batch {batch}: {tasks:,} tasks, write_run_chart {timed.seconds:.3f} s "
                  f"(runs {', '.join(f'{s:.3f}' for s in timed.runs)}) = {tasks / timed.seconds:,.0f} blocks/s "
                  f"(CPU {timed.cpu:.3f} s = {tasks / timed.cpu:,.0f} blocks per CPU second); "
                  f"{timed.seconds / tasks * 1e6:.2f} us per task; process peak RSS {mib(timed.peak_rss)}")
    # linear in tasks: the least-squares line through the three CPU times, and how far the points lie from it
    tasks_n, cpu = np.array([n for n, _ in points], dtype=float), np.array([c for _, c in points])
    slope, fixed = np.polyfit(tasks_n, cpu, 1)
    residual = np.abs(cpu - (fixed + slope * tasks_n)).max()
    print(f"[gantt] blocks/s at 40k / 80k / 159k tasks: {' / '.join(f'{r:,.0f}' for r in rates)}; CPU per chart "
          f"{' / '.join(f'{c:.3f}' for _, c in points)} s = {fixed * 1e3:.1f} ms + {slope * 1e6:.3f} us per task "
          f"(least squares, largest residual {residual * 1e3:.1f} ms); the fixed part is the page: the lanes' "
          "pixel columns, the frame and texts, the PNG encoding")


if __name__ == "__main__":
    main()
