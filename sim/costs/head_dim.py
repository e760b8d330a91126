"""The attention kernel's rate at a head dim other than the one its profile curve was measured at.

In: the GPU preset, the attention backend (``fused``: cuDNN, ``flash``: FlashAttention-2), the pass (forward /
backward), the kernel's q/k head dim and its executed forward FLOPs. Out: the factor on the profile curve's rate
(``AttentionCurves.rate``, head dim 128): the head dim's measured rate over d 128's.

Source: ``sim/data/reference/gpu_attention_head_dims.csv`` (scripts/measure_gpu_kernels.py --head-dims 64,128,192
on an H100 80GB HBM3, 2026-11-26; docs/mechanisms/attention_kernels.md, "Head dims other than 128"): causal SDPA,
32 heads, batch 1, seq 2048-16384, each backend at d 64, 128 and 192, forward and forward + backward event-timed.
The backward alone is fwd_bwd - fwd, its rate 2x the forward's FLOPs over that time (the profile's backward
convention, ``AttentionCurves``); at one seq_len both head dims' FLOPs count the same way, so the ratio is the
kernels' own.

The rule:
- At a measured head dim the factor is the CSV's ratio at the same backend, pass and seq_len, interpolated in
  log2 of the kernel's executed forward FLOPs over that head dim's rows (the profile's own reading: a kernel of F FLOPs
  runs at the rate measured at F, ``interpolate_log2``; at 32 heads and batch 1 that F is a seq_len), clamped at
  the ends (2048 and 16384).
- Between measured head dims, linear in d; outside [64, 192] the nearest end's ratio (d 256 gets d 192's). Linear
  rather than nearest: a d of 96 or 160 is no nearer either neighbour in what the kernel does (FlashAttention-2
  and cuDNN pad d to their next tile size), and nearest would tie at 96 and 160; d 128 is 1 exactly either way.
- Only for the GPUs the rows were measured on: H100 SXM, and H800 SXM, its same GH100 chip, clocks and HBM3
  (sim.hardware.gpus). H200 (more HBM bandwidth), B200 and A100 keep 1: no rows for them.
- DeepSeek-V3's MLA: q/k head 192 (128 + 64 rope), v head 128; the rows timed q, k and v all at 192 and the factor
  is read at the q/k head dim, so its v's share of the kernel is priced as if it were 192 wide (an approximation).
"""

from __future__ import annotations

import csv
from functools import cache
from importlib import resources

from sim.hardware.links import interpolate_log2
from sim.model.flash_tiles import causal_fraction

CSV = "data/reference/gpu_attention_head_dims.csv"
# The GPU presets the CSV's H100 80GB HBM3 stands for (module docstring).
MEASURED_GPUS = frozenset({"H100-SXM", "H800-SXM"})
# The profile's backends (sim.costs.profile.Profile.attention) as the CSV's backend column names them.
BACKENDS = {"fused": "cudnn_attention", "flash": "flash_attention"}
REFERENCE_HEAD_DIM = 128  # the head dim the shipped curves were measured at (AttentionCurves.head_dim)

Knots = tuple[tuple[float, float], ...]


@cache
def ratio_knots() -> dict[tuple[str, str, int], Knots]:
    """Per (profile backend, pass, head dim): knots (that head dim's forward FLOPs, its rate / d 128's rate at
    the same seq_len), from the CSV's median times."""
    with resources.files("sim").joinpath(CSV).open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    # (backend, d, seq, kind) -> (forward FLOPs as the op counts them, median seconds): the rows' batch 1 and
    # heads at 4 b h s^2 d x causal_fraction, the curves' axis (sim.calibrate.compute.attention_flops; the CSV's
    # flops column is 2 b h s^2 d); the ratio at one seq_len does not depend on the count.
    times: dict[tuple[str, int, int, str], tuple[float, float]] = {}
    for row in rows:
        seq, d = int(row["seq_len"]), int(row["head_dim"])
        executed = 4.0 * int(row["heads"]) * seq * seq * d * causal_fraction(seq)
        times[(row["backend"], d, seq, row["kind"])] = (executed, float(row["median_s"]))

    def rate(backend: str, d: int, seq: int, phase: str) -> tuple[float, float]:
        """(forward FLOPs, achieved rate): the forward's, or the backward's (fwd_bwd - fwd, 2x forward FLOPs)."""
        flops, forward = times[(backend, d, seq, "attention_fwd")]
        if phase == "forward":
            return flops, flops / forward
        return flops, 2 * flops / (times[(backend, d, seq, "attention_fwd_bwd")][1] - forward)

    out: dict[tuple[str, str, int], Knots] = {}
    dims = sorted({d for (_, d, _, _) in times})
    for ours, theirs in BACKENDS.items():
        seqs = sorted({s for (b, _, s, _) in times if b == theirs})
        for phase in ("forward", "backward"):
            for d in dims:
                out[(ours, phase, d)] = tuple(
                    (rate(theirs, d, s, phase)[0],
                     rate(theirs, d, s, phase)[1] / rate(theirs, REFERENCE_HEAD_DIM, s, phase)[1]) for s in seqs)
    return out


def head_dim_scale(gpu_name: str, backend: str, phase: str, head_dim: int, forward_flops: float) -> float:
    """The factor on the d-128 curve's ``phase`` rate (``forward`` / ``backward``) for a ``backend`` attention
    kernel of q/k head dim ``head_dim`` running ``forward_flops`` executed forward FLOPs on preset ``gpu_name``:
    1 off the measured GPUs, for a backend without rows, at d 128, and for a head dim of 0 (not known)."""
    if gpu_name not in MEASURED_GPUS or backend not in BACKENDS or head_dim <= 0 or head_dim == REFERENCE_HEAD_DIM:
        return 1.0
    knots = ratio_knots()
    dims = sorted({d for (b, p, d) in knots if b == backend and p == phase})

    def at(d: int) -> float:
        return interpolate_log2(knots[(backend, phase, d)], forward_flops)

    if head_dim <= dims[0]:
        return at(dims[0])
    if head_dim >= dims[-1]:
        return at(dims[-1])
    upper = next(d for d in dims if d >= head_dim)
    lower = max(d for d in dims if d < head_dim)
    weight = (head_dim - lower) / (upper - lower)
    return (1 - weight) * at(lower) + weight * at(upper)
