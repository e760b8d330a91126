"""Benchmark: simulate the bundled GPT-3 175B / 1024-GPU scenario and compare the engine's event rate with a
bare simpy loop of the same number of events, timed in the same run (so the ratio, not the absolute time,
is what to compare across machines).

Run: python benchmarks/bench_engine.py [SCENARIO] [--repeat N]
Prints tasks simulated, events, wall time per phase, events/s, and the ratio to bare simpy.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import simpy

from sim import engine, network, runner, trace, workload
from sim.config import load_scenario

DEFAULT = Path(__file__).resolve().parent.parent / "scenarios" / "gpt3-175b_a100-1024.yaml"


def bare_simpy(events: int) -> float:
    """Wall seconds for one simpy process yielding ``events`` timeouts: the floor for that many events."""
    env = simpy.Environment()

    def loop():
        for _ in range(events):
            yield env.timeout(1e-6)

    env.process(loop())
    began = time.perf_counter()
    env.run()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", default=str(DEFAULT))
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; the median is reported")
    args = parser.parse_args()

    scenario = load_scenario(args.scenario)
    phases: dict[str, list[float]] = {"build": [], "simulate": [], "summarize": [], "bare": []}
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        graph = workload.build(scenario)
        net = network.make(scenario.network.model, runner.build_topology(scenario), scenario.network.algorithm)
        t1 = time.perf_counter()
        result = engine.simulate(graph, net)
        t2 = time.perf_counter()
        frame = trace.to_frame(graph, result.start, result.end)
        trace.summarize(frame, scenario)
        t3 = time.perf_counter()
        phases["build"].append(t1 - t0)
        phases["simulate"].append(t2 - t1)
        phases["summarize"].append(t3 - t2)
        phases["bare"].append(bare_simpy(result.events))

    median = {name: statistics.median(values) for name, values in phases.items()}
    total = median["build"] + median["simulate"] + median["summarize"]
    print(f"scenario          {scenario.name}")
    print(f"tasks simulated   {len(graph.tasks):,}")
    print(f"simpy events      {result.events:,}")
    print(f"wall: build {median['build']:.3f} s, simulate {median['simulate']:.3f} s, "
          f"summarize {median['summarize']:.3f} s, total {total:.3f} s (median of {args.repeat})")
    print(f"engine events/s   {result.events / median['simulate']:,.0f}")
    print(f"bare simpy        {median['bare']:.3f} s for the same events, {result.events / median['bare']:,.0f} events/s")
    print(f"ratio engine/bare {median['simulate'] / median['bare']:.2f}x (simulate phase); "
          f"{total / median['bare']:.2f}x (whole run)")


if __name__ == "__main__":
    main()
