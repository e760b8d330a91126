"""Benchmark: the issue's scale targets on this machine, each timed in the same run as its baseline.

1. The bundled GPT-3 175B / 1024-A100 scenario (global batch 1536) with every rank simulated (``ranks: all``,
   TP groups folded) on the flow-level ``contention`` network: build, simulate and summarize wall time,
   simpy events, events/s and the ratio to a bare simpy loop of the same number of events.
2. ``sim search`` on the same scenario: layouts screened per second by the closed-form estimate, and the wall
   time to confirm the best ``--top`` layouts by event simulation on ``--jobs`` processes (with the bound
   pruning off, so all of them run).
Run: python benchmarks/bench_scale.py [--skip-all-ranks] [--skip-search] [--top 1000] [--jobs 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench_engine import bare_simpy

from sim import runner
from sim.engine import event as engine
from sim.explore import search
from sim.network import models as network
from sim.output import trace
from sim.output.summary import summarize
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload import build as workload

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "gpt3-175b_a100-1024.yaml"


def every_rank() -> None:
    with runner.without_gc():  # as runner.run does
        _every_rank()


def _every_rank() -> None:
    scenario = load_scenario(SCENARIO, ["ranks=all", "network.model=contention"])
    began = time.perf_counter()
    graph = workload.build(resolve(scenario))
    net = network.make("contention", runner.build_topology(resolve(scenario)), scenario.network.algorithm)
    built = time.perf_counter()
    result = engine.simulate(graph, net)
    simulated = time.perf_counter()
    summary = summarize(trace.to_frame(graph, result.start, result.end), resolve(scenario))
    summarized = time.perf_counter()
    floor = bare_simpy(result.events)
    total = summarized - began
    print(f"[ranks: all, contention] GPT-3 175B, 1024 A100, global batch {resolve(scenario).global_batch}: "
          f"{len(graph.tasks):,} tasks ({graph.lockstep} TP ranks per process), {result.events:,} simpy events")
    print(f"  build {built - began:.1f} s, simulate {simulated - built:.1f} s, "
          f"summarize {summarized - simulated:.1f} s, total {total:.1f} s; step {summary.step_time_s:.4f} s")
    print(f"  {result.events / (simulated - built):,.0f} events/s; bare simpy {floor:.1f} s for the same events "
          f"({result.events / floor:,.0f}/s): simulate {(simulated - built) / floor:.1f}x, whole run "
          f"{total / floor:.1f}x that floor")


def layout_search(top: int, jobs: int) -> None:
    base = load_scenario(SCENARIO)
    began = time.perf_counter()
    space = list(search.layouts(base))
    table = search.screen(base, space)
    screened = time.perf_counter() - began
    print(f"[search] {len(space):,} layouts screened in {screened:.1f} s = {len(space) / screened:,.0f} layouts/s "
          f"(one process)")
    with tempfile.TemporaryDirectory() as out:
        found = search.run_search(SCENARIO, [], Path(out), top=top, jobs=jobs, use_bound=False)
    best = found.simulated.iloc[0]
    keys = ("parallel.tp", "parallel.pp", "parallel.dp", "parallel.vpp", "training.micro_batch", "schedule",
            "parallel.zero", "training.recompute")
    print(f"[search] best {len(found.simulated):,} by estimate simulated in {found.simulate_s:.1f} s on {jobs} "
          f"processes ({found.simulate_s / max(1, len(found.simulated)) * jobs:.2f} s per layout per process)")
    print("[search] best simulated: " + ", ".join(f"{k.split('.')[-1]} {best[k]}" for k in keys)
          + f": {best['step_time_s']:.3f} s, MFU {best['mfu']:.1%}")
    pp = found.simulated[found.simulated["parallel.pp"] > 1].iloc[0]
    print("[search] best with pipeline parallelism: " + ", ".join(f"{k.split('.')[-1]} {pp[k]}" for k in keys)
          + f": {pp['step_time_s']:.3f} s, MFU {pp['mfu']:.1%}")
    ok = table[table["status"] == "ok"]
    print(f"[search] statuses: {table['status'].str.split(':').str[0].value_counts().to_dict()}; "
          f"{len(ok):,} fit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-all-ranks", action="store_true")
    parser.add_argument("--skip-search", action="store_true")
    parser.add_argument("--top", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    if not args.skip_search:
        layout_search(args.top, args.jobs)
    if not args.skip_all_ranks:
        every_rank()


if __name__ == "__main__":
    main()
