"""Benchmark: ``sim search``'s two phases (issue 25, must-show 4): layouts screened per second by the closed-form
estimate, and the wall time to confirm the best ``--top`` layouts by simulation on ``--jobs`` processes.

1. Screen: ``search.screen`` over every layout of a bundled scenario (the 175B one, and the Mixtral MoE one),
   ``--repeat`` times, each with a fresh ``Estimator`` (so no run reuses another's caches), with ``jobs=--jobs``
   (forked processes, as ``sim search -j`` screens) and in this process alone. Layouts/s = layouts / the median
   time; CPU seconds count the forked processes too. Baseline in the same run: ``search.candidate`` alone over
   the same layouts (building each layout's scenario and checking its rules, which every screened layout pays
   before it is priced). The critical path of ``-j``: the parent's own CPU in the ``-j`` screen (columns, fork,
   the rows back, the table) plus the CPU of the costlier of the shares the processes price
   (``search_processes._partition``), each priced alone in this process with a fresh ``Estimator`` (as a forked process
   does): the wall time ``-j`` takes where each process has a core of its own, measured in CPU seconds so that a
   shared machine's other jobs do not count.
2. Confirm: ``python -m sim search SCENARIO --no-bound --top N -j J --no-plot`` as a whole process
   (``--confirm-repeat`` times), with the ``simulated N in S s`` it prints: the confirmation's own time.
Peak RSS next to each time: the largest of this process and its screening processes after the screens, the
child's for the whole search.
Run: python benchmarks/bench_search.py [--repeat 3] [--top 1000] [--jobs 2] [--confirm-repeat 3] [--skip-confirm]
     [--skip-screen]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import tempfile
import time

from measure import ROOT, child_env, machine, mib, python, timed_call

from sim.explore import search, search_processes, search_screen
from sim.explore.estimate import Estimator
from sim.spec.scenario import load_scenario

SCENARIOS = {"GPT-3 175B, 1024 A100": "gpt3-175b_a100-1024.yaml", "Mixtral 8x7B, 64 H100": "mixtral-8x7b_h100-64.yaml"}
CONFIRMED = re.compile(r"simulated ([\d,]+) in ([\d.]+) s")


def screen_rate(name: str, file: str, repeat: int, jobs: int) -> None:
    base = load_scenario(ROOT / "scenarios" / file)
    space = list(search.layouts(base))

    def candidates() -> None:
        for layout in space:
            try:
                search.candidate(base, layout)
            except ValueError:
                pass

    floor = timed_call(candidates, repeat)
    alone = timed_call(lambda: search.screen(base, space), repeat)
    timed = timed_call(lambda: search.screen(base, space, jobs=jobs), repeat)
    rate = len(space) / timed.seconds
    print(f"[screen] {name}: {len(space):,} layouts in {timed.seconds:.3f} s = {rate:,.0f} layouts/s with -j {jobs} "
          f"(runs {', '.join(f'{s:.3f}' for s in timed.runs)}; CPU {timed.cpu:.3f} s = {len(space) / timed.cpu:,.0f} "
          f"per CPU second, its processes included); peak RSS {mib(timed.peak_rss)}")
    print(f"[screen] {name}, one process: {len(space):,} layouts in {alone.seconds:.3f} s = "
          f"{len(space) / alone.seconds:,.0f} layouts/s (runs {', '.join(f'{s:.3f}' for s in alone.runs)}; CPU "
          f"{alone.cpu:.3f} s = {len(space) / alone.cpu:,.0f} per CPU second); -j {jobs} is "
          f"{alone.seconds / timed.seconds:.2f}x its wall rate")
    own = []  # the -j screen's parent alone: its columns, forks, the rows back and the table
    for _ in range(repeat):
        began = resource.getrusage(resource.RUSAGE_SELF)
        search.screen(base, space, jobs=jobs)
        ended = resource.getrusage(resource.RUSAGE_SELF)
        own.append(ended.ru_utime + ended.ru_stime - began.ru_utime - began.ru_stime)
    shares = [[space[i] for i in share] for share in search_processes._partition(space, jobs)]
    priced = [timed_call(lambda share=share: search_screen._screen_columns(base, share, Estimator(base)), repeat).cpu
              for share in shares]  # type: ignore[misc]
    path = statistics.median(own) + max(priced)
    print(f"[screen] {name}: -j {jobs} critical path {path:.3f} CPU s = {len(space) / path:,.0f} layouts per CPU "
          f"second of the slowest process (the parent {statistics.median(own):.3f} CPU s, its shares "
          f"{' and '.join(f'{len(share):,} layouts {cpu:.3f}' for share, cpu in zip(shares, priced, strict=True))} "
          f"CPU s, medians of {repeat}): -j {jobs}'s wall time with a core for each process")
    print(f"[screen] {name}: baseline, building and rule-checking the layouts alone: {floor.seconds:.3f} s = "
          f"{len(space) / floor.seconds:,.0f} layouts/s (runs {', '.join(f'{s:.3f}' for s in floor.runs)}; "
          f"CPU {floor.cpu:.3f} s = {len(space) / floor.cpu:,.0f} per CPU second); the screen in one process takes "
          f"{alone.seconds / floor.seconds:.1f}x that ({alone.cpu / floor.cpu:.1f}x in CPU time)")


def confirm(top: int, jobs: int, repeat: int) -> None:
    walls, confirms, peaks, cpus = [], [], [], []
    done = 0
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as out, tempfile.TemporaryFile("w+") as log:
            argv = [python(), "-m", "sim", "search", str(ROOT / "scenarios" / "gpt3-175b_a100-1024.yaml"),
                    "--no-bound", "--top", str(top), "-j", str(jobs), "--no-plot", "-o", out]
            began = time.perf_counter()
            child = subprocess.Popen(argv, cwd=ROOT, env=child_env() | {"COLUMNS": "200"}, stdout=log,
                                     stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(child.pid, 0)  # the child's own peak RSS (its workers' included)
            walls.append(time.perf_counter() - began)
            log.seek(0)
            text = log.read()
            if os.waitstatus_to_exitcode(status):
                raise SystemExit(f"{' '.join(argv)} failed: {text.strip()[-500:]}")
            found = CONFIRMED.search(text)
            if found is None:
                raise SystemExit(f"no 'simulated N in S s' line in: {text[-500:]}")
            done, seconds = int(found.group(1).replace(",", "")), float(found.group(2))
            confirms.append(seconds)
            peaks.append(usage.ru_maxrss * 1024)  # Linux reports KiB
            cpus.append(usage.ru_utime + usage.ru_stime)
    print(f"[confirm] GPT-3 175B: best {done:,} by estimate simulated with -j {jobs}: "
          f"{statistics.median(confirms):.1f} s (median of {repeat}: {', '.join(f'{s:.1f}' for s in confirms)}) = "
          f"{statistics.median(confirms) * jobs / max(1, done):.3f} s per layout per process; whole command "
          f"{statistics.median(walls):.1f} s wall, {statistics.median(cpus):.1f} s CPU; peak RSS "
          f"{mib(max(peaks))} (largest of the command and its workers)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--top", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=2, help="processes of the confirmation and of the screen")
    parser.add_argument("--confirm-repeat", type=int, default=3)
    parser.add_argument("--skip-confirm", action="store_true")
    parser.add_argument("--skip-screen", action="store_true", help="only the confirmation (scale_table's confirm log)")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    for name, file in SCENARIOS.items() if not args.skip_screen else ():
        screen_rate(name, file, args.repeat, args.jobs)
    if not args.skip_confirm:
        confirm(args.top, args.jobs, args.confirm_repeat)


if __name__ == "__main__":
    main()
