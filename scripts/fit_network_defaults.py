"""Fit the shipped link presets' latency, plateau efficiency and efficiency curves to published measurements.

In: ``sim/data/reference/xla_collective_perf_tables.csv`` (OpenXLA's measured NCCL collective times, Apache-2.0,
ROCm/xla@dc66032) and ``sim/data/reference/nccl_tests_measurements.csv`` (nccl-tests results from NVIDIA's issue
tracker), copied from the project's reference set. Out: ``sim/data/network_fit.json``, read by
``sim.hardware.nodes`` for the node presets. Run: ``python scripts/fit_network_defaults.py`` (``--check``: exit 1 if
the shipped file differs from a fresh fit, without writing).

What is fitted from what (sim.calibrate.fitting does the fitting):
- dgx-h100 NVLink ring: XLA sm_90 (H100 8-GPU node), all-reduce / all-gather / reduce-scatter, group of 8.
- dgx-h100 NVLS: nccl-tests #290 single-node all-reduce rows run with NVLS (its default on H100); those rows
  start at 128 MiB, so the latency is the ring's (base + two steps of alpha) rather than a fit.
- dgx-h100 InfiniBand: curve shape from nccl-tests #290's 2-node default all-reduce rows (relative to their own
  plateau); plateau 47/50 from the maintainer's "46-48 GB/s per NDR NIC" (the user's rows run below it);
  alpha from NCCL's tuning model (6.6 us, src/graph/tuning.cc NET/Ring/Simple), base latency the NVLink fit's.
- Groups of 2 and 4 GPUs in a node: a bandwidth factor each (sim.calibrate.fitting.fit_scale over their >= 16 MiB rows,
  against the group-of-8 curve), since NCCL runs fewer channels for small groups.
- dgx-b200 NVLink ring: XLA sm_100_B200, group of 8. gb200-nvl72 NVLink ring: XLA sm_100_GB200, groups of
  8..64 inside the 72-GPU domain.
- All-to-all over NVLink (NCCL's grouped send/recv to every peer, a tier of its own: ``all_to_all``): XLA
  sm_90 / sm_100_B200 all-to-all, group of 8, with the same tier's ring latency (one group size cannot separate
  base from alpha: every row has 7 steps), and sm_100_GB200 groups of 8..64 with a latency of their own; the
  closed form (n-1) alpha + (n-1)/n S / B; groups of 2 and 4 a factor each, as for the ring.
  hgx-h800 takes dgx-h100's fits at its own line rates (sim.hardware.nodes).
- dgx-a100: no size sweep in the reference data; the H100 curves' shapes with the A100 plateaus measured by
  nccl-tests users (#175: 232.5 of 300 GB/s NVLink; #119: 96 of 100 GB/s over 4 HDR NICs).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from sim.calibrate import reference
from sim.calibrate.fitting import LinkFit, Measurement, fit_link, fit_scale
from sim.hardware.links import LinkSpec
from sim.network.collectives import ring_latency, ring_time
from sim.units import GB

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "sim" / "data" / "network_fit.json"
IB_STEP_LATENCY = 6.6e-6


def xla_rows(platform: str, group_sizes: tuple[int, ...],
             opcodes: dict[str, str] = reference.COLLECTIVE_OPS) -> list[Measurement]:
    table = reference.xla_collectives(opcodes)
    rows = table[(table["platform"] == platform) & table["n"].isin(group_sizes)]
    return [Measurement(r.op, r.n, r.bytes, r.seconds) for r in rows.itertuples()]


def nccl_rows(setting: str, num_nodes: int) -> list[Measurement]:
    table = reference.nccl_tests()
    rows = table[(table["setting"] == setting) & (table["nodes"] == num_nodes)]
    return [Measurement(r.op, r.n, r.bytes, r.seconds) for r in rows.itertuples()]


def group_factors(platform: str, fit: LinkFit, line_rate: float, sizes: tuple[int, ...],
                  opcodes: dict[str, str] = reference.COLLECTIVE_OPS) -> list[list[float]]:
    """Bandwidth factor per smaller group size, over its messages of 16 MiB and more (where bandwidth rules)."""
    link = LinkSpec(bandwidth=line_rate, **fit.as_link_fields())  # type: ignore[arg-type]
    knots = []
    for n in sizes:
        rows = [r for r in xla_rows(platform, (n,), opcodes) if r.nbytes >= 2**24]

        def seconds(row: Measurement, factor: float) -> float:
            return link.base_latency + ring_time(row.op, row.nbytes, row.n, link.latency,
                                                 link.bandwidth_at(row.nbytes) * factor)

        knots.append([n, fit_scale(rows, seconds)])
    return knots + [[8, 1.0]]


def _close(a: object, b: object) -> bool:
    """Whether two JSON values are equal, floats to a relative 1e-12."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the shipped file instead of writing")
    args = parser.parse_args()
    h100_ring = fit_link(xla_rows("sm_90", (8,)), 450 * GB)
    h100_nvls = fit_link(nccl_rows("default (NVLS)", 1), 450 * GB, algorithm="nvls",
                         latency=(h100_ring.base_latency, h100_ring.latency))
    # 2-node rows: 16 ranks in 8 rings side by side, one per rail, so a node's 8 NICs (8 x 50 GB/s) carry
    # what one rank's ring moves (sim.network.topology.Topology.tier).
    def two_node_ring(row: Measurement) -> float:
        return h100_ring.base_latency + ring_latency(row.op, row.n, 2, h100_ring.latency, IB_STEP_LATENCY)

    ib_shape = fit_link(nccl_rows("default", 2), 8 * 50 * GB, latency=(h100_ring.base_latency, IB_STEP_LATENCY),
                        latency_of=two_node_ring)
    b200_ring = fit_link(xla_rows("sm_100_B200", (8,)), 900 * GB)
    gb200_ring = fit_link(xla_rows("sm_100_GB200", (8, 16, 32, 64)), 900 * GB)
    a2a = reference.ALL_TO_ALL_OPS

    def ring_latency_of(fit: LinkFit) -> tuple[float, float]:
        return fit.base_latency, fit.latency

    h100_a2a = fit_link(xla_rows("sm_90", (8,), a2a), 450 * GB, latency=ring_latency_of(h100_ring))
    b200_a2a = fit_link(xla_rows("sm_100_B200", (8,), a2a), 900 * GB, latency=ring_latency_of(b200_ring))
    # GB200's groups of 8..64 separate the base from the per-peer alpha (12 us at 8-18 GPUs, 55-65 us at 64-72):
    # a latency of its own. One group size cannot (every row has n-1 = 7 steps), hence the ring's for H100, B200.
    gb200_a2a = fit_link(xla_rows("sm_100_GB200", (8, 16, 32, 64), a2a), 900 * GB)

    def ib(plateau: float) -> dict[str, object]:
        return {"base_latency": ib_shape.base_latency, "latency": IB_STEP_LATENCY, "efficiency": plateau,
                "efficiency_curve": [list(knot) for knot in ib_shape.curve]}

    h100_groups = group_factors("sm_90", h100_ring, 450 * GB, (2, 4))
    b200_groups = group_factors("sm_100_B200", b200_ring, 900 * GB, (2, 4))
    h100_a2a_groups = group_factors("sm_90", h100_a2a, 450 * GB, (2, 4), a2a)
    b200_a2a_groups = group_factors("sm_100_B200", b200_a2a, 900 * GB, (2, 4), a2a)
    fits = {
        "dgx-h100": {"intra_node": {**h100_ring.as_link_fields(), "group_efficiency": h100_groups},
                     "nvls": h100_nvls.as_link_fields(),
                     "inter_node": ib(47 / 50),
                     "all_to_all": {**h100_a2a.as_link_fields(), "group_efficiency": h100_a2a_groups}},
        "dgx-b200": {"intra_node": {**b200_ring.as_link_fields(), "group_efficiency": b200_groups},
                     "inter_node": ib(47 / 50),
                     "all_to_all": {**b200_a2a.as_link_fields(), "group_efficiency": b200_a2a_groups}},
        "gb200-nvl72": {"intra_node": gb200_ring.as_link_fields(), "inter_node": ib(47 / 50),
                        "all_to_all": gb200_a2a.as_link_fields()},
        "dgx-a100": {"intra_node": {**h100_ring.as_link_fields(), "efficiency": round(232.54 / 300, 6),
                                    "group_efficiency": h100_groups},
                     "inter_node": ib(96 / 100)},
    }
    meta = {"_generated_by": "scripts/fit_network_defaults.py",
            "_rows": {"h100_ring": h100_ring.rows, "h100_nvls": h100_nvls.rows, "ib_shape": ib_shape.rows,
                      "b200_ring": b200_ring.rows, "gb200_ring": gb200_ring.rows, "h100_all_to_all": h100_a2a.rows,
                      "b200_all_to_all": b200_a2a.rows, "gb200_all_to_all": gb200_a2a.rows}}
    text = json.dumps({**meta, **fits}, indent=1) + "\n"
    if args.check:  # equal to 1e-12 relative: the last bit of a float moves with numpy's build
        same = _close(json.loads(OUT.read_text()), json.loads(text))
        print(f"{OUT.relative_to(ROOT)} {'matches' if same else 'differs from'} a fresh fit")
        return 0 if same else 1
    OUT.write_text(text)
    for name, fit in fits.items():
        for tier, fields in fit.items():
            print(f"{name:12s} {tier:10s} base {fields['base_latency'] * 1e6:5.2f} us"
                  f"  alpha {fields['latency'] * 1e6:5.2f} us"
                  f"  plateau {fields['efficiency']:.3f}")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
