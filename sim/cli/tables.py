"""The command line's terminal tables: a run's summary and a plan's memory per stage.

In: a ``Summary`` (``sim run``) or the memory plan's rows (``sim check``). Out: rich ``Table``s and one-line
texts; nothing is printed here (``sim.cli.run`` and ``sim.cli.check`` print them through ``sim.cli.console``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Column, Table

from sim.model.params import active_params, total_params
from sim.model.transformer import ModelSpec
from sim.output.planning import Planning
from sim.plan import resolve
from sim.spec.scenario import Scenario
from sim.units import format_count
from sim.workload.footprint import PARTS

if TYPE_CHECKING:  # a type only: ``sim check`` prints its table without importing pandas
    from sim.interop.draft import Row
    from sim.output.summary import Summary


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


def _count(value: float) -> str:
    """A parameter count in billions (or millions), three significant figures: 8.03 B."""
    return f"{value / 1e9:.3g} B" if value >= 1e9 else f"{value / 1e6:.3g} M"


def parameters_line(model: ModelSpec) -> str:
    """``sim check``'s parameter count: total, and active per token for a mixture of experts."""
    total = total_params(model)
    line = f"parameters: {_count(total)} ({total:,})"
    if model.is_moe:
        active = active_params(model)
        line += f", {_count(active)} active per token ({active:,})"
    return line


def _duration(seconds: float) -> str:
    return f"{seconds / 86400:,.1f} days" if seconds >= 86400 else f"{seconds / 3600:.2f} h"


def _planning_rows(plan: Planning) -> list[tuple[str, str]]:
    """The token budget's rows (training.train_tokens): time, GPU-hours, GPU energy, cost."""
    if plan.train_tokens is None or plan.time_to_train_s is None or plan.gpu_hours is None:
        return []
    rows = [(f"time to train {format_count(plan.train_tokens)} tokens",
             f"{_duration(plan.time_to_train_s)} ({plan.train_steps:,} steps)"),
            ("GPU-hours", f"{plan.gpu_hours:,.4g}")]
    if plan.energy_kwh is not None:
        energy = f"{plan.energy_kwh / 1e3:,.4g} MWh" if plan.energy_kwh >= 1e3 else f"{plan.energy_kwh:.4g} kWh"
        rows.append(("GPU energy (board power x utilisation)", f"{energy} ({plan.compute_utilization:.0%} busy)"))
    if plan.cost is not None:
        rows.append(("cost", f"{plan.cost:,.4g} at {plan.price_per_gpu_hour:g} per GPU-hour"))
    return rows


def summary_title(summary: Summary) -> str:
    """The run's one-line heading: scenario, GPUs, layout, schedule, micro-batches."""
    layout = summary.layout
    extra = (f" cp {layout.cp}" if layout.cp > 1 else "") + (f" ep {layout.ep}" if layout.ep > 1 else "")
    return (f"{summary.scenario}: {summary.num_gpus} GPUs, tp {layout.tp} pp {layout.pp}{extra} "
            f"dp {layout.dp}, {summary.schedule}, {summary.microbatches} micro-batches")


def summary_table(summary: Summary, wall_s: float | None = None) -> Table:
    """``sim run``'s table of the headline numbers (and the optional ones the run has)."""
    table = Table("metric", Column("value", justify="right"), header_style="bold")
    peak = summary.peak_memory_bytes
    exposed = summary.exposed_comm_s
    rows = [
        ("step time", f"{summary.step_time_s:.4f} s"),
        ("parameters", _count(summary.parameters_total) + ("" if summary.parameters_active is None
                                                           else f" ({_count(summary.parameters_active)} active)")),
        ("tokens/s", f"{summary.tokens_per_s:,.0f}"),
        ("TFLOP/s per GPU (model)", f"{summary.tflops_per_gpu:.1f}"),
        ("MFU / HFU", f"{summary.mfu:.1%} / {summary.hfu:.1%}"
                      + (f" (causal count: {summary.mfu_causal:.1%})" if summary.mfu_causal is not None
                         and summary.mfu_causal < 0.99 * summary.mfu else "")),
        ("bubble fraction", f"{summary.bubble_fraction:.2%}"),
        *([("host-bound fraction", f"{summary.host_bound_fraction:.2%}")]
          if summary.host_bound_fraction > 0 else []),  # MoE passes behind the dispatcher's host sync
        ("exposed comm " + " / ".join(kinds := [k for k in ("tp", "pp", "dp", "ep", "cp") if k in exposed]),
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
        if summary.critical_path_s.host > 0:
            rows.append(("host on the critical path", f"{summary.critical_path_s.host:.4f} s issuing MoE passes"))
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
    rows.extend(_planning_rows(summary.planning))
    if wall_s is not None:
        rows.append(("wall time", f"{wall_s:.2f} s"))
    for name, value in rows:
        table.add_row(name, value)
    return table


def memory_table(scenario: Scenario, rows: list[dict[str, float]]) -> Table:
    """``sim check``'s table of the memory plan (``rows``, one per pipeline stage), in GiB."""
    table = Table(title=f"memory per GPU in GiB (estimate; HBM {_gib(scenario.cluster.gpu.hbm_capacity)}; "
                        f"{resolve(scenario).grad_storage_dtype} gradients)", header_style="bold")
    columns = [part for part in PARTS if any(row[part] for row in rows)]
    host = any(row["host"] for row in rows)
    for name in ("stage", "rank", *columns, "total", *(["host (offload)"] if host else [])):
        table.add_column(name.replace("_", " "), justify="right")
    for row in rows:
        total = f"{row['total'] / 2**30:.1f}" + ("" if row["fits"] else " (does not fit)")
        table.add_row(str(row["stage"]), str(row["rank"]), *(f"{row[c] / 2**30:.1f}" for c in columns), total,
                      *([f"{row['host'] / 2**30:.1f}"] if host else []))
    return table


def import_table(rows: list[Row], title: str) -> Table:
    """``sim import``'s report: one row per flag or key of the input, grouped by what became of it (mapped,
    a framework default written out, unmapped, unknown, ignored), in input order within a group."""
    order = {"mapped": 0, "default": 1, "unmapped": 2, "unknown": 3, "ignored": 4}
    table = Table(Column("status"), Column("flag / key", overflow="fold"), Column("value", overflow="fold",
                  max_width=24), Column("scenario field", overflow="fold"), Column("note", overflow="fold"),
                  title=title, header_style="bold")
    for row in sorted(rows, key=lambda r: order[r.status]):
        table.add_row(row.status, row.source, row.value, row.target, row.note)
    return table
