"""Lockstep copies of a transfer solved as one: when the copies' flows are images of one another under a link map.

In: for each transfer a folded rank runs on its TP peers' behalf (``sim.parallel.grid.lockstep_groups``: the
same DP or PP transfer shifted by 1 .. k-1 ranks), the k copies' phases; the links' capacities. Out: a
``Mirror``: per link the first copy crosses (a representative), the links copies 1 .. k-1 cross in its place
(its images), or the reason the copies are not provably alike.

Why one copy stands for all k, bit for bit: the flow solver (``sim.network.flows``) couples flows only through
shared links, and its floats on a link depend only on the flows crossing it and the link's capacity. If

1. every copy t of every mirrored transfer has the same phases as copy 0 (latencies, channel count, per channel
   bytes, rate cap and hop counts, all equal as floats), its links being copy 0's mapped by one function phi_t
   (the same phi_t for every transfer),
2. phi_1 .. phi_{k-1} are injective, and the representatives and the images of different copies are pairwise
   disjoint (no link is crossed by two copies, nor by two roles),
3. a link and its images have the same capacity (float equality),
4. no other flow crosses a representative or an image (checked while the run goes: ``FlowNetwork.unmirror``),

then the flows on phi_t's links are exactly the images of copy 0's, added and removed at the same instants and in
the same relative order, so every component, rate, finish time and link sum of copy t equals copy 0's. The
engine runs copy 0 alone and ``FlowNetwork`` copies each representative's usage onto its images. On a
rail-optimized fabric (``sim.network.topology``) a DP or PP transfer between the same local rank of two nodes
stays on that rank's rail: its GPU's PCIe link to its NIC, the NIC, the rail's leaf and the leaf's uplink, and
the k TP peers use k disjoint rails of equal capacities. A failed or degraded link on one rail
(``variation.links``), a PXN hop over NVLink or a route through a shared switch port breaks 1-3, and the transfer
runs its k copies as flows, as without a mirror.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.network.models import TransferPhase


@dataclass
class Mirror:
    """Representative link -> its images in copies 1 .. k-1 (``copies`` = k), built transfer by transfer with
    ``add``; ``reason`` says why the last refused transfer is not a mirror of its first copy."""

    copies: int
    capacities: Sequence[float]
    images: dict[int, tuple[int, ...]] = field(default_factory=dict)
    role: dict[int, int] = field(default_factory=dict)  # any mirrored link -> its representative
    reason: str = ""

    def links(self) -> set[int]:
        """Every link a mirrored transfer crosses (representatives and images)."""
        return set(self.role)

    def add(self, peers: Sequence[tuple[TransferPhase, ...]]) -> bool:
        """Whether the copies ``peers`` (k of them, copy 0 first) are images of copy 0 under the map built so far
        (extended by their new links); a refused transfer leaves the map as it was."""
        if len(peers) != self.copies:
            self.reason = f"{len(peers)} copies, not {self.copies}"
            return False
        first = peers[0]
        new: dict[int, tuple[int, ...]] = {}
        taken: set[int] = set()  # the links ``new`` maps, representatives and images
        for copy in peers[1:]:
            if len(copy) != len(first):
                self.reason = "copies with different phase counts"
                return False
        for position, phase in enumerate(first):
            same = [p[position] for p in peers]
            if any(p.latency != phase.latency or len(p.channels) != len(phase.channels) for p in same):
                self.reason = "copies with different latencies or channel counts"
                return False
            for index, channel in enumerate(phase.channels):
                copies = [p.channels[index] for p in same]
                if any(c.nbytes != channel.nbytes or c.rate_cap != channel.rate_cap
                       or len(c.loads) != len(channel.loads) for c in copies):
                    self.reason = "copies with different bytes, rate caps or routes"
                    return False
                for hop, (link, count) in enumerate(channel.loads):
                    row = tuple(c.loads[hop][0] for c in copies[1:])
                    if any(c.loads[hop][1] != count for c in copies[1:]):
                        self.reason = f"link {link}: copies cross it a different number of times"
                        return False
                    if not self._fits(link, row, new, taken):
                        return False
        for link, images in new.items():
            self.images[link] = images
            for each in (link, *images):
                self.role[each] = link
        return True

    def _fits(self, link: int, row: tuple[int, ...], new: dict[int, tuple[int, ...]], taken: set[int]) -> bool:
        """Whether mapping ``link`` to ``row`` (its copies' links) agrees with the map and with ``new`` (this
        transfer's additions, recorded there and in ``taken`` when it does)."""
        known = self.images.get(link, new.get(link))
        if known is not None:
            if known != row:
                self.reason = f"link {link}: its copies cross different links in different transfers"
                return False
            return True
        if len({link, *row}) != self.copies or any(other in self.role or other in taken for other in (link, *row)):
            self.reason = f"link {link}: shared by two copies or two roles"
            return False
        capacity = self.capacities[link]
        if any(self.capacities[other] != capacity for other in row):
            self.reason = f"link {link}: its copies' links have other capacities"
            return False
        new[link] = row
        taken.update((link, *row))
        return True
