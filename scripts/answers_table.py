"""The simulator's answers over every bundled and validation scenario, plus variants that reach each mechanism.

Usage:
    python scripts/answers_table.py -o docs/refactor/answers_before.csv        # record
    python scripts/answers_table.py -o /tmp/after.csv --compare docs/refactor/answers_before.csv

One row per case: step time, peak memory (max over simulated ranks), bubble fraction, host-bound fraction
(summary.json version 2: the compute stream's wait for the host behind a MoE dispatcher's host sync), exposed
communication per kind, the data-parallel bytes of the trace, per-rank peaks, and the closed-form estimate (step
time and memory bound). ``--compare`` prints every case whose answers moved, as a Markdown table, and exits 1 if any
did. Used to show that a refactor leaves the answers unchanged (issue 21, must-show 1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]

# Variants of scenarios/tiny.yaml that reach each mechanism the bundled files do not all reach.
TINY_VARIANTS: dict[str, list[str]] = {
    "tiny": [],
    "tiny-sp": ["parallel.sequence_parallel=true"],
    "tiny-sp-overlap": ["parallel.sequence_parallel=true", "parallel.tp_comm_overlap=true"],
    "tiny-gpipe": ["schedule=gpipe"],
    "tiny-interleaved": ["schedule=interleaved", "parallel.vpp=2"],
    "tiny-zb-h1": ["schedule=zb-h1"],
    "tiny-zb-h2": ["schedule=zb-h2"],
    "tiny-zb-v": ["schedule=zb-v", "parallel.vpp=2"],
    "tiny-zb-v-dp2": ["schedule=zb-v", "parallel.vpp=2", "parallel.tp=1", "parallel.dp=2"],
    "tiny-zb-v-dp2-zero1": ["schedule=zb-v", "parallel.vpp=2", "parallel.tp=1", "parallel.dp=2", "parallel.zero=1"],
    "tiny-zb-v-dp2-untied": ["schedule=zb-v", "parallel.vpp=2", "parallel.tp=1", "parallel.dp=2",
                           "model.tied_embeddings=false"],
    "tiny-selective": ["training.recompute=selective"],
    "tiny-full": ["training.recompute=full"],
    "tiny-full-partial": ["training.recompute=full", "training.recompute_num_layers=1"],
    "tiny-dp2": ["parallel.tp=1", "parallel.dp=2"],
    "tiny-dp2-zero1": ["parallel.tp=1", "parallel.dp=2", "parallel.zero=1"],
    "tiny-dp4-zero2": ["parallel.tp=1", "parallel.pp=1", "parallel.dp=4", "parallel.zero=2"],
    "tiny-interleaved-zero1": ["schedule=interleaved", "parallel.vpp=2", "parallel.tp=1", "parallel.dp=2",
                               "parallel.zero=1"],
    "tiny-dp4-zero3": ["parallel.tp=1", "parallel.pp=1", "parallel.dp=4", "parallel.zero=3"],
    "tiny-dp4-zero2-bf16grads": ["parallel.tp=1", "parallel.pp=1", "parallel.dp=4", "parallel.zero=2",
                                 "training.grad_dtype=bf16"],
    "tiny-fsdp": ["parallel.tp=1", "parallel.pp=1", "parallel.dp=4", "fsdp.sharding=FULL_SHARD"],
    "tiny-fsdp-noprefetch": ["parallel.tp=1", "parallel.pp=1", "parallel.dp=4", "fsdp.sharding=FULL_SHARD",
                             "fsdp.prefetch=false"],
    "tiny-fsdp-unit2": ["parallel.tp=1", "parallel.pp=1", "parallel.dp=4", "fsdp.sharding=FULL_SHARD",
                        "fsdp.unit_layers=2"],
    "tiny-fsdp-gradop": ["parallel.tp=1", "parallel.pp=1", "parallel.dp=4", "fsdp.sharding=SHARD_GRAD_OP"],
    "tiny-fsdp-hybrid": ["parallel.tp=1", "parallel.pp=1", "parallel.dp=4", "fsdp.sharding=HYBRID_SHARD"],
    "tiny-fsdp-noshard": ["parallel.tp=1", "parallel.pp=1", "parallel.dp=4", "fsdp.sharding=NO_SHARD"],
    "tiny-offload": ["parallel.tp=1", "parallel.pp=1", "parallel.dp=4", "parallel.zero=2", "offload.optimizer=true"],
    "tiny-offload-params": ["parallel.tp=1", "parallel.pp=1", "parallel.dp=4", "parallel.zero=3",
                            "offload.optimizer=true", "offload.params=true"],
    "tiny-uneven": ["parallel.tp=1", "parallel.dp=2", "model.num_layers=5", "parallel.first_stage_layers=2"],
    "tiny-nccl-sms": ["parallel.tp=1", "parallel.pp=1", "parallel.dp=4", "parallel.zero=3", "network.nccl_sms=16"],
    "tiny-all": ["ranks=all", "parallel.tp=1", "parallel.dp=2"],
    "tiny-all-contention": ["ranks=all", "parallel.tp=1", "parallel.dp=2", "network=contention"],
    "tiny-all-fold": ["ranks=all", "parallel.tp=2", "parallel.pp=1", "parallel.dp=2"],
    "tiny-event": ["engine=event"],
    "tiny-fixed": ["costs={model: fixed, forward: 1 ms, backward: 2 ms}", "network=ideal"],
    "tiny-fp16": ["training.dtype=fp16"],
    "tiny-fp32": ["training.dtype=fp32"],
    "tiny-unfused-flash": ["training.fused_kernels=false", "training.flash_attention=true"],
    "tiny-allocator": ["memory.reserved=1 GiB", "memory.allocator_overhead=0.1"],
    "tiny-straggler": ["ranks=all", "parallel.tp=1", "parallel.dp=2", "variation={slowdown: {1: 1.2}, jitter: 0.03}"],
}

COLUMNS = ["step_time_s", "peak_memory_bytes", "bubble_fraction", "host_bound_fraction", "exposed_tp_s",
           "exposed_pp_s", "exposed_dp_s", "dp_bytes", "tasks", "per_rank_peaks", "estimate_step_s",
           "estimate_peak_bytes"]


def cases() -> list[tuple[str, Path, list[str]]]:
    out: list[tuple[str, Path, list[str]]] = []
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        out.append((path.stem, path, []))
    for name, sets in TINY_VARIANTS.items():
        if sets:
            out.append((name, ROOT / "scenarios" / "tiny.yaml", sets))
    for path in sorted((ROOT / "scenarios" / "validation").glob("*.yaml")):
        out.append((f"validation/{path.stem}", path, []))
    # zb-v on a real model (pp 4 dp 2): the head's placement moves memory and DP bytes
    out.append(("pipeline-4x8-zb-v", ROOT / "scenarios" / "pipeline-4x8.yaml", ["schedule=zb-v", "parallel.vpp=2"]))
    out.append(("llama2-7b-pp2-dp4-zb-v", ROOT / "scenarios" / "llama2-7b_h100-8_dp.yaml",
                ["schedule=zb-v", "parallel.vpp=2", "parallel.pp=2", "parallel.dp=4"]))
    out.append(("llama2-7b-pp2-dp4-zb-v-zero1", ROOT / "scenarios" / "llama2-7b_h100-8_dp.yaml",
                ["schedule=zb-v", "parallel.vpp=2", "parallel.pp=2", "parallel.dp=4", "parallel.zero=1"]))
    out.append(("llama2-7b-pp2-dp4-1f1b", ROOT / "scenarios" / "llama2-7b_h100-8_dp.yaml",
                ["parallel.pp=2", "parallel.dp=4"]))
    return out


def answers(path: Path, sets: list[str]) -> dict[str, Any]:
    import sim  # noqa: F401  (imported lazily so --help works without the package)
    from sim.errors import SimError
    from sim.spec.scenario import load_scenario

    try:
        from sim import runner
        from sim.explore.estimate import estimate
        scenario = load_scenario(path, sets)
        result = runner.run(scenario)
        est = estimate(scenario)
    except SimError as error:
        return {"error": str(error)}
    summary = result.summary
    trace = result.trace
    exposed = summary.exposed_comm_s
    peaks = summary.peak_memory_bytes.per_rank
    return {
        "step_time_s": f"{summary.step_time_s:.9g}",
        "peak_memory_bytes": f"{peaks and max(peaks.values()):.9g}",
        "bubble_fraction": f"{summary.bubble_fraction:.9g}",
        "host_bound_fraction": f"{summary.host_bound_fraction:.9g}",
        "exposed_tp_s": f"{exposed['tp']:.9g}", "exposed_pp_s": f"{exposed['pp']:.9g}",
        "exposed_dp_s": f"{exposed['dp']:.9g}",
        "dp_bytes": int(trace.loc[trace["kind"] == "dp", "bytes"].sum()),
        "tasks": int(len(trace)),
        "per_rank_peaks": ";".join(f"{r}:{v:.6g}" for r, v in sorted(peaks.items(), key=lambda kv: int(kv[0]))),
        "estimate_step_s": f"{est.step_time_s:.9g}",
        "estimate_peak_bytes": f"{est.peak_memory_bytes:.9g}",
        "error": "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", required=True, type=Path)
    parser.add_argument("--compare", type=Path, help="a table recorded before; print what moved")
    parser.add_argument("--only", help="run only cases whose name contains this")
    args = parser.parse_args(argv)
    rows = []
    for name, path, sets in cases():
        if args.only and args.only not in name:
            continue
        rows.append({"case": name, "scenario": str(path.relative_to(ROOT)), "set": " ".join(sets),
                     **answers(path, sets)})
        print(f"{name}: {rows[-1].get('step_time_s', rows[-1].get('error'))}", file=sys.stderr)
    table = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    if args.compare is None:
        return 0
    before = pd.read_csv(args.compare, dtype=str, keep_default_na=False).set_index("case")
    after = pd.read_csv(args.out, dtype=str, keep_default_na=False).set_index("case")
    moved = []
    # a table recorded before a column existed (host_bound_fraction: summary.json version 2) is compared on the rest
    missing = [column for column in COLUMNS if column not in before.columns]
    if missing:
        print(f"{args.compare} lacks {', '.join(missing)}: not compared", file=sys.stderr)
    for case in after.index:
        if case not in before.index:
            continue
        for column in [c for c in COLUMNS if c not in missing] + ["error"]:
            old, new = before.at[case, column], after.at[case, column]
            if old != new:
                moved.append(f"| {case} | {column} | {old} | {new} |")
    if moved:
        print("| case | answer | before | after |\n|---|---|---|---|")
        print("\n".join(moved))
    print(f"{len(after)} cases, {len(moved)} answers moved", file=sys.stderr)
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
