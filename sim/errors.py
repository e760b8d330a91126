"""Error hierarchy of the simulator.

Every error a user can cause derives from ``SimError`` and carries a one-line message that names the field
or the task at fault; the CLI prints that line and exits non-zero, without a traceback.
"""

from __future__ import annotations


class SimError(Exception):
    """Base of every error the CLI reports as one line."""

    exit_code: int = 1


class ConfigError(SimError):
    """A scenario (or an override, or a file it names) breaks a rule; the message names the field."""

    exit_code = 2


class ScheduleDeadlock(SimError):
    """The engine finished with tasks that never ran; the message names some of them and what they wait on."""

    exit_code = 3


class OutOfMemory(SimError):
    """A rank's peak memory exceeds its GPU's capacity and the user asked to fail on it."""

    exit_code = 4


class ResourceLimit(SimError):
    """A run would exceed its budget of tasks or memory (``--max-tasks`` / ``--max-memory``), estimated before
    anything is built (``sim.workload.size``); the message names the field that makes it big."""

    exit_code = 5
