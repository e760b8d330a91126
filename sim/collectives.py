"""Collective algorithms in closed form.

In: a collective (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``, ``send``), the total
buffer size S in bytes (nccl-tests convention: for all-gather / reduce-scatter, the gathered size), the group
size n, a per-step latency alpha and a per-GPU bandwidth B. Out: time in seconds, and the nccl-tests algbw /
busbw of a measured or predicted time.

Ring algorithms (Patarasuk & Yuan 2009; Thakur et al. 2005), as NCCL runs them:
  all-reduce                 2(n-1) alpha + 2(n-1)/n * S/B
  all-gather, reduce-scatter  (n-1) alpha +  (n-1)/n * S/B
  broadcast (pipelined ring)  (n-1) alpha +          S/B
  send/recv                         alpha +          S/B
A group of one costs nothing.
"""

from __future__ import annotations

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")

# nccl-tests doc/PERFORMANCE.md: busbw = algbw * factor(n).
_BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send": lambda n: 1.0,
}


def ring_time(op: str, nbytes: float, n: int, latency: float, bandwidth: float) -> float:
    if op not in _BUS_FACTOR:
        raise ValueError(f"unknown collective {op!r}")
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (n - 1) * latency + 2 * (n - 1) / n * nbytes / bandwidth
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) * latency + (n - 1) / n * nbytes / bandwidth
    if op == "broadcast":
        return (n - 1) * latency + nbytes / bandwidth
    return p2p_time(nbytes, latency, bandwidth)


def p2p_time(nbytes: float, latency: float, bandwidth: float) -> float:
    return latency + nbytes / bandwidth


def algbw(nbytes: float, seconds: float) -> float:
    return nbytes / seconds


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw, i.e. the bytes each rank moves per byte of the collective's size."""
    return _BUS_FACTOR[op](n)


def busbw(op: str, nbytes: float, seconds: float, n: int) -> float:
    return algbw(nbytes, seconds) * bus_factor(op, n)
