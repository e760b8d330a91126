"""The run budget's estimate (sim.workload.size) against what a run builds and holds (issue 27).

In: scenario paths and ``--set`` overrides (default: every bundled scenario, then the 530B dp8 validation scenario
on the contention network). Out: printed lines, one per scenario: estimated and built tasks, estimated and
counted engine events, estimated bytes, and the bytes the run added to the process's peak RSS (each scenario in
its own child process, so the peak is its own: RSS after loading the scenario, then the peak after
``runner.run``). ``BYTES_PER_TASK`` and ``BYTES_PER_GPU`` in sim/workload/size.py come from these figures.

    python benchmarks/bench_size.py [SCENARIO ...] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from measure import ROOT, child_env, machine, mib

CHILD = """
import json, resource, sys
from sim import runner
from sim.plan import resolve
from sim.spec.scenario import load_scenario
from sim.workload.size import Limits, estimate_size
scenario = load_scenario(sys.argv[1], sys.argv[2:])
size = estimate_size(resolve(scenario))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
result = runner.run(scenario, limits=Limits(max_tasks=10**12, max_memory=2**60))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"tasks": len(result.graph.tasks), "events": result.events, "added": after - before,
                  "est_tasks": size.tasks, "est_events": size.events, "est_bytes": size.bytes,
                  "gpus": scenario.cluster.num_gpus, "network": scenario.network.model}))
"""

DEFAULT = [[str(p)] for p in sorted((ROOT / "scenarios").glob("*.yaml"))] + [
    [str(ROOT / "scenarios/validation/korthikanti-530b-dp8-sp-selective.yaml"), "network.model=contention"]]


def measure(argv: list[str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, *argv], cwd=ROOT, env=child_env(), check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scenarios", nargs="*")
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    cases = [[path, *args.set] for path in args.scenarios] or DEFAULT
    print(machine())
    for case in cases:
        r = measure(case)
        name = " ".join([case[0].rsplit("/", 1)[-1], *case[1:]])
        print(f"{name}: tasks {r['est_tasks']:,} est / {r['tasks']:,} built ({r['est_tasks'] / r['tasks']:.3f}); "
              f"events {r['est_events']:,} est / {r['events']:,}; bytes {mib(r['est_bytes'])} est / "
              f"{mib(r['added'])} added to peak RSS ({r['added'] / r['tasks']:,.0f} B per task; {r['gpus']:,} GPUs, "
              f"{r['network']})", flush=True)


if __name__ == "__main__":
    main()
