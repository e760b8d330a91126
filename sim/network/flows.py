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

from dataclasses import dataclass, field, replace

import numpy as np

_EPS = 1e-12


class MirrorBroken(Exception):
    """``FlowNetwork.unmirror`` was asked while a mirrored flow ran: its copies' state was never made, so the
    engine replays without the mirror."""


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

    def restart(self, now: float, capacity: float, load: float) -> None:
        """Close the current load segment at ``now`` (its bytes, busy and saturated seconds on a link of
        ``capacity``) and start one at ``load``."""
        if self.load > 0:
            elapsed = now - self.since
            if elapsed > 0:
                self.bytes += self.load * elapsed
                self.busy_s += elapsed
                if self.load >= capacity * (1 - 1e-9):
                    self.saturated_s += elapsed
        self.load, self.since = load, now
        if load > self.peak_load:
            self.peak_load = load


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
    # flow key -> {link: hops} of its links that can bind now, kept up to date as links turn tight or slack, so that
    # the component search and the solve never scan a flow's other links (a 128-rank ring crosses ~40,000)
    binding: dict[int, dict[int, int]] = field(default_factory=dict)
    lone: list[list[tuple[int, float, float, bool, float]]] = field(default_factory=list)  # register_lone's rows
    lone_booked: list[int] = field(default_factory=list)  # book_lone's pending bookings, in order
    lone_waiting: dict[int, list[int]] = field(default_factory=dict)  # link no flow crossed yet -> its bookings
    lone_eager: set[int] = field(default_factory=set)  # bookings with a link some flow crossed: booked at once
    # Lockstep copies solved as one (sim.network.mirror): representative link -> its images, whose usage is the
    # representative's, copied at ``close`` (or at ``unmirror``); empty when every flow runs as itself.
    images: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def _tight(self, link: int) -> bool:
        return self.demand.get(link, 0.0) > self.capacities[link] * (1 + _EPS)

    def add(self, key: int, loads: tuple[tuple[int, int], ...], nbytes: float, rate_cap: float,
            now: float) -> dict[int, float]:
        """Start a flow (``loads``: its distinct links, with how many of its hops cross each); the finish times of
        the flows whose rate changed, its own included."""
        flow = self.flows[key] = _Flow(loads, nbytes, rate_cap, 0.0, now)
        users, demand, capacities, waiting = self.users, self.demand, self.capacities, self.lone_waiting
        binding = self.binding
        mine = binding[key] = {}
        binds = False
        crossed = []
        for link, count in loads:
            if waiting and link in waiting:
                crossed.append(link)
            on = users.get(link)
            if on is None:
                on = users[link] = {}
            on[key] = count
            before = demand.get(link, 0.0)
            total = demand[link] = before + rate_cap * count
            limit = capacities[link] * (1 + _EPS)
            if total > limit:
                binds = True
                mine[link] = count
                if not before > limit:  # the link turns tight: its other flows are bound by it too
                    for other, hops in on.items():
                        binding[other][link] = hops
        if crossed:
            self._first_flow(crossed)
        if binds:
            return self._rebalance(self._component([key]), now)
        # No link of the flow can bind: it is a component of its own, and progressive filling gives it its cap in
        # one step from 0 (max_min_rates). The same floats as ``_rebalance([key], now)``, without its dicts.
        rate = 0.0 + max(min(float("inf"), rate_cap - 0.0), 0.0)
        flow.remaining = max(0.0, flow.remaining - 0.0 * (now - flow.since))
        flow.since = now
        flow.rate = rate
        self._shift(loads, rate, now)
        return {key: now + flow.remaining / rate if rate > 0 else float("inf")}

    def remove(self, key: int, now: float) -> dict[int, float]:
        """End a flow; the finish times of the flows whose rate changed."""
        flow = self.flows.pop(key)
        neighbours: list[int] = []
        users, demand, capacities = self.users, self.demand, self.capacities
        cap = flow.rate_cap
        binding = self.binding
        del binding[key]
        for link, count in flow.loads:
            on = users[link]
            del on[key]
            limit = capacities[link] * (1 + _EPS)
            if demand[link] > limit:  # only a link that could bind held the others back
                neighbours.extend(on)
                left = demand[link] = demand[link] - cap * count if on else 0.0
                if not left > limit:  # the link turns slack
                    for other in on:
                        del binding[other][link]
            else:
                demand[link] = demand[link] - cap * count if on else 0.0
        if neighbours:
            self._set_rate(key, flow, 0.0)
            return self._rebalance(self._component(neighbours), now, {link for link, _ in flow.loads})
        delta, flow.rate = 0.0 - flow.rate, 0.0
        self._shift(flow.loads, delta, now)
        return {}

    def _shift(self, loads: tuple[tuple[int, int], ...], delta: float, now: float) -> None:
        """One flow's rate changed by ``delta`` and no other's did: ``_set_rate``'s load update and ``_account``
        per link of ``loads`` in one pass (each link's arithmetic as theirs: the links are independent)."""
        usages, users, capacities, record = self.links, self.users, self.capacities, self.record_segments
        for link, count in loads:
            usage = usages.get(link)
            if usage is None:
                usage = usages[link] = LinkUsage(since=now)
            pending = usage.pending = usage.pending + delta * count if users.get(link) else 0.0
            load = pending if pending > 0 else 0.0
            usage.restart(now, capacities[link], load)
            if record:
                self.segments.setdefault(link, []).append((now, load))

    def book_alone(self, loads: tuple[tuple[int, int], ...], nbytes: float, rate: float) -> None:
        """Usage of a flow that ran alone on its links at ``rate`` (the engine times such transfers itself)."""
        self.book(self.alone_bookings(loads, nbytes, rate))

    def alone_bookings(self, loads: tuple[tuple[int, int], ...], nbytes: float,
                       rate: float) -> list[tuple[LinkUsage, float, float, bool, float]]:
        """What ``book_alone`` adds to each link, worked out once for a transfer that repeats: (the link's usage,
        bytes, busy seconds, whether it saturates the link, load). Creates the links' usage records in the order
        ``book_alone`` would."""
        return [(self.links[link], nb, s, sat, load) for link, nb, s, sat, load in self.alone_rows(loads, nbytes, rate)]

    def alone_rows(self, loads: tuple[tuple[int, int], ...], nbytes: float,
                   rate: float) -> list[tuple[int, float, float, bool, float]]:
        """``alone_bookings`` by link index: (link, bytes, busy seconds, saturates, load) per (link, hops) of
        ``loads``, in their order; creates the links' usage records as ``book_alone`` would."""
        seconds = nbytes / rate
        out = []
        for link, count in loads:
            if link not in self.links:
                self.links[link] = LinkUsage()
            out.append((link, nbytes * count, seconds, rate * count >= self.capacities[link] * (1 - 1e-9),
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

    def register_lone(self, rows: list[tuple[int, float, float, bool, float]]) -> int:
        """Register a transfer's ``alone_rows`` (its channels' rows concatenated) for ``book_lone``; its number."""
        booking = len(self.lone)
        self.lone.append(rows)
        if any(link in self.users for link, *_ in rows):
            self.lone_eager.add(booking)
        else:
            for link, *_ in rows:
                waiting = self.lone_waiting.setdefault(link, [])
                if not waiting or waiting[-1] != booking:
                    waiting.append(booking)
        return booking

    def book_lone(self, booking: int) -> None:
        """Book a registered transfer once more (``book`` of its rows). A TP collective repeats every layer and
        micro-batch, and booking its rows one by one was a quarter of a 16,384-GPU replay (docs/scale.md): while
        no flow has crossed its links, only its number is kept, and the sums are made when a flow first comes
        onto one of them or at ``close``, in the order booked: the same floats as ``book`` each time."""
        if booking in self.lone_eager:
            self.book([(self.links[link], nb, s, sat, load) for link, nb, s, sat, load in self.lone[booking]])
        else:
            self.lone_booked.append(booking)

    def _first_flow(self, crossed: list[int]) -> None:
        """Before a flow's load is accounted on links with pending ``book_lone`` bookings (``crossed``): settle
        them all, and book the transfers crossing those links at once from now on (their sums stay in time
        order)."""
        self._settle_lone()
        for link in crossed:
            self.lone_eager.update(self.lone_waiting.pop(link))

    def _settle_lone(self) -> None:
        """Add the ``book_lone`` bookings to their links: per link, the same additions in the same order as
        ``book`` would have made one booking at a time (numpy's ``add.accumulate`` is sequential; a link a
        booking does not cross adds 0.0, which leaves a sum unchanged), so the floats are identical. Bookings that
        share a link form one class; a class's bookings expand to rows (one per repeated link within a booking,
        kept in their order) and are accumulated together."""
        if not self.lone_booked:
            return
        seq = np.asarray(self.lone_booked, dtype=np.int64)
        self.lone_booked = []
        parent = list(range(len(self.lone)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        first: dict[int, int] = {}
        for booking, rows in enumerate(self.lone):
            for link, *_ in rows:
                other = first.setdefault(link, booking)
                parent[find(booking)] = find(other)
        classes = np.array([find(i) for i in range(len(self.lone))], dtype=np.int64)
        of_seq = classes[seq]
        order = np.argsort(of_seq, kind="stable")  # per class, the bookings in the order they were made
        bounds = np.flatnonzero(np.diff(of_seq[order])) + 1
        for part in np.split(order, bounds):
            self._settle_class(seq[part])

    def _settle_class(self, seq: np.ndarray) -> None:
        """``_settle_lone`` for bookings that share links (``seq``: their numbers in booking order)."""
        ids = np.unique(seq)
        column: dict[int, int] = {}
        for booking in ids.tolist():
            for link, *_ in self.lone[booking]:
                column.setdefault(link, len(column))
        width = len(column)
        start = np.zeros(len(self.lone), dtype=np.int64)
        height = np.zeros(len(self.lone), dtype=np.int64)
        table: list[list[float]] = []  # rows of (bytes | busy | saturated seconds | load) x width
        for booking in ids.tolist():
            start[booking], used = len(table), 0
            rows: list[list[float]] = []
            repeat: dict[int, int] = {}
            for link, nbytes, seconds, saturated, load in self.lone[booking]:
                k = repeat[link] = repeat.get(link, -1) + 1  # the k-th time this booking crosses the link
                while len(rows) <= k:
                    rows.append([0.0] * (4 * width))
                j = column[link]
                row = rows[k]
                row[j], row[width + j], row[3 * width + j] = nbytes, seconds, load
                row[2 * width + j] = seconds if saturated else 0.0
                used = max(used, k + 1)
            height[booking] = used
            table += rows
        values = np.array(table, dtype=np.float64)
        counts = height[seq]
        offsets = np.repeat(start[seq] - (np.cumsum(counts) - counts), counts)
        picked = values[offsets + np.arange(int(counts.sum()))]
        links = list(column)
        usages = [self.links[link] for link in links]
        for field_, part in (("bytes", 0), ("busy_s", 1), ("saturated_s", 2)):
            block = np.vstack([[getattr(u, field_) for u in usages], picked[:, part * width:(part + 1) * width]])
            for usage, total in zip(usages, np.add.accumulate(block, axis=0)[-1].tolist(), strict=True):
                setattr(usage, field_, total)
        peaks = picked[:, 3 * width:].max(axis=0).tolist()
        for usage, peak in zip(usages, peaks, strict=True):
            usage.peak_load = max(usage.peak_load, peak)

    def close(self, now: float) -> None:
        """Settle the ``book_lone`` bookings, end every link's last load segment at ``now`` (the run's end) and give
        mirrored links their representatives' usage."""
        self._settle_lone()
        self._account(set(self.links), now)
        self._copy_images()

    def unmirror(self) -> None:
        """Stop mirroring (a flow outside the mirror is about to cross its links): each image gets its
        representative's state, which is the one it would have had, and every copy runs as its own flows from now
        on. Raises ``MirrorBroken`` while a flow crosses a representative (its copies' flows were never made)."""
        images = self.images
        if any(link in images for flow in self.flows.values() for link, _ in flow.loads):
            raise MirrorBroken("a mirrored flow is running")
        self._copy_images()

    def _copy_images(self) -> None:
        """Each image link gets a copy of its representative's usage, segments, demand and (flow-less) users."""
        usages, segments, demand, users = self.links, self.segments, self.demand, self.users
        for link, images in self.images.items():
            usage = usages.get(link)
            points = segments.get(link)
            for image in images:
                if usage is not None:
                    usages[image] = replace(usage)
                if points is not None:
                    segments[image] = list(points)
                if link in demand:
                    demand[image] = demand[link]
                if link in users:
                    users[image] = {}
        self.images = {}

    def _component(self, seeds: list[int]) -> list[int]:
        """The flows coupled to ``seeds`` through links that can bind."""
        seen, stack, order = set(seeds), list(seeds), []
        binding, users = self.binding, self.users
        while stack:
            key = stack.pop()
            order.append(key)
            for link in binding[key]:
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
        binding = self.binding
        tight = {key: tuple(binding[key].items()) for key in keys}
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
            load = usage.pending if usage.pending > 0 else 0.0
            usage.restart(now, capacities[link], load)
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
