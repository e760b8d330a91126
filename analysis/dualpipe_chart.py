"""Gantt chart of one DualPipe step (and DualPipeV's, with 1F1B for scale), like the DualPipe README's figures.

In: nothing but the sizes (defaults: the README's 8 ranks and 20 micro-batches for DualPipe, 4 ranks and 10
micro-batches for DualPipeV), or a list of (label, Scenario). Out: an image with one panel per schedule, one lane
per rank, every pass a block labelled with its micro-batch, the forward-direction copy in full colour and the
reverse copy (DualPipeV: the V's returning chunk) lighter, and each unit the code issues as one
``_forward_backward_chunk`` (an overlapped F&B pair: the forward of one micro-batch and the full backward of
another) framed in black, as the README frames "two cells with mutually overlapped computation and
communication". Each panel's title has the step time, the idle time per rank, and the README's formula.

The step is the simulator's: fixed costs as the README figure's cells (F = the input-gradient pass = W = 1 s per
chunk, so a full backward B = 2 s; dense layers, so a pair takes F + B = 3 s), an ideal network, one layer per
stage (two per rank in DualPipeV's V). ``python -m analysis dualpipe -o docs/images/gantt-dualpipe.png`` writes
the docs image.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.colors
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from analysis.chart_file import chart_path
from analysis.gantt import COLORS
from sim import runner
from sim.runner import RunResult
from sim.spec.scenario import Scenario, scenario_from_dict

KINDS = {"F": ("forward",), "B": ("backward", "recompute"), "W": ("weight",)}


def dualpipe_scenario(ranks: int, microbatches: int, schedule: str = "dualpipe", forward: float = 1.0,
                      input_grad: float = 1.0, weight_grad: float = 1.0) -> Scenario:
    """The chart's scenario: ``ranks`` GPUs, fixed per-chunk costs in seconds, an ideal network."""
    layers = 2 * ranks if schedule == "dualpipev" else ranks
    return scenario_from_dict({
        "name": f"{schedule}-{ranks}x{microbatches}",
        "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": ranks},
        "model": {"name": "dense", "num_layers": layers, "hidden_size": 1024, "num_attention_heads": 16,
                  "vocab_size": 32000, "max_seq_len": 1024},
        "training": {"microbatches": microbatches, "micro_batch": 1, "clip_grad": 0},
        "parallel": {"tp": 1, "pp": ranks, "dp": 1, "vpp": 2 if schedule in ("dualpipev", "zb-v") else 1,
                     "overlap_p2p_comm": True},
        "schedule": schedule,
        "costs": {"model": "fixed", "forward": f"{forward} s", "backward": f"{input_grad} s",
                  "weight_grad": f"{weight_grad} s"},
        "network": "ideal",
    })


def pass_blocks(result: RunResult) -> pd.DataFrame:
    """One row per pass of the schedule on each rank: rank, unit (index of the issued unit on that rank), phase,
    micro-batch, local chunk, start_s, end_s; from the trace's compute tasks of that pass (kind, micro-batch and
    the chunk's layers; the embedding and head count with their chunk)."""
    plan, trace = result.plan, result.trace
    compute = trace[trace["stream"] == "compute"]
    p, m, v = plan.pp, plan.microbatches, plan.vpp
    rows = []
    by_stage = dict(tuple(compute.groupby("stage")))
    for stage, actions in enumerate(plan.schedule.actions(p, m, v)):
        tasks = by_stage[stage]
        unit = 0
        for action in actions:
            g = plan.stage_chunks[stage][action.chunk]
            extras = {"embedding"} if g == 0 else set()
            extras |= {"lm_head"} if g == plan.chunks - 1 else set()
            mine = (tasks["layer"].isin(list(plan.chunk_layers(g)))
                    | ((tasks["layer"] == -1) & tasks["name"].isin(extras)))
            part = tasks[mine & tasks["kind"].isin(KINDS[action.phase]) & (tasks["microbatch"] == action.microbatch)]
            rows.append((stage, unit, action.phase, action.microbatch, action.chunk, float(part["start_s"].min()),
                         float(part["end_s"].max())))
            unit += not action.with_next
    return pd.DataFrame(rows, columns=["rank", "unit", "phase", "microbatch", "chunk", "start_s", "end_s"])


def _lighter(color: str, amount: float = 0.45) -> tuple[float, float, float]:
    r, g, b = matplotlib.colors.to_rgb(color)
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def plot_panel(ax: object, result: RunResult, label: str, formula: str | None = None) -> None:
    """Draws one schedule's step on ``ax`` (a Matplotlib Axes)."""
    blocks = pass_blocks(result)
    names = {"F": "forward", "B": "backward", "W": "weight"}
    for row in blocks.itertuples(index=False):
        base = COLORS[names[row.phase]]
        color = base if row.chunk == 0 else _lighter(base)
        ax.broken_barh([(row.start_s, row.end_s - row.start_s)], (row.rank - 0.4, 0.8),  # type: ignore[attr-defined]
                       facecolors=color, edgecolor="white", linewidth=0.5)
        ax.text((row.start_s + row.end_s) / 2, row.rank, str(row.microbatch), ha="center",  # type: ignore[attr-defined]
                va="center", fontsize=6, color="black" if row.chunk else "white")
    for (rank, _), unit in blocks.groupby(["rank", "unit"]):
        if len(unit) > 1 and "F" in set(unit["phase"]):  # an overlapped F&B pair
            start, end = unit["start_s"].min(), unit["end_s"].max()
            ax.add_patch(Rectangle((start, rank - 0.45), end - start, 0.9, fill=False,  # type: ignore[attr-defined]
                                   edgecolor="black", linewidth=1.2))
    trace = result.trace
    compute = trace[trace["stream"] == "compute"]
    span = float(compute["end_s"].max() - compute["start_s"].min())
    busy = (compute["end_s"] - compute["start_s"]).groupby(compute["stage"]).sum()
    idle = span - float(busy.max())
    title = f"{label}: step {result.summary.step_time_s:.1f} s, idle per rank {idle:.2f} s"
    ax.set_title(title + (f" = {formula}" if formula else ""), fontsize=9, loc="left")  # type: ignore[attr-defined]
    ranks = result.plan.pp
    ax.set_yticks(range(ranks))  # type: ignore[attr-defined]
    ax.set_yticklabels([f"rank {i}" for i in range(ranks)], fontsize=7)  # type: ignore[attr-defined]
    ax.set_ylim(ranks - 0.5, -0.5)  # type: ignore[attr-defined]
    ax.grid(axis="x", linewidth=0.3, alpha=0.5)  # type: ignore[attr-defined]


def default_panels() -> list[tuple[str, RunResult, str | None]]:
    """DualPipe (8 ranks, 20 micro-batches), DualPipeV (4 ranks, 10) and 1F1B (8 ranks, 20) with the chart's
    costs, each with its README bubble formula evaluated: F = 1, B = 2 (full backward), W = 1, F&B = F + B."""
    f, b, w = 1.0, 2.0, 1.0
    dual = f"(PP/2-1)(F&B+B-3W) = 3 x {f + b + b - 3 * w:g}"
    one = f"(PP-1)(F+B) = 7 x {f + b:g}"
    return [("DualPipe, PP = 8 ranks, 20 micro-batches (10 each way)", runner.run(dualpipe_scenario(8, 20)), dual),
            ("DualPipeV, 4 ranks (PP = 8 stages), 10 micro-batches",
             runner.run(dualpipe_scenario(4, 10, "dualpipev")), dual),
            ("1F1B, 8 ranks, 20 micro-batches", runner.run(dualpipe_scenario(8, 20, "1f1b")), one)]


def write_dualpipe_chart(path: Path | str,
                         panels: Sequence[tuple[str, RunResult, str | None]] | None = None) -> Path:
    path = chart_path(path)  # before the runs: a name Matplotlib cannot write is refused first
    panels = list(panels) if panels is not None else default_panels()
    end = max(result.summary.step_time_s for _, result, _ in panels)
    heights = [result.plan.pp for _, result, _ in panels]
    fig = Figure(figsize=(15, 1.2 + 0.36 * sum(heights) + 0.5 * len(panels)))  # no pyplot: backend left alone
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights})
    for ax, (label, result, formula) in zip(axes[:, 0], panels, strict=True):
        plot_panel(ax, result, label, formula)
    axes[-1, 0].set_xlim(0, end)
    axes[-1, 0].set_xlabel("time (s)")
    handles = [Patch(color=COLORS["forward"], label="F (forward-direction copy / V down)"),
               Patch(color=_lighter(COLORS["forward"]), label="F (reverse copy / V up)"),
               Patch(color=COLORS["backward"], label="B"),
               Patch(color=_lighter(COLORS["backward"]), label="B (reverse)"),
               Patch(color=COLORS["weight"], label="W"),
               Patch(facecolor="none", edgecolor="black", label="F&B issued as one overlapped pair")]
    axes[0, 0].legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.12), ncol=6, fontsize=7,
                      frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=140)
    return Path(path)


# ------------------------------------------------------------------------- MoE: overlapped dispatch/combine
def moe_dualpipe_scenario(ranks: str = "slice", **parallel: object) -> Scenario:
    """A 4-layer Mixtral-like MoE (8 experts, top-2, hidden 1024) under DualPipe on 16 H100: pp 4 (one layer per
    stage and copy), ep 4, 16 micro-batches of 2048 tokens, roofline costs and the analytic network; ``parallel``
    overrides parallel settings, ``ranks`` the simulated ranks (slice or all)."""
    return scenario_from_dict({
        "name": "moe-dualpipe", "ranks": ranks,
        "cluster": {"gpu": "H100-SXM", "nodes": 2, "gpus_per_node": 8},
        "model": {"name": "moe-small", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
                  "num_kv_heads": 8, "ffn_hidden_size": 2048, "vocab_size": 32000, "max_seq_len": 4096,
                  "mlp": "swiglu", "position_embedding": "rope", "norm": "rmsnorm", "tied_embeddings": False,
                  "bias": False, "num_moe_experts": 8, "moe_router_topk": 2},
        "training": {"global_batch": 32, "micro_batch": 1, "seq_len": 2048, "flash_attention": True},
        "parallel": {"tp": 1, "pp": 4, "ep": 4, "zero": 1, "vpp": 1, **parallel},
        "schedule": "dualpipe",
    })


EP_GRAD_COLOR = _lighter(COLORS["ep"], -0.4)  # the backward's gradient exchanges: the ep colour, darker


def _moe_lanes(ax: object, result: RunResult, window: tuple[float, float] | None = None) -> None:
    """Each rank's compute stream (upper lane, tasks coloured by pass) and ep stream (lower lane: the forward's
    dispatch/combine, the backward's gradient exchanges darker), with each F&B pair framed."""
    trace = result.trace
    for stream, offset, height in (("compute", -0.38, 0.46), ("ep", 0.12, 0.26)):
        shown = [result.plan.grid.rank(0, 0, stage) for stage in range(result.plan.pp)]  # one rank a stage
        part = trace[(trace["stream"] == stream) & trace["rank"].isin(shown)]
        for row in part.itertuples(index=False):
            if stream == "ep":
                color = EP_GRAD_COLOR if "_grad_" in str(row.name) else COLORS["ep"]
            else:
                color = COLORS.get(str(row.kind), "#999999")
            ax.broken_barh([(row.start_s, row.end_s - row.start_s)], (row.stage + offset, height),  # type: ignore[attr-defined]
                           facecolors=color, edgecolor="white" if window else "none", linewidth=0.3)
    blocks = pass_blocks(result)
    for (rank, _), unit in blocks.groupby(["rank", "unit"]):
        if len(unit) > 1 and "F" in set(unit["phase"]):
            start, end = unit["start_s"].min(), unit["end_s"].max()
            ax.add_patch(Rectangle((start, rank - 0.45), end - start, 0.9, fill=False,  # type: ignore[attr-defined]
                                   edgecolor="black", linewidth=1.0))
            if window and window[0] <= start <= window[1]:
                mbs = "F" + str(int(unit[unit["phase"] == "F"]["microbatch"].iloc[0])) + " & B" + \
                    str(int(unit[unit["phase"] == "B"]["microbatch"].iloc[0]))
                ax.text(start, rank - 0.47, mbs, fontsize=6, va="bottom")  # type: ignore[attr-defined]
    ranks = result.plan.pp
    ax.set_yticks(range(ranks))  # type: ignore[attr-defined]
    ax.set_yticklabels([f"rank {i}\ncompute / ep" for i in range(ranks)], fontsize=7)  # type: ignore[attr-defined]
    ax.set_ylim(ranks - 0.5, -0.6)  # type: ignore[attr-defined]
    ax.grid(axis="x", linewidth=0.3, alpha=0.5)  # type: ignore[attr-defined]
    if window:
        ax.set_xlim(*window)  # type: ignore[attr-defined]


def write_dualpipe_moe_chart(path: Path | str, result: RunResult | None = None) -> Path:
    """One DualPipe step of ``moe_dualpipe_scenario`` (or ``result``): the whole step, then a zoom on two
    steady-state F&B pairs of rank 1, where the forward's dispatch/combine run on the ep stream while the other
    micro-batch's backward computes (and the reverse)."""
    path = chart_path(path)
    result = result if result is not None else runner.run(moe_dualpipe_scenario())
    return _pair_chart(path, result, 1,
                       f"DualPipe, MoE (8 experts, top-2, ep 4), 4 ranks, 16 micro-batches: step "
                       f"{1e3 * result.summary.step_time_s:.2f} ms (shaded: the zoom below)",
                       "two F&B pairs of rank 1 (framed): each pass's all-to-alls on the ep lane run while the "
                       "other pass computes")


def a2a_overlap_scenario(a2a_overlap: bool = True) -> Scenario:
    """The ``moe_dualpipe_scenario`` model (4 layers, 8 experts, top-2) under Megatron's interleaved schedule on
    8 H100 (pp 2, vpp 2, ep 4, dp 4, 8 micro-batches of 2048 tokens) with the DeepEP dispatcher at 60 GB/s over
    NVLink, so an exchange is about as long as the compute beside it; ``a2a_overlap``: moe.a2a_overlap."""
    doc = moe_dualpipe_scenario().model_dump(mode="json", exclude_defaults=True)
    doc.update({"name": "moe-a2a-overlap", "schedule": "interleaved",
                "moe": {"token_dispatcher": "flex", "deepep_nvlink_bandwidth": "60 GB/s",
                        "a2a_overlap": a2a_overlap}})
    doc["cluster"] = {**doc["cluster"], "nodes": 1}
    doc["training"] = {**doc["training"], "global_batch": 32}
    doc["parallel"] = {**doc["parallel"], "pp": 2, "vpp": 2, "overlap_p2p_comm": True}
    return scenario_from_dict(doc)


def write_a2a_overlap_chart(path: Path | str, result: RunResult | None = None) -> Path:
    """One step of ``a2a_overlap_scenario`` (or ``result``): the whole step with Megatron's combined 1F1B, then a
    zoom on two steady-state F&B pairs of rank 0, each pass's dispatch/combine under the other's compute."""
    path = chart_path(path)
    result = result if result is not None else runner.run(a2a_overlap_scenario())
    plain = runner.run(a2a_overlap_scenario(False)).summary
    return _pair_chart(path, result, 0,
                       f"moe.a2a_overlap (combined 1F1B), pp 2 x vpp 2, MoE (8 experts, top-2, ep 4, DeepEP), "
                       f"8 micro-batches: step {1e3 * result.summary.step_time_s:.2f} ms, exposed ep "
                       f"{1e3 * result.summary.exposed_comm_s['ep']:.2f} ms (without the overlap "
                       f"{1e3 * plain.step_time_s:.2f} / {1e3 * plain.exposed_comm_s['ep']:.2f} ms); shaded: the zoom",
                       "two F&B pairs of rank 0 (framed): the forward's dispatch/combine and the backward's "
                       "gradient exchanges on the ep lane, each under the other pass's compute")


def _pair_chart(path: Path | str, result: RunResult, rank: int, title: str, zoom_title: str) -> Path:
    """The whole step, then a zoom on two steady-state F&B pairs of ``rank``."""
    blocks = pass_blocks(result)
    pairs = blocks[(blocks["rank"] == rank)].groupby("unit").filter(lambda u: len(u) > 1 and "F" in set(u["phase"]))
    units = sorted(pairs["unit"].unique())
    middle = pairs[pairs["unit"].isin(units[len(units) // 2:len(units) // 2 + 2])]
    window = (float(middle["start_s"].min()), float(middle["end_s"].max()))
    margin = 0.05 * (window[1] - window[0])
    window = (window[0] - margin, window[1] + margin)
    fig = Figure(figsize=(15, 7.5))  # no pyplot: backend left alone
    axes = fig.subplots(2, 1, squeeze=False)
    _moe_lanes(axes[0, 0], result)
    axes[0, 0].axvspan(*window, color="#FFD54F", alpha=0.25)
    axes[0, 0].set_xlim(0, result.summary.step_time_s)
    axes[0, 0].set_title(title, fontsize=9, loc="left")
    _moe_lanes(axes[1, 0], result, window)
    axes[1, 0].set_title(zoom_title, fontsize=9, loc="left")
    axes[1, 0].set_xlabel("time (s)")
    handles = [Patch(color=COLORS["forward"], label="forward compute"),
               Patch(color=COLORS["backward"], label="backward compute"),
               Patch(color=COLORS["weight"], label="W"),
               Patch(color=COLORS["ep"], label="dispatch / combine (forward)"),
               Patch(color=EP_GRAD_COLOR, label="combine / dispatch gradients (backward)"),
               Patch(facecolor="none", edgecolor="black", label="F&B issued as one overlapped pair")]
    axes[0, 0].legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.08), ncol=6, fontsize=7,
                      frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=140)
    return Path(path)
