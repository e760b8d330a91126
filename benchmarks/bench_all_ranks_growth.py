"""Benchmark: how the 16,384-GPU scenario's `ranks: all` run on the contention network grows (issue 25, must-show 3).

The Llama 3.1 405B layout (tp 8, pp 16, interleaved vpp 8, FSDP no-reshard; scenarios/llama3.1-405b_h100-16384.yaml)
at a growing data-parallel degree, everything else as bundled: dp d on 16 d nodes with a global batch of 16 d
sequences, so that every pipeline runs the scenario's 16 micro-batches and the run holds d of its 128 pipelines
(the bundled run is d = 128). Each point is a whole ``sim run --no-plot`` process (its summary, trace and link
usage written), its CPU seconds (user + system: what the command spent, whatever the machine's load), wall
seconds and peak RSS. Printed per point: tasks (the run-size estimate, sim/workload/size.py), CPU s, wall s, peak
RSS, CPU microseconds and RSS bytes per task; then the growth exponent between consecutive points (log CPU /
log d: 1 is linear) and the bundled run's CPU time and peak RSS extrapolated linearly from the largest point.

Run: python benchmarks/bench_all_ranks_growth.py [--dp 2 4 8 16] [--repeat 1]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from pathlib import Path

from measure import ROOT, machine, mib, python, run_once

from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload.size import estimate_size

LLAMA = ROOT / "scenarios" / "llama3.1-405b_h100-16384.yaml"
BUNDLED_DP = 128


def overrides(dp: int) -> list[str]:
    """The scenario at data-parallel degree ``dp``: its 16 micro-batches per pipeline kept, every rank simulated
    on the contention network."""
    return ["ranks=all", "network.model=contention", f"parallel.dp={dp}", f"cluster.nodes={16 * dp}",
            f"training.global_batch={16 * dp}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    points: list[tuple[int, int, float, float, int]] = []
    with tempfile.TemporaryDirectory() as out:
        for dp in sorted(args.dp):
            tasks = estimate_size(resolve(load_scenario(LLAMA, overrides(dp)))).tasks
            argv = [python(), "-m", "sim", "run", str(LLAMA), "--no-plot", "-o", str(Path(out) / f"dp{dp}")]
            for item in overrides(dp):
                argv += ["--set", item]
            runs = [run_once(argv) for _ in range(args.repeat)]
            wall = statistics.median(w for w, _, _ in runs)
            cpu = statistics.median(c for _, _, c in runs)
            rss = max(r for _, r, _ in runs)
            points.append((dp, tasks, cpu, wall, rss))
            print(f"[growth] dp {dp:>3} ({16 * dp * 8:,} GPUs, {dp} pipelines): {tasks:,} tasks (estimate), "
                  f"CPU {cpu:.1f} s, wall {wall:.1f} s, peak RSS {mib(rss)}; {cpu / tasks * 1e6:.1f} CPU us and "
                  f"{rss / tasks:,.0f} RSS bytes per task (median of {args.repeat}; {machine()})", flush=True)
    for (dp0, _, cpu0, _, rss0), (dp1, _, cpu1, _, rss1) in zip(points, points[1:], strict=False):
        exponent = math.log(cpu1 / cpu0) / math.log(dp1 / dp0)
        print(f"[growth] dp {dp0} -> {dp1}: CPU x{cpu1 / cpu0:.2f} (exponent {exponent:.2f}), "
              f"peak RSS x{rss1 / rss0:.2f}")
    dp, tasks, cpu, _, rss = points[-1]
    bundled = estimate_size(resolve(load_scenario(LLAMA, ["ranks=all", "network.model=contention"]))).tasks
    scale = bundled / tasks
    print(f"[growth] linear from dp {dp} to the bundled dp {BUNDLED_DP} ({bundled:,} tasks, x{scale:.1f}): "
          f"CPU ~{cpu * scale:.0f} s, peak RSS ~{mib(rss * scale)}")


if __name__ == "__main__":
    main()
