"""Benchmark: simulate the bundled GPT-3 175B / 1024-GPU scenario and compare the engine's event rate with a
bare simpy loop of the same number of events, timed in the same run (so the ratio, not the absolute time,
is what to compare across machines).

Run: python benchmarks/bench_engine.py [SCENARIO] [--repeat N]
Prints, for the default engine (exact longest-path evaluation on this scenario's analytic network) and for the
simpy event replay: tasks, events, wall time per phase; for simpy also events/s and the ratio to bare simpy.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import simpy

from sim import runner
from sim.engine import event as engine
from sim.network import models as network
from sim.output import trace
from sim.output.summary import summarize
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload import build as workload

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


def timed_run(scenario, replay) -> tuple[dict[str, float], object, int]:
    t0 = time.perf_counter()
    plan = resolve(scenario)
    graph = workload.build(plan)
    net = network.make(scenario.network.model, runner.build_topology(plan), scenario.network.algorithm,
                       scenario.network.protocol, plan.deepep_traffic)  # a flex scenario's DeepEP exchanges
    t1 = time.perf_counter()
    result = replay(graph, net)
    t2 = time.perf_counter()
    frame = trace.to_frame(graph, result.start, result.end)
    summarize(frame, resolve(scenario))
    t3 = time.perf_counter()
    return {"build": t1 - t0, "replay": t2 - t1, "summarize": t3 - t2}, result, len(graph.tasks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", default=str(DEFAULT))
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; the median is reported")
    args = parser.parse_args()

    scenario = load_scenario(args.scenario)
    engines = {"default (auto)": lambda g, n: runner.replay(scenario, g, n), "simpy event replay": engine.simulate}
    print(f"scenario          {scenario.name}")
    for label, replay in engines.items():
        with runner.without_gc():  # as runner.run does
            runs = [timed_run(scenario, replay) for _ in range(args.repeat)]
        median = {phase: statistics.median(r[0][phase] for r in runs) for phase in runs[0][0]}
        _, result, tasks = runs[-1]
        total = sum(median.values())
        print(f"--- {label}: {tasks:,} tasks, {result.events:,} events "
              f"({'simpy events' if replay is engine.simulate else 'tasks evaluated, no event queue'})")
        print(f"wall: build {median['build']:.3f} s, replay {median['replay']:.3f} s, summarize "
              f"{median['summarize']:.3f} s, total {total:.3f} s (median of {args.repeat})")
        if replay is engine.simulate:
            with runner.without_gc():  # the same conditions as the engine's
                bare = statistics.median(bare_simpy(result.events) for _ in range(args.repeat))
            print(f"events/s          {result.events / median['replay']:,.0f}; bare simpy {result.events / bare:,.0f}")
            print(f"ratio to bare     {median['replay'] / bare:.2f}x (replay); {total / bare:.2f}x (whole run)")
        else:
            print(f"tasks/s           {tasks / median['replay']:,.0f} (replay); {tasks / total:,.0f} (whole run)")


if __name__ == "__main__":
    main()
