"""Flow-level link sharing: max-min fair rates, recomputed whenever a flow starts or ends.

In: link capacities (bytes/s), then over time ``add(key, loads, nbytes, rate_cap, now)`` and ``remove(key, now)``.
A flow here is one channel of a collective: all of its hops progress at one rate r, and a link crossed by c
of its hops carries c*r. Out: after each change, the new finish times of the flows whose rates changed (the
engine sets its timers from them); ``usage()``: per link, bytes carried, busy and saturated seconds and the
peak load; ``segments``: per link, the piecewise-constant load over time (for the trace and for checking
that no link ever runs over capacity).

Rates are max-min fair (Bertsekas & Gallager, Data Networks, Sec. 6.5.2) by progressive filling: raise all
unfrozen flows' rates together until a link saturates or a flow reaches its cap (its uncontended rate), freeze
those flows, repeat. Only the connected component (flows linked through shared links) of the flow that came
or went can change, so only that component is recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_EPS = 1e-12


@dataclass
class _Flow:
    loads: tuple[tuple[int, int], ...]
    remaining: float
    rate_cap: float
    rate: float = 0.0
    since: float = 0.0


@dataclass
class LinkUsage:
    bytes: float = 0.0
    busy_s: float = 0.0
    saturated_s: float = 0.0
    peak_load: float = 0.0
    load: float = 0.0
    since: float = 0.0


@dataclass
class FlowNetwork:
    capacities: list[float]
    record_segments: bool = False
    flows: dict[int, _Flow] = field(default_factory=dict)
    users: dict[int, dict[int, int]] = field(default_factory=dict)  # link -> {flow key: hops on it}
    links: dict[int, LinkUsage] = field(default_factory=dict)
    segments: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # link -> [(time, load)]

    def add(self, key: int, loads: tuple[tuple[int, int], ...], nbytes: float, rate_cap: float,
            now: float) -> dict[int, float]:
        self.flows[key] = _Flow(loads, nbytes, rate_cap, 0.0, now)
        for link, count in loads:
            self.users.setdefault(link, {})[key] = count
        return self._rebalance(self._component([key]), now)

    def remove(self, key: int, now: float) -> dict[int, float]:
        flow = self.flows.pop(key)
        neighbours: list[int] = []
        for link, _ in flow.loads:
            users = self.users[link]
            del users[key]
            neighbours.extend(users)
        self._account([link for link, _ in flow.loads], now)
        return self._rebalance(self._component(neighbours), now) if neighbours else {}

    def close(self, now: float) -> None:
        """End every link's last load segment at ``now`` (the end of the run)."""
        self._account(sorted(self.links), now)

    def _component(self, seeds: list[int]) -> list[int]:
        seen, stack, order = set(seeds), list(seeds), []
        while stack:
            key = stack.pop()
            order.append(key)
            for link, _ in self.flows[key].loads:
                for other in self.users[link]:
                    if other not in seen:
                        seen.add(other)
                        stack.append(other)
        return sorted(order)

    def _rebalance(self, keys: list[int], now: float) -> dict[int, float]:
        for key in keys:  # bank the progress made at the old rates
            flow = self.flows[key]
            flow.remaining = max(0.0, flow.remaining - flow.rate * (now - flow.since))
            flow.since = now
        rates = max_min_rates({key: self.flows[key].loads for key in keys},
                              {key: self.flows[key].rate_cap for key in keys}, self.capacities)
        touched: set[int] = set()
        finish: dict[int, float] = {}
        for key in keys:
            flow = self.flows[key]
            flow.rate = rates[key]
            touched.update(link for link, _ in flow.loads)
            finish[key] = now + flow.remaining / flow.rate if flow.rate > 0 else float("inf")
        self._account(sorted(touched), now)
        return finish

    def _account(self, links: list[int], now: float) -> None:
        """Close each link's current load segment at ``now`` and start one at its new load."""
        for link in links:
            usage = self.links.setdefault(link, LinkUsage(since=now))
            elapsed = now - usage.since
            if usage.load > 0 and elapsed > 0:
                usage.bytes += usage.load * elapsed
                usage.busy_s += elapsed
                if usage.load >= self.capacities[link] * (1 - 1e-9):
                    usage.saturated_s += elapsed
            load = sum(self.flows[key].rate * count for key, count in self.users.get(link, {}).items())
            usage.load, usage.since = load, now
            usage.peak_load = max(usage.peak_load, load)
            if self.record_segments:
                self.segments.setdefault(link, []).append((now, load))


def max_min_rates(loads: dict[int, tuple[tuple[int, int], ...]], caps: dict[int, float],
                  capacities: list[float]) -> dict[int, float]:
    """Max-min fair rate per flow; a flow crossing a link c times uses c times its rate there."""
    rates = {key: 0.0 for key in loads}
    active = set(loads)
    residual: dict[int, float] = {}
    for key in loads:
        for link, _ in loads[key]:
            residual[link] = capacities[link]
    while active:
        weight: dict[int, float] = {}
        for key in active:
            for link, count in loads[key]:
                weight[link] = weight.get(link, 0.0) + count
        step = min(min(residual[link] / w for link, w in weight.items()),
                   min(caps[key] - rates[key] for key in active))
        step = max(step, 0.0)
        for key in active:
            rates[key] += step
        for link, w in weight.items():
            residual[link] -= step * w
        saturated = {link for link, w in weight.items() if residual[link] <= _EPS * max(1.0, capacities[link])}
        frozen = {key for key in active
                  if caps[key] - rates[key] <= _EPS * max(1.0, caps[key])
                  or any(link in saturated for link, _ in loads[key])}
        if not frozen:  # numerical safety: should not happen, one constraint is always tight after a step
            break
        active -= frozen
    return rates
