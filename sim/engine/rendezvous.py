"""The collective rendezvous both replays share: a collective starts when the last of its simulated members
arrives, and all of them end together.

In: the members each shared collective has (``TaskGraph.shared_collectives``) and, one by one, each member's
arrival (rendezvous key, task, time its rank reached it). Out: nothing until the last member arrives; then the
release time (the latest arrival) and the member tasks, which start at it. The arrival times are kept per task
(``arrival``) for the critical path's collective waits. Used by the event engine (``sim.engine.event``) and the
longest-path evaluation (``sim.engine.longest_path``), so their rendezvous rule is one.
"""

from __future__ import annotations


class Rendezvous:
    def __init__(self, members: dict[int, int]) -> None:
        self.members = members  # rendezvous key -> simulated members
        self.arrival: dict[int, float] = {}  # member task -> when its rank reached the collective
        self._waiting: dict[int, list[int]] = {}

    def arrive(self, key: int, task_id: int, when: float) -> tuple[float, list[int]] | None:
        """Records that ``task_id`` reached collective ``key`` at ``when``. Returns (release time, member tasks)
        once the last member has arrived, else None."""
        self.arrival[task_id] = when
        here = self._waiting.setdefault(key, [])
        here.append(task_id)
        if len(here) < self.members[key]:
            return None
        del self._waiting[key]
        return max(self.arrival[member] for member in here), here
