"""Benchmark: what one confirmation of ``sim search`` costs per layout (issue 25, must-show 4: the best 1,000 175B
layouts confirmed in under 60 s with ``-j 2``, i.e. about 0.12 CPU s per layout per process).

The bundled GPT-3 175B scenario is screened once (``search.screen``); of its best ``--top`` layouts by estimate,
every ``--every``-th is confirmed in this process, ``--repeat`` times, by the two paths in turn:
- ``confirm``: ``sweep.run_point``, the row ``sim search`` writes (``sim.explore.confirm``: the replayed graph read
  into arrays, no trace);
- ``full run``: the same layouts through ``sim.runner.run`` (trace frame and summary), the baseline in the same run.
Each layout's figures from the two paths are checked equal (every results-table column) before anything is
printed. CPU seconds per layout = the median run's CPU time / the layouts; a topology is built by a first
untimed layout, as in a worker process. ``[confirm-split]`` then times a confirmation's phases on the same layouts
(process time, the median of the repeats, per layout): plan and size check, the task graph's build, the replay,
the figures read from it, and freeing the graph, so what is left to cut is printed beside the total.
Run: python benchmarks/bench_confirm.py [--top 1000] [--every 50] [--repeat 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

from measure import ROOT, machine, mib, timed_call

from sim import runner
from sim.explore import confirm, search
from sim.explore.sweep import METRICS, SweepSpec, run_point, shipped
from sim.network import models as network
from sim.output.summary import Summary
from sim.plan import resolve
from sim.spec.degrees import degrees
from sim.spec.scenario import load_scenario
from sim.workload import build as workload
from sim.workload.size import Limits, check_limits

SCENARIO = ROOT / "scenarios" / "gpt3-175b_a100-1024.yaml"
SUMMARY_FIELDS = ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "hfu", "bubble_fraction",
                  "bubble_rate_stagewise", "host_bound_fraction", "fits_in_memory", "microbatches", "num_gpus",
                  "tasks")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=1000)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    base = load_scenario(SCENARIO)
    table = search.screen(base, list(search.layouts(base)))
    chosen = search.best(table, args.top).iloc[::args.every]
    layouts = [search.layout_of(row) for _, row in chosen.iterrows()]
    points = [layout.point() for layout in layouts]
    fixed = [f"training.global_batch={degrees(base).global_batch}", "training.microbatches=null", "fsdp=null"]
    spec = SweepSpec(SCENARIO, {}, fixed, explicit=points)
    shipped_base, overrides, files = shipped(spec, points)
    scenarios = [search.candidate(base, layout) for layout in layouts]

    def confirm_all() -> list[dict]:
        return [run_point(*shipped_base, overrides, point, spec.keys, None, point_files)
                for point, point_files in zip(points, files, strict=True)]

    def full_all() -> list[tuple[Summary, int]]:  # the summaries alone: 20 traces and graphs would hold GiBs
        return [(result.summary, degrees(result.scenario).global_batch)
                for result in map(runner.run, scenarios)]

    run_point(*shipped_base, overrides, points[0], spec.keys, None, files[0])  # the topology, once per process
    rows, results = confirm_all(), full_all()
    for row, (summary, global_batch) in zip(rows, results, strict=True):
        exposed = summary.exposed_comm_s
        expected = {**{key: getattr(summary, key) for key in SUMMARY_FIELDS},
                    "exposed_tp_s": exposed["tp"], "exposed_pp_s": exposed["pp"], "exposed_dp_s": exposed["dp"],
                    "exposed_ep_s": exposed.get("ep", 0.0), "peak_memory_bytes": summary.peak_memory_bytes.max,
                    "global_batch": global_batch}
        if {key: row[key] for key in METRICS} != expected:
            raise SystemExit(f"confirmation differs from the full run: {row} against {expected}")
    tasks = statistics.mean(row["tasks"] for row in rows)
    cpu: dict[str, list[float]] = {"confirm": [], "full run": []}
    walls: dict[str, list[float]] = {"confirm": [], "full run": []}
    for _ in range(args.repeat):  # the two paths take turns, so load changes hit both
        for name, function in (("confirm", confirm_all), ("full run", full_all)):
            timed = timed_call(function, 1)
            cpu[name].append(timed.cpu)
            walls[name].append(timed.seconds)
    n = len(points)
    per = {name: statistics.median(values) / n for name, values in cpu.items()}
    print(f"[confirm-cpu] GPT-3 175B: {n} of the best {args.top:,} (every {args.every}th, {tasks:,.0f} tasks on "
          f"average): confirm {per['confirm']:.3f} CPU s per layout (runs "
          f"{', '.join(f'{c / n:.3f}' for c in cpu['confirm'])}; wall "
          f"{statistics.median(walls['confirm']) / n:.3f} s), full run {per['full run']:.3f} CPU s per layout "
          f"(runs {', '.join(f'{c / n:.3f}' for c in cpu['full run'])}) = {per['full run'] / per['confirm']:.2f}x; "
          f"the target's 1,000 in 60 s with -j 2 needs 0.120; {len(METRICS)} columns equal on every layout; "
          f"process peak RSS {mib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)}")
    phases = [split(scenarios) for _ in range(args.repeat)]
    median = {name: statistics.median(run[name] for run in phases) / n for name in phases[0]}
    print(f"[confirm-split] GPT-3 175B, same {n} layouts, CPU s per layout (median of {args.repeat}): "
          + ", ".join(f"{name} {value:.3f}" for name, value in median.items())
          + f"; sum {sum(median.values()):.3f}; {sum(median.values()) / tasks * 1e6:.2f} us per task")


def split(scenarios: list) -> dict[str, float]:
    """CPU seconds of each phase of ``confirm`` (as ``runner.simulate`` and ``confirm._figures`` run them, the
    cycle collector paused as there), summed over the layouts."""
    spent = dict.fromkeys(("plan", "build", "replay", "figures", "free"), 0.0)
    with runner.without_gc():
        for scenario in scenarios:
            clock = time.process_time()

            def lap(name: str) -> None:
                nonlocal clock
                now = time.process_time()
                spent[name] += now - clock
                clock = now

            plan = resolve(scenario)
            check_limits(plan, Limits())
            net = network.make(scenario.network.model, runner.build_topology(plan), scenario.network.algorithm,
                               scenario.network.protocol)
            lap("plan")
            graph = workload.build(plan, lazy=True)  # as runner.simulate builds a confirmation's
            lap("build")
            result = runner.replay(scenario, graph, net)
            lap("replay")
            simulated = runner.Simulated(plan, runner.build_topology(plan), graph, result, 0.0)
            confirm._figures(simulated)
            lap("figures")
            del simulated, graph, result
            lap("free")
    return spent


if __name__ == "__main__":
    main()
