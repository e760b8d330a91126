"""Benchmark: the flow-level ``contention`` network against the ``analytic`` one on a 1024-GPU step with every
rank simulated (``ranks: all``), timed in the same run so the ratio is what to compare across machines.

Scenario: the bundled GPT-3 175B on 1024 A100s (tp 8, pp 8, dp 16), with a global batch of 128 sequences (8
micro-batches per pipeline) so that all 1024 ranks (~1.3M tasks) fit in a couple of minutes of pure Python.
Run: python benchmarks/bench_network.py [--global-batch N]
Prints per model: tasks, simpy events, wall time to build and to simulate, events/s, the step time, and the
contention/analytic ratios; and a bare simpy loop of the same number of events as the floor.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench_engine import bare_simpy

from sim import runner
from sim.engine import event as engine
from sim.network import models as network
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload import build as workload

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "gpt3-175b_a100-1024.yaml"


def measure(model: str, global_batch: int) -> dict[str, float]:
    scenario = load_scenario(SCENARIO, [f"training.global_batch={global_batch}", "ranks=all",
                                        f"network.model={model}"])
    began = time.perf_counter()
    graph = workload.build(resolve(scenario))
    net = network.make(model, runner.build_topology(resolve(scenario)), scenario.network.algorithm)
    built = time.perf_counter()
    result = engine.simulate(graph, net)
    done = time.perf_counter()
    return {"tasks": len(graph.tasks), "events": result.events, "build_s": built - began, "simulate_s": done - built,
            "step_s": max(result.end)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--global-batch", type=int, default=128)
    args = parser.parse_args()
    rows = {model: measure(model, args.global_batch) for model in ("analytic", "contention")}
    floor = bare_simpy(int(rows["contention"]["events"]))
    print(f"GPT-3 175B, 1024 A100, ranks: all, global batch {args.global_batch}")
    for model, row in rows.items():
        print(f"{model:10s} tasks {row['tasks']:,}  events {row['events']:,}  build {row['build_s']:.1f} s  "
              f"simulate {row['simulate_s']:.1f} s  {row['events'] / row['simulate_s']:,.0f} events/s  "
              f"step {row['step_s']:.4f} s")
    a, c = rows["analytic"], rows["contention"]
    print(f"contention/analytic: simulate {c['simulate_s'] / a['simulate_s']:.2f}x, events "
          f"{c['events'] / a['events']:.2f}x, step time {c['step_s'] / a['step_s']:.4f}x")
    print(f"bare simpy: {floor:.1f} s for the contention run's events; contention engine at "
          f"{c['simulate_s'] / floor:.1f}x of that floor")


if __name__ == "__main__":
    main()
