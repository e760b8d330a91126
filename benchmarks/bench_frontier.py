"""Benchmark: the bundled frontier-scale scenarios (issue 25, must-show 3).

1. ``scenarios/llama3.1-405b_h100-16384.yaml`` (16,384 H100) in the default mode: ``sim run`` as a whole
   process (summary, trace, Gantt chart) and ``runner.run`` in process (what the run's "wall time" reports).
2. The same with ``ranks: all`` on the contention network (every rank simulated, TP groups folded), as a
   whole ``sim run --no-plot`` process: wall time and peak RSS.
3. ``scenarios/gpt-1t_h100-98304.yaml`` (98,304 H100) in the default mode, as in 1.
4. ``scenarios/llama3.1-405b_h100-16384_cp16-128k.yaml`` (the 128K variant with context parallelism 16, issue 24)
   in the default mode, as in 1.
Every time is printed with the peak RSS of the process that spent it.
Run: python benchmarks/bench_frontier.py [--repeat 3] [--skip-all-ranks]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from measure import ROOT, machine, mib, python, run_once, timed_call, timed_command

from sim import runner
from sim.spec.scenario import load_scenario

LLAMA = ROOT / "scenarios" / "llama3.1-405b_h100-16384.yaml"
FRONTIER = ROOT / "scenarios" / "gpt-1t_h100-98304.yaml"
LLAMA_128K = ROOT / "scenarios" / "llama3.1-405b_h100-16384_cp16-128k.yaml"


def default_mode(path: Path, repeat: int, out: str) -> None:
    whole = timed_command([python(), "-m", "sim", "run", str(path), "-o", str(Path(out) / path.stem)], repeat)
    print(f"[frontier] {path.stem}: sim run (whole process) {whole}")
    scenario = load_scenario(path)
    results = []
    inside = timed_call(lambda: results.append(runner.run(scenario)), repeat)
    result = results[-1]
    print(f"[frontier] {path.stem}: runner.run in process {inside.seconds:.3f} s "
          f"(runs {', '.join(f'{s:.3f}' for s in inside.runs)}; CPU {inside.cpu:.3f} s), {len(result.trace):,} tasks, "
          f"step {result.summary.step_time_s:.3f} s, MFU {result.summary.mfu:.1%}; process peak RSS "
          f"{mib(inside.peak_rss)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-all-ranks", action="store_true")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as out:
        if not args.skip_all_ranks:  # first: in-process peaks only grow, and this one runs in a child
            wall, rss, cpu = run_once([python(), "-m", "sim", "run", str(LLAMA), "--set", "ranks=all", "--set",
                                  "network.model=contention", "--no-plot", "-o", str(Path(out) / "all")])
            summary = (Path(out) / "all" / "summary.json").read_text()
            print(f"[frontier] {LLAMA.stem} ranks: all, contention: sim run --no-plot {wall:.1f} s (CPU {cpu:.1f} s), "
                  f"peak RSS {mib(rss)}; summary {len(summary):,} bytes")
        default_mode(LLAMA, args.repeat, out)
        default_mode(FRONTIER, args.repeat, out)
        default_mode(LLAMA_128K, args.repeat, out)


if __name__ == "__main__":
    main()
