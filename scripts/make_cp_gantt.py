"""Gantt chart of one CP = 4 ring-attention layer, forward and backward, as the simulator runs it.

In: nothing (run from the repository root: ``python scripts/make_cp_gantt.py``). Out: docs/images/gantt-cp4-ring.png.

The scenario: Llama 3 8B, tp 8 inside a DGX H100 node and cp 4 across four nodes (so each ring send crosses
InfiniBand), 32K-token sequences (8,192 tokens per CP rank), micro-batch 1, bf16, one micro-batch, pp 1; rank 0's
layer 1 (a middle layer). Two panels, forward above and backward below, each with three lanes: the compute
stream (the attention block before the flash kernel, the cp ring steps, the block's rest and the MLP), the ``cp``
stream (Transformer Engine's KV sends, and in the backward KV + dKV), and the ``tp`` stream (sequence parallelism's
all-gathers and reduce-scatters). Each step's block is labelled with its share of the rank's score matrix; each
send with its MiB. The title gives the ring's makespan against its compute (sim.parallel.context.ring_makespan):
a send is exposed only where it outlasts the step it overlaps.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from sim import runner
from sim.parallel.context import ring_makespan, step_shares
from sim.spec.scenario import scenario_from_dict

SEQ, CP = 32768, 4
SCENARIO = {
    "name": "cp4-ring-layer",
    "cluster": {"gpu": "H100-SXM", "nodes": 4, "gpus_per_node": 8},
    "model": "llama3-8b",
    "training": {"global_batch": 1, "micro_batch": 1, "seq_len": SEQ, "flash_attention": True, "dtype": "bf16"},
    "parallel": {"tp": 8, "cp": CP, "cp_comm_type": "p2p", "sequence_parallel": True},
    "schedule": "1f1b", "costs": "roofline", "network": "analytic",
}
COLORS = {"attention": "#4C72B0", "attention_out": "#4C72B0", "attention_core": "#8172B2", "mlp": "#55A868",
          "cp": "#C44E52", "tp": "#CCB974"}
LANES = ("compute", "cp", "tp")


def layer_rows(trace: pd.DataFrame, layer: int = 1) -> pd.DataFrame:
    rows = trace[(trace["rank"] == 0) & (trace["layer"] == layer)].sort_values("task")
    return rows


def draw(trace: pd.DataFrame, out: Path) -> None:
    rows = layer_rows(trace)
    shares = step_shares(SEQ, CP)
    fig = Figure(figsize=(12, 5.2))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 1)
    for ax, kind in zip(axes, ("forward", "backward"), strict=True):
        ids = rows[rows["kind"] == kind]["task"]  # a pass's tasks are emitted together: its TP and CP ones too
        before = rows[(rows["task"] == ids.min() - 1) & (rows["stream"] == "tp")]  # SP's all-gather before it
        passes = rows[(rows["task"] >= ids.min() - len(before)) & (rows["task"] <= ids.max() + 1)]
        passes = passes[(passes["task"] <= ids.max()) | (passes["stream"] != "compute")]
        moves = passes[passes["stream"] == "cp"]
        t0 = passes["start_s"].min()
        cores = passes[passes["name"] == "attention_core"]
        blocks = list(cores["end_s"] - cores["start_s"])
        durations = list(moves["end_s"] - moves["start_s"])
        ring = ring_makespan(blocks, durations, backward=kind == "backward")
        for _, row in passes.iterrows():
            lane = LANES.index(row["stream"]) if row["stream"] in LANES else None
            if lane is None:
                continue
            start, width = (row["start_s"] - t0) * 1e3, (row["end_s"] - row["start_s"]) * 1e3
            color = COLORS["cp"] if row["stream"] == "cp" else COLORS["tp"] if row["stream"] == "tp" \
                else COLORS.get(row["name"], "#999999")
            ax.barh(lane, width, left=start, height=0.6, color=color, edgecolor="black", linewidth=0.5)
            if row["name"] == "attention_core":
                k = list(cores["task"]).index(row["task"])
                ax.text(start + width / 2, lane, f"step {k}\n{shares[k]:.3f}", ha="center", va="center", fontsize=7,
                        color="white")
            elif row["stream"] == "cp":
                ax.text(start + width / 2, lane, f"{row['bytes'] / 2**20:.0f} MiB", ha="center", va="center",
                        fontsize=7, color="white")
        ax.set_yticks(range(len(LANES)), list(LANES))
        ax.invert_yaxis()
        ax.set_xlabel("ms from the pass's first task")
        ax.set_title(f"{kind}: ring {ring * 1e3:.3f} ms for {sum(blocks) * 1e3:.3f} ms of attention compute "
                     f"(exposed {max(0.0, ring - sum(blocks)) * 1e3:.3f} ms)", fontsize=10)
    fig.suptitle("One layer of Llama 3 8B with context parallelism 4 (ring attention, TE p2p), 32K tokens, "
                 "tp 8 per node, rank 0", fontsize=11)
    fig.legend(handles=[Patch(color=COLORS["attention"], label="attention before/after the core (norm, QKV, out)"),
                        Patch(color=COLORS["attention_core"], label="ring step: flash + output correction"),
                        Patch(color=COLORS["mlp"], label="MLP"),
                        Patch(color=COLORS["cp"], label="CP send (KV; backward KV + dKV)"),
                        Patch(color=COLORS["tp"], label="TP all-gather / reduce-scatter (SP)")],
               loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    fig.savefig(out, dpi=130)


def make(root: Path = Path(".")) -> Path:
    result = runner.run(scenario_from_dict(SCENARIO))
    out = root / "docs" / "images" / "gantt-cp4-ring.png"
    draw(result.trace, out)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    make()
