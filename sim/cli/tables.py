"""The command line's terminal tables: a run's summary and a plan's memory per stage.

In: a ``Summary`` (``sim run``) or the memory plan's rows (``sim check``). Out: rich ``Table``s and one-line
texts; nothing is printed here (``sim.cli.commands`` prints them through ``sim.cli.console``).
"""

from __future__ import annotations

from rich.table import Column, Table

from sim.output.summary import Summary
from sim.plan import resolve
from sim.spec.scenario import Scenario
from sim.workload.footprint import PARTS


def _gib(value: float) -> str:
    return f"{value / 2**30:.1f} GiB"


def memory_problem(summary: Summary) -> str:
    """One line naming the rank that does not fit, what it needs and its three largest parts."""
    per_rank = summary.peak_memory_bytes.per_rank
    rank = max(per_rank, key=lambda r: per_rank[r])
    parts = summary.memory_breakdown_bytes[rank]
    largest = sorted((k for k in parts if k not in ("total", "host")), key=lambda k: -parts[k])[:3]
    detail = ", ".join(f"{k} {_gib(parts[k])}" for k in largest)
    return (f"rank {rank} needs {_gib(per_rank[rank])} but the GPU has {_gib(summary.hbm_capacity_bytes)} "
            f"(largest: {detail})")


def summary_title(summary: Summary) -> str:
    """The run's one-line heading: scenario, GPUs, layout, schedule, micro-batches."""
    layout = summary.layout
    return (f"{summary.scenario}: {summary.num_gpus} GPUs, tp {layout.tp} pp {layout.pp} "
            f"dp {layout.dp}, {summary.schedule}, {summary.microbatches} micro-batches")


def summary_table(summary: Summary, wall_s: float | None = None) -> Table:
    """``sim run``'s table of the headline numbers (and the optional ones the run has)."""
    table = Table("metric", Column("value", justify="right"), header_style="bold")
    peak = summary.peak_memory_bytes
    exposed = summary.exposed_comm_s
    rows = [
        ("step time", f"{summary.step_time_s:.4f} s"),
        ("tokens/s", f"{summary.tokens_per_s:,.0f}"),
        ("TFLOP/s per GPU (model)", f"{summary.tflops_per_gpu:.1f}"),
        ("MFU / HFU", f"{summary.mfu:.1%} / {summary.hfu:.1%}"),
        ("bubble fraction", f"{summary.bubble_fraction:.2%}"),
        ("exposed comm " + " / ".join(kinds := [k for k in ("tp", "pp", "dp", "ep") if k in exposed]),
         " / ".join(f"{exposed[k] * 1e3:.1f}" for k in kinds) + " ms"),
        ("peak memory per GPU", f"{_gib(peak.max)} of {_gib(summary.hbm_capacity_bytes)}"
                                + ("" if summary.fits_in_memory else "  [does not fit]")),
        ("tasks simulated", f"{summary.tasks:,}"),
    ]
    if summary.critical_rank is not None and summary.critical_path_s is not None:  # ranks: all
        rank = str(summary.critical_rank)
        waits = summary.collective_wait_s or {}
        rows.append(("critical rank", f"{rank}: {summary.critical_path_s.compute_by_rank.get(rank, 0.0):.4f} s "
                                      f"of compute on the critical path"))
        worst = max(waits, key=lambda r: waits[r]) if waits else None
        if worst is not None and waits[worst] > 0:
            rows.append(("longest collective wait", f"rank {worst}: {waits[worst] * 1e3:.1f} ms"))
    if summary.nccl_sm_stretch_s is not None:  # network.nccl_sms
        rows.append(("compute lost to NCCL's SMs", f"{summary.nccl_sm_stretch_s * 1e3:.1f} ms (worst rank)"))
    if summary.critical_link is not None:
        link = summary.critical_link
        rows.append(("critical link", f"{link.link}: saturated {link.saturated_s * 1e3:.1f} ms"))
    for busy in (summary.busiest_links or [])[:3]:
        rows.append((f"busy link {busy.link}", f"{busy.utilization:.0%} of the step, "
                                               f"saturated {busy.saturated_s * 1e3:.1f} ms"))
    if wall_s is not None:
        rows.append(("wall time", f"{wall_s:.2f} s"))
    for name, value in rows:
        table.add_row(name, value)
    return table


def memory_table(scenario: Scenario, rows: list[dict[str, float]]) -> Table:
    """``sim check``'s table of the memory plan (``rows``, one per pipeline stage), in GiB."""
    table = Table(title=f"memory per GPU in GiB (estimate; HBM {_gib(scenario.cluster.gpu.hbm_capacity)}; "
                        f"{resolve(scenario).grad_dtype} gradients)", header_style="bold")
    columns = [part for part in PARTS if any(row[part] for row in rows)]
    host = any(row["host"] for row in rows)
    for name in ("stage", "rank", *columns, "total", *(["host (offload)"] if host else [])):
        table.add_column(name.replace("_", " "), justify="right")
    for row in rows:
        total = f"{row['total'] / 2**30:.1f}" + ("" if row["fits"] else " (does not fit)")
        table.add_row(str(row["stage"]), str(row["rank"]), *(f"{row[c] / 2**30:.1f}" for c in columns), total,
                      *([f"{row['host'] / 2**30:.1f}"] if host else []))
    return table
