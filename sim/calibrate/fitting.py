"""Fit a link tier's alpha-beta parameters and efficiency curve to measured collective times.

In: measured rows (collective, group size n, message bytes S in the nccl-tests convention, seconds), the
algorithm that ran them, and the tier's line rate B. Out: ``LinkFit``: the per-step latency alpha, the plateau
efficiency and the efficiency curve (knots of message bytes -> fraction of the plateau) that
``sim.hardware.links.LinkSpec`` takes.

Model (the closed forms of sim.network.collectives, plus a per-collective base latency as in NCCL's tuning model,
src/graph/tuning.cc baseLat + nsteps * hwLat):
    t = base + steps(op, n) * alpha + bytes_moved(op, n, S) / (B * e(S)),
with e(S) = plateau * curve(S), piecewise linear in log2(S).

Method, in three steps, each exact on noise-free data:
1. base and alpha: non-negative least squares of t = base + steps * alpha over the small messages
   (S <= ``latency_max_bytes``), where the bandwidth term is negligible.
2. Knot k (every factor 2 in size): the efficiency that minimizes the sum of |log t_model - log t| over the rows
   within a factor sqrt(2) of it (an L1 fit: robust to the noisy small-message timings).
3. The knots are made non-decreasing in size by pool-adjacent-violators (NCCL moves large messages at least as
   efficiently as small ones: more channels, the Simple protocol); the plateau is the largest knot.
Used by ``scripts/fit_network_defaults.py`` (shipped presets) and by calibration profiles.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from sim.network.collectives import bytes_moved, latency_steps


@dataclass(frozen=True)
class Measurement:
    op: str
    n: int
    nbytes: float
    seconds: float


@dataclass(frozen=True)
class LinkFit:
    base_latency: float
    latency: float
    efficiency: float
    curve: tuple[tuple[float, float], ...]
    rows: int

    def as_link_fields(self) -> dict[str, object]:
        return {"base_latency": self.base_latency, "latency": self.latency, "efficiency": self.efficiency,
                "efficiency_curve": [list(knot) for knot in self.curve]}


DEFAULT_KNOTS = tuple(float(2 ** e) for e in range(16, 33))  # 64 KiB .. 4 GiB, every factor 2


def pool_adjacent_violators(values: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
    """Least-squares non-decreasing fit (isotonic regression) of ``values``."""
    blocks: list[tuple[float, float, int]] = []  # (mean, weight, count)
    for value, weight in zip(values, weights or [1.0] * len(values), strict=True):
        blocks.append((float(value), float(weight), 1))
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean2, w2, c2 = blocks.pop()
            mean1, w1, c1 = blocks.pop()
            blocks.append(((mean1 * w1 + mean2 * w2) / (w1 + w2), w1 + w2, c1 + c2))
    return [mean for mean, _, count in blocks for _ in range(count)]


def _per_knot(xs: np.ndarray, knots: Sequence[float],
              estimate: Callable[[np.ndarray], float]) -> tuple[list[float], list[float], list[float]]:
    """(knots kept, value, rows used) for each knot with rows within a factor sqrt(2) of it; ``estimate`` gets the
    boolean mask of those rows."""
    kept, values, weights = [], [], []
    for knot in knots:
        near = np.abs(np.log2(xs) - np.log2(knot)) <= 0.5
        if near.any():
            kept.append(float(knot))
            values.append(estimate(near))
            weights.append(float(near.sum()))
    if not values:
        raise ValueError("fitting: no measurement near any knot")
    return kept, values, weights


def fit_latency(steps: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """Non-negative least squares of seconds = base + steps * alpha -> (base, alpha)."""
    design = np.column_stack([np.ones_like(steps), steps])
    (base, alpha), *_ = np.linalg.lstsq(design, seconds, rcond=None)
    if base < 0:
        return 0.0, float(np.dot(steps, seconds) / np.dot(steps, steps))
    if alpha < 0:
        return float(np.mean(seconds)), 0.0
    return float(base), float(alpha)


def _best_efficiency(latency: np.ndarray, moved: np.ndarray, seconds: np.ndarray, line_rate: float) -> float:
    """argmin_e sum |log(latency + moved / (line_rate * e)) - log(seconds)|: a coarse grid, then a fine one."""
    def cost(grid: np.ndarray) -> np.ndarray:
        model = latency[None, :] + moved[None, :] / (line_rate * grid[:, None])
        return np.abs(np.log(model) - np.log(seconds)[None, :]).sum(axis=1)

    grid = np.logspace(-4, 0, 401)
    best = grid[int(np.argmin(cost(grid)))]
    fine = np.linspace(best / 1.03, min(best * 1.03, 1.0), 601)
    return float(fine[int(np.argmin(cost(fine)))])


def fit_link(rows: Iterable[Measurement], line_rate: float, algorithm: str = "ring",
             knots: Sequence[float] = DEFAULT_KNOTS, latency_max_bytes: float = 64 * 1024,
             latency: tuple[float, float] | None = None,
             latency_of: Callable[[Measurement], float] | None = None) -> LinkFit:
    """Fit (base, alpha) unless ``latency`` gives them, then the plateau and curve; see the module docstring.
    ``latency_of`` replaces base + steps * alpha per row (multi-node rings, whose steps differ in alpha)."""
    rows = list(rows)
    if not rows:
        raise ValueError("fit_link: no measurements to fit")
    steps = np.array([latency_steps(algorithm, r.op, r.n) for r in rows], dtype=float)
    seconds = np.array([r.seconds for r in rows])
    sizes = np.array([r.nbytes for r in rows])
    if latency is None:
        small = sizes <= latency_max_bytes
        if not small.any():
            raise ValueError(f"fit_link: no message <= {latency_max_bytes:.0f} B to fit the latency from")
        latency = fit_latency(steps[small], seconds[small])
    base, alpha = latency
    fixed = np.array([latency_of(r) for r in rows]) if latency_of else base + steps * alpha
    moved = np.array([bytes_moved(algorithm, r.op, r.n, r.nbytes) for r in rows])
    kept, values, weights = _per_knot(sizes, knots, lambda near: _best_efficiency(
        fixed[near], moved[near], seconds[near], line_rate))
    monotone = pool_adjacent_violators(values, weights)
    plateau = min(monotone[-1], 1.0)
    curve = tuple((knot, round(min(value / plateau, 1.0), 6)) for knot, value in zip(kept, monotone, strict=True))
    return LinkFit(base_latency=base, latency=alpha, efficiency=round(plateau, 6), curve=curve, rows=len(rows))


def fit_log_curve(x: Sequence[float], y: Sequence[float], knots: Sequence[float],
                  increasing: bool = True) -> tuple[tuple[float, float], ...]:
    """Knots (x_k, y_k) of a curve piecewise linear in log2(x): y_k = median of y over the rows within a factor
    sqrt(2) of x_k (knots with no row are dropped), made non-decreasing by pool-adjacent-violators when
    ``increasing`` (a larger GEMM is never slower per FLOP on the same GPU)."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    kept, values, weights = _per_knot(xs, knots, lambda near: float(np.median(ys[near])))
    fitted = pool_adjacent_violators(values, weights) if increasing else values
    return tuple((knot, float(value)) for knot, value in zip(kept, fitted, strict=True))


def fit_scale(rows: Sequence[Measurement], model_seconds: Callable[[Measurement, float], float],
              grid: Sequence[float] = tuple(np.round(np.arange(0.30, 1.505, 0.005), 3))) -> float:
    """The factor f (from ``grid``) minimizing the median |log(model_seconds(row, f) / row.seconds)|: e.g. the
    bandwidth factor of a group size the tier's curve was not fitted on."""
    if not rows:
        raise ValueError("fit_scale: no measurements to fit")
    seconds = np.array([r.seconds for r in rows])

    def cost(factor: float) -> float:
        model = np.array([model_seconds(r, factor) for r in rows])
        return float(np.median(np.abs(np.log(model / seconds))))

    return float(min(grid, key=cost))
