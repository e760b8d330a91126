"""Flow-level link sharing: max-min fair rates, recomputed whenever a flow starts or ends.

In: link capacities (bytes/s), then over time ``add(key, loads, nbytes, rate_cap, now)`` and ``remove(key, now)``.
A flow here is one channel of a collective: all of its hops progress at one rate r, and a link crossed by c
of its hops carries c*r. Out: after each change, the new finish times of the flows whose rates changed (the
engine sets its timers from them); ``usage()``: per link, bytes carried, busy and saturated seconds and the
peak load; ``segments``: per link, the piecewise-constant load over time (for the trace and for checking
that no link ever runs over capacity).

Rates are max-min fair (Bertsekas & Gallager, Data Networks, Sec. 6.5.2) by progressive filling: raise all
unfrozen flows' rates together until a link saturates or a flow reaches its cap (its uncontended rate), freeze
those flows, repeat. Only the connected component (flows linked through shared links that can bind: their
flows' caps add up to more than the link carries) of the flow that came or went can change, so only that
component is recomputed, and only flows whose rate changed get new finish times. Link loads are kept up to
date incrementally from the rate changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_EPS = 1e-12


@dataclass(slots=True)
class _Flow:
    loads: tuple[tuple[int, int], ...]
    remaining: float
    rate_cap: float
    rate: float = 0.0
    since: float = 0.0


@dataclass(slots=True)
class LinkUsage:
    bytes: float = 0.0
    busy_s: float = 0.0
    saturated_s: float = 0.0
    peak_load: float = 0.0
    load: float = 0.0
    since: float = 0.0
    pending: float = 0.0  # the load from the flows' current rates (kept up to date as rates change)


@dataclass
class FlowNetwork:
    capacities: list[float]
    record_segments: bool = False
    flows: dict[int, _Flow] = field(default_factory=dict)
    users: dict[int, dict[int, int]] = field(default_factory=dict)  # link -> {flow key: hops on it}
    links: dict[int, LinkUsage] = field(default_factory=dict)
    segments: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # link -> [(time, load)]
    # Sum over a link's flows of cap x hops. A link whose flows could all run at their caps without filling it
    # ("slack") can never bind, so it neither couples flows into a component nor enters the max-min solve: the
    # rates are the same, and a fabric-wide spine no longer makes every transfer one component.
    demand: dict[int, float] = field(default_factory=dict)

    def _tight(self, link: int) -> bool:
        return self.demand.get(link, 0.0) > self.capacities[link] * (1 + _EPS)

    def add(self, key: int, loads: tuple[tuple[int, int], ...], nbytes: float, rate_cap: float,
            now: float) -> dict[int, float]:
        self.flows[key] = _Flow(loads, nbytes, rate_cap, 0.0, now)
        for link, count in loads:
            self.users.setdefault(link, {})[key] = count
            self.demand[link] = self.demand.get(link, 0.0) + rate_cap * count
        return self._rebalance(self._component([key]), now)

    def remove(self, key: int, now: float) -> dict[int, float]:
        flow = self.flows.pop(key)
        neighbours: list[int] = []
        for link, count in flow.loads:
            users = self.users[link]
            del users[key]
            if self._tight(link):  # only a link that could bind held the others back
                neighbours.extend(users)
            self.demand[link] = self.demand[link] - flow.rate_cap * count if users else 0.0
        self._set_rate(key, flow, 0.0)
        touched = {link for link, _ in flow.loads}
        if neighbours:
            return self._rebalance(self._component(neighbours), now, touched)
        self._account(touched, now)
        return {}

    def book_alone(self, loads: tuple[tuple[int, int], ...], nbytes: float, rate: float) -> None:
        """Usage of a flow that ran alone on its links at ``rate`` (the engine times such transfers itself)."""
        self.book(self.alone_bookings(loads, nbytes, rate))

    def alone_bookings(self, loads: tuple[tuple[int, int], ...], nbytes: float,
                       rate: float) -> list[tuple[LinkUsage, float, float, bool, float]]:
        """What ``book_alone`` adds to each link, worked out once for a transfer that repeats: (the link's usage,
        bytes, busy seconds, whether it saturates the link, load). Creates the links' usage records in the order
        ``book_alone`` would."""
        seconds = nbytes / rate
        out = []
        for link, count in loads:
            usage = self.links.get(link)
            if usage is None:
                usage = self.links[link] = LinkUsage()
            out.append((usage, nbytes * count, seconds, rate * count >= self.capacities[link] * (1 - 1e-9),
                        rate * count))
        return out

    @staticmethod
    def book(bookings: list[tuple[LinkUsage, float, float, bool, float]]) -> None:
        """Add ``alone_bookings`` to their links: the same sums, in the same order, as ``book_alone``."""
        for usage, nbytes, seconds, saturated, load in bookings:
            usage.bytes += nbytes
            usage.busy_s += seconds
            if saturated:
                usage.saturated_s += seconds
            usage.peak_load = max(usage.peak_load, load)

    def close(self, now: float) -> None:
        """End every link's last load segment at ``now`` (the end of the run)."""
        self._account(set(self.links), now)

    def _component(self, seeds: list[int]) -> list[int]:
        """The flows coupled to ``seeds`` through links that can bind."""
        seen, stack, order = set(seeds), list(seeds), []
        demand, capacities, users = self.demand, self.capacities, self.users
        while stack:
            key = stack.pop()
            order.append(key)
            for link, _ in self.flows[key].loads:
                if demand[link] > capacities[link] * (1 + _EPS):
                    for other in users[link]:
                        if other not in seen:
                            seen.add(other)
                            stack.append(other)
        return sorted(order)

    def _set_rate(self, key: int, flow: _Flow, rate: float) -> None:
        """Change a flow's rate and every link load it contributes to."""
        delta = rate - flow.rate
        flow.rate = rate
        usages, users = self.links, self.users
        for link, count in flow.loads:
            usage = usages.get(link)
            if usage is None:
                usage = usages[link] = LinkUsage(since=flow.since)
            usage.pending = usage.pending + delta * count if users.get(link) else 0.0

    def _rebalance(self, keys: list[int], now: float, touched: set[int] | None = None) -> dict[int, float]:
        """New max-min rates for a component; the finish times of the flows whose rate changed. ``touched``:
        links whose load already changed (a flow that left), accounted with the others."""
        demand, capacities = self.demand, self.capacities
        tight = {key: tuple((link, c) for link, c in self.flows[key].loads
                            if demand[link] > capacities[link] * (1 + _EPS)) for key in keys}
        rates = max_min_rates(tight,
                              {key: self.flows[key].rate_cap for key in keys}, self.capacities)
        touched = touched if touched is not None else set()
        finish: dict[int, float] = {}
        for key in keys:
            flow = self.flows[key]
            if rates[key] == flow.rate and flow.rate > 0:
                continue  # same rate: its timer stands
            flow.remaining = max(0.0, flow.remaining - flow.rate * (now - flow.since))  # bank the old rate
            flow.since = now
            self._set_rate(key, flow, rates[key])
            touched.update(link for link, _ in flow.loads)
            finish[key] = now + flow.remaining / flow.rate if flow.rate > 0 else float("inf")
        self._account(touched, now)
        return finish

    def _account(self, links: set[int], now: float) -> None:
        """Close each link's current load segment at ``now`` and start one at its new load."""
        capacities, usages, record = self.capacities, self.links, self.record_segments
        for link in links:
            usage = usages.get(link)
            if usage is None:
                usage = usages[link] = LinkUsage(since=now)
            load = usage.load
            if load > 0:
                elapsed = now - usage.since
                if elapsed > 0:
                    usage.bytes += load * elapsed
                    usage.busy_s += elapsed
                    if load >= capacities[link] * (1 - 1e-9):
                        usage.saturated_s += elapsed
            load = usage.pending if usage.pending > 0 else 0.0
            usage.load, usage.since = load, now
            if load > usage.peak_load:
                usage.peak_load = load
            if record:
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
        step = min(min((residual[link] / w for link, w in weight.items()), default=float("inf")),
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
