"""Which links were busy: per-link tables from a flow-level (``contention``) run.

In: the ``Topology`` and the engine's ``FlowNetwork`` after the run (and the step time). Out: pandas DataFrames:
``usage_frame`` (one row per link that carried traffic: its ends, tier, capacity, bytes, busy and saturated
seconds, mean utilization over the step, peak load over capacity), ``segments_frame`` (per link, the
piecewise-constant load between rate changes: the link lanes of a trace), and ``busiest`` (the summary's top
links by utilization), and `critical` (the link saturated longest).
"""

from __future__ import annotations

from itertools import pairwise

import pandas as pd

from sim.network.flows import FlowNetwork
from sim.network.topology import Topology
from sim.output.summary import BusyLink, SaturatedLink

USAGE_COLUMNS = ["link", "src", "dst", "tier", "capacity_Bps", "bytes", "busy_s", "saturated_s", "utilization",
                 "peak_load_fraction"]


def usage_frame(topology: Topology, flows: FlowNetwork, step_time: float) -> pd.DataFrame:
    rows = []
    for index, usage in sorted(flows.links.items()):
        if usage.bytes <= 0:
            continue
        link = topology.links[index]
        rows.append({"link": index, "src": link.src, "dst": link.dst, "tier": link.tier,
                     "capacity_Bps": link.capacity, "bytes": usage.bytes, "busy_s": usage.busy_s,
                     "saturated_s": usage.saturated_s,
                     "utilization": usage.bytes / (link.capacity * step_time) if step_time > 0 else 0.0,
                     "peak_load_fraction": usage.peak_load / link.capacity})
    return pd.DataFrame(rows, columns=USAGE_COLUMNS)


def segments_frame(topology: Topology, flows: FlowNetwork) -> pd.DataFrame:
    rows = []
    for index, points in sorted(flows.segments.items()):
        link = topology.links[index]
        for (start, load), (end, _) in pairwise(points):
            if end > start and load > 0:
                rows.append({"link": index, "src": link.src, "dst": link.dst, "tier": link.tier, "start_s": start,
                             "end_s": end, "load_fraction": load / link.capacity})
    return pd.DataFrame(rows, columns=["link", "src", "dst", "tier", "start_s", "end_s", "load_fraction"])


def busiest(usage: pd.DataFrame, top: int = 5) -> list[BusyLink]:
    best = usage.sort_values(["utilization", "link"], ascending=[False, True]).head(top)
    return [BusyLink(link=f"{row.src}->{row.dst}", tier=row.tier, utilization=round(float(row.utilization), 4),
                     saturated_s=float(row.saturated_s)) for row in best.itertuples()]


def critical(usage: pd.DataFrame) -> SaturatedLink | None:
    """The link that throttled transfers longest (most seconds at capacity), or None if none ever saturated."""
    saturated = usage[usage["saturated_s"] > 0]
    if saturated.empty:
        return None
    row = saturated.sort_values(["saturated_s", "link"], ascending=[False, True]).iloc[0]
    return SaturatedLink(link=f"{row.src}->{row.dst}", tier=row.tier, saturated_s=float(row.saturated_s))
